"""recipes/verl_worker: verl-style custom workers (the online DPO guide's roles, colocated
through ``create_colocated_worker_cls``) run on HybridFlow with only their imports changed."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from recipes.verl_worker import main as recipe
from recipes.verl_worker.main import RunConfig, run

RECIPE = Path(recipe.__file__).parent


def test_the_recipe_imports_only_verl_names_through_the_compat_modules() -> None:
    for path in (RECIPE / "workers.py", RECIPE / "main.py"):
        source = path.read_text()
        ours = re.findall(r"^from (hf_\w+(?:\.\w+)*) import", source, flags=re.M)
        assert ours and set(ours) <= {"hf_controller.compat.verl", "hf_protocol.compat.verl"}, path


def test_online_dpo_with_verl_workers_trains_on_two_colocated_ranks(
    ray_session: Any, tmp_path: Path
) -> None:
    result = run(RunConfig(workdir=tmp_path, steps=3, workers=2, prompts_per_step=4))
    history = result.history
    assert [h["step"] for h in history] == [0, 1, 2]
    assert all(h["workers"] == 2 for h in history)  # both ranks answered every update
    # step 0: the policy is the reference (same weights, colocated roles): margin 0, log 2
    assert math.isclose(history[0]["actor/dpo_loss"], math.log(2), abs_tol=1e-5)
    for h in history:  # the update lowers the loss of its own pairs
        assert h["actor/dpo_loss_after"] < h["actor/dpo_loss"], h
    # data parallel: both ranks started equal, moved, and are still equal
    before, after = result.checksums_before, result.checksums_after
    assert len(before) == len(after) == 2
    assert before[0] == before[1] and after[0] == after[1] and after[0] != before[0]
