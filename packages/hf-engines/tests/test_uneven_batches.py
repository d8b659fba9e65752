"""Uneven batches: N workers and any micro-batch split give the step of one worker.

7 rows with different response lengths, global mini-batches of 3 + 2 + 2 rows, split 7 /
4+3 / 3+2+2 over 1 / 2 / 3 gloo ranks (so a mini-batch is split between ranks, and a rank's
part of a mini-batch can be empty: it runs a filler). For token-mean, seq-mean-token-mean
and seq-mean-token-sum-norm, with micro-batches of 1, 2 and 7 rows and a token budget, the
step losses, grad norms and updated weights equal those of one rank taking each mini-batch
as one micro-batch, to fp32 rounding (losses and grad norms ``atol=1e-6``, weights after
AdamW at ``lr=1e-4`` ``atol=5e-6``).
The loss is a toy NLL that follows the engine's global-normaliser contract; ``hf-algos``
runs the same check with its real losses.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from hf_engines.testing import launch_ranks

SCENARIOS = Path(__file__).with_name("uneven_scenarios.py")
QUIET = {"TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
# AdamW divides each gradient entry by its own running RMS, so entries near zero turn fp32
# rounding of the reduction order into up to ~1e-6 of weight change at lr=1e-4.
WEIGHTS = {"atol": 5e-6, "rtol": 0.0}
REFERENCE = "rows7"  # one rank, each mini-batch in one micro-batch
# The cases uneven_scenarios.py runs (MODES x MICRO_BATCHES there).
MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
MICRO_BATCHES = ("rows1", "rows2", "rows7", "tokens12")


def _run(
    backend: str, world: int, model: Path, out: Path, micros: tuple[str, ...] = MICRO_BATCHES
) -> dict[Any, dict[str, Any]]:
    out.mkdir(parents=True, exist_ok=True)
    args = [backend, str(model), str(out), ",".join(micros)]
    launch_ranks(SCENARIOS, world, args, 300.0, QUIET)
    result: dict[Any, dict[str, Any]] = torch.load(out / "rank0.pt", weights_only=False)
    modes = MODES[:1] if backend == "pairs" else MODES
    assert set(result) == {(mode, micro) for mode in modes for micro in micros}
    return result


@pytest.fixture(scope="module")
def fsdp_runs(
    tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[int, dict[Any, dict[str, Any]]]:
    """Results of every case at 1, 2 and 3 FSDP ranks."""
    root = tmp_path_factory.mktemp("uneven")
    return {w: _run("fsdp", w, tiny_models["llama"], root / f"w{w}") for w in (1, 2, 3)}


def _assert_same_step(case: dict[str, Any], reference: dict[str, Any], steps: int = 3) -> None:
    close = {"atol": 1e-6, "rtol": 0.0}
    assert len(case["loss"]) == steps  # uneven mini-batches: one optimizer step each
    torch.testing.assert_close(torch.tensor(case["loss"]), torch.tensor(reference["loss"]), **close)
    torch.testing.assert_close(
        torch.tensor(case["grad_norm"]), torch.tensor(reference["grad_norm"]), **close
    )
    assert case["params"].keys() == reference["params"].keys()
    for name, tensor in case["params"].items():
        torch.testing.assert_close(tensor, reference["params"][name], **WEIGHTS, msg=name)


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("micro", MICRO_BATCHES)
@pytest.mark.parametrize("mode", MODES)
def test_fsdp_matches_one_rank_one_micro_batch(
    fsdp_runs: dict[int, dict[Any, dict[str, Any]]], world: int, micro: str, mode: str
) -> None:
    _assert_same_step(fsdp_runs[world][(mode, micro)], fsdp_runs[1][(mode, REFERENCE)])


def test_modes_differ_so_the_check_has_teeth(
    fsdp_runs: dict[int, dict[Any, dict[str, Any]]],
) -> None:
    losses = {mode: fsdp_runs[1][(mode, REFERENCE)]["loss"][0] for mode in MODES}
    assert len({round(value, 4) for value in losses.values()}) == len(MODES), losses


@pytest.fixture(scope="module")
def megatron_runs(
    tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[int, dict[Any, dict[str, Any]]]:
    """Megatron at 1 rank (the reference only) and 2 data-parallel ranks (two settings, to
    keep the launch short: megatron's per-engine set-up dominates)."""
    pytest.importorskip("megatron.core")
    root = tmp_path_factory.mktemp("uneven-megatron")
    model = tiny_models["llama"]
    return {
        1: _run("megatron", 1, model, root / "w1", (REFERENCE,)),
        2: _run("megatron", 2, model, root / "w2", ("rows1", "tokens12")),
    }


@pytest.mark.parametrize("micro", ["rows1", "tokens12"])
@pytest.mark.parametrize("mode", MODES)
def test_megatron_two_replicas_match_one(
    megatron_runs: dict[int, dict[Any, dict[str, Any]]], micro: str, mode: str
) -> None:
    _assert_same_step(megatron_runs[2][(mode, micro)], megatron_runs[1][(mode, REFERENCE)])


def test_pairs_stay_whole_and_three_ranks_match_one(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    # 10 rows = 5 pairs; the dispatch gives 3 ranks 4/3/3 rows, splitting the third pair.
    one = _run("pairs", 1, tiny_models["llama"], tmp_path / "w1", ("rows2",))
    three = _run("pairs", 3, tiny_models["llama"], tmp_path / "w3", ("rows2",))
    key = (MODES[0], "rows2")
    _assert_same_step(three[key], one[key], steps=2)  # mini-batches of 3 + 2 pairs
