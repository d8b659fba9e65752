"""Each packaged config does what its description says, run as a user runs it.

``hybridflow grpo --config-name quickstart`` (and its two async siblings) must learn from a
fresh directory as shipped: the command makes the random model, the task data and the
supervised warm-up (``quickstart_sft``) on first use, then GRPO raises held-out greedy
accuracy. The shipped runs are 300 steps; these run 40 (the lr warm-up's length, about a
minute each on two CPU cores) and check the trend: +0.1 to +0.17 here, asserted >= 0.05
(two standard errors on 256 held-out words at ~0.2). The full 300-step outcome (>= 0.9) is
the recipe's test (test_quickstart.py), on the same settings.

``smollm2_chain_sum`` runs in test_smollm2_grpo.py (two steps: a step of the 135M model takes
a minute here); its learning curve is measured in docs/benchmarks.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hf_algos.tracking import metrics_path

SCRIPT = Path(sys.executable).parent / "hybridflow"
STEPS = 40
MIN_RISE = 0.05
"""Held-out greedy accuracy gained in STEPS steps, at least (measured: 0.10-0.17)."""


def hybridflow(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The installed console script, in ``cwd``, on loopback Ray."""
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    return subprocess.run(
        [str(SCRIPT), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )


def records(workdir: Path, experiment: str) -> list[dict[str, float]]:
    """The metrics records of ``experiment``'s latest run under ``workdir``."""
    path = metrics_path(workdir / "logs", "hybridflow", experiment)
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def user_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh directory, shared by the configs: the first run makes the example's files."""
    return tmp_path_factory.mktemp("user")


@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "name", ["quickstart", "quickstart_one_step_off", "quickstart_fully_async"]
)
def test_packaged_grpo_config_learns_from_a_fresh_directory(user_dir: Path, name: str) -> None:
    run = hybridflow(
        "grpo",
        "--config-name",
        name,
        "vars.workdir=qs",
        f"trainer.total_training_steps={STEPS}",
        f"trainer.test_freq={STEPS // 2}",
        "trainer.progress_bar=false",
        cwd=user_dir,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    workdir = user_dir / "qs"
    assert (workdir / "model" / "config.json").is_file(), "trainer.export_dir was not written"

    accuracy = [r["val/accuracy"] for r in records(workdir, name) if "val/accuracy" in r]
    assert len(accuracy) == 3, accuracy
    assert 0.05 < accuracy[0] < 0.5, f"the warm-up should give ~0.2 held-out: {accuracy}"
    assert accuracy[-1] >= accuracy[0] + MIN_RISE, f"{name} did not learn: {accuracy}"


def test_packaged_sft_warm_up_learnt_the_answer_format(user_dir: Path) -> None:
    """``quickstart_sft`` (run by the first GRPO config above) teaches the answer format:
    its loss falls, and the warmed-up model's held-out answers score well above a random
    model's -0.5 (wrong length) before GRPO's first step."""
    workdir = user_dir / "qs"
    if not (workdir / "model_sft").is_dir():
        pytest.skip("runs after test_packaged_grpo_config_learns_from_a_fresh_directory")
    losses = [
        r["actor/sft_nll"] for r in records(workdir, "quickstart_sft") if "actor/sft_nll" in r
    ]
    assert len(losses) == 80 and losses[-1] < 0.5 * losses[0], losses[::10]
    first = next(r for r in records(workdir, "quickstart") if "val/score/mean" in r)
    assert first["val/score/mean"] > 0.3, first
