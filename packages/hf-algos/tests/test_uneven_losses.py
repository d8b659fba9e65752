"""ppo_actor_loss on uneven batches: N workers and any micro-batch split give one worker's step.

A 7-row PPO batch (responses of different lengths, advantages of both signs, entropy and
KL terms) with global mini-batches of 4 + 3 rows, on 1, 2 and 3 gloo FSDP ranks (7 split
7 / 4+3 / 3+2+2). For token-mean, seq-mean-token-mean and seq-mean-token-sum-norm the step
losses, grad norms and updated weights equal one rank taking each mini-batch as one
micro-batch (``rows7``), to fp32 rounding (losses and grad norms ``atol=1e-6``; weights
after AdamW at ``lr=1e-4``, which divides near-zero gradient entries by their own RMS,
``atol=5e-6``). The micro-batch settings (rows of 1, 2, 7 and a 12-token budget) are spread
over the world sizes to keep the three launches short.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from hf_engines.testing import build_tiny_model, launch_ranks

SCENARIOS = Path(__file__).with_name("uneven_loss_scenarios.py")
QUIET = {"TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")  # as the scenario
REFERENCE = "rows7"
CASES = {1: ("rows7", "rows1", "tokens12"), 2: ("rows2", "tokens12"), 3: ("rows1", "rows7")}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[Any, dict[str, Any]]]:
    """Every case of :data:`CASES`, by world size."""
    root = tmp_path_factory.mktemp("uneven-losses")
    model = build_tiny_model(root / "llama", "llama")
    results = {}
    for world, micros in CASES.items():
        out = root / f"w{world}"
        out.mkdir()
        launch_ranks(SCENARIOS, world, [str(model), str(out), ",".join(micros)], 300.0, QUIET)
        results[world] = torch.load(out / "rank0.pt", weights_only=False)
    return results


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("world", "micro"), [(world, micro) for world, micros in CASES.items() for micro in micros]
)
@pytest.mark.parametrize("mode", MODES)
def test_ppo_actor_loss_step_matches_one_rank_one_micro_batch(
    runs: dict[int, dict[Any, dict[str, Any]]], world: int, micro: str, mode: str
) -> None:
    case, reference = runs[world][(mode, micro)], runs[1][(mode, REFERENCE)]
    close = {"atol": 1e-6, "rtol": 0.0}
    assert len(case["loss"]) == 2  # two uneven mini-batches: two optimizer steps
    torch.testing.assert_close(torch.tensor(case["loss"]), torch.tensor(reference["loss"]), **close)
    torch.testing.assert_close(
        torch.tensor(case["grad_norm"]), torch.tensor(reference["grad_norm"]), **close
    )
    for name, tensor in case["params"].items():
        torch.testing.assert_close(tensor, reference["params"][name], atol=5e-6, rtol=0, msg=name)
