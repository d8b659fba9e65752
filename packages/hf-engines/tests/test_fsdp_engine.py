"""The FSDP2 engine on real torch.distributed: 1 and 2 gloo ranks as subprocesses.

Three launches (scenarios in fsdp_scenarios.py) feed every test below; each launch has a
timeout, and a failing rank's output is shown.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

from hf_engines import ModelConfig
from hf_engines.models import build_hf_model
from hf_engines.testing import launch_ranks, make_toy_batch, transformers_log_probs

SCENARIOS = Path(__file__).with_name("fsdp_scenarios.py")
QUIET = {"TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
LAUNCH_TIMEOUT = 150.0


def _run(world_size: int, args: list[str], out: Path) -> list[dict[str, Any]]:
    out.mkdir(parents=True, exist_ok=True)
    launch_ranks(
        SCENARIOS, world_size, [args[0], args[1], str(out), *args[2:]], LAUNCH_TIMEOUT, QUIET
    )
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(world_size)]


@pytest.fixture(scope="module")
def runs(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Train on Qwen2 at 2 ranks, then at 1 rank (also resuming the 2-rank checkpoint)."""
    root = tmp_path_factory.mktemp("fsdp-runs")
    model = str(tiny_models["qwen2"])
    two = _run(2, ["train", model], root / "two")
    one = _run(1, ["train", model, str(root / "two" / "ckpt")], root / "one")
    critic = _run(2, ["critic", str(tiny_models["llama"])], root / "critic")
    return {"two": two, "one": one, "critic": critic, "root": root}


def _probe() -> dict[str, torch.Tensor]:
    return dict(make_toy_batch(5, seed=7).batch.items())


def _direct_log_probs(model: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """Response log-probs and entropy computed with plain transformers, one process."""
    return transformers_log_probs(model, make_toy_batch(5, seed=7))


def _masked(values: torch.Tensor) -> torch.Tensor:
    return values * _probe()["response_mask"]


def _gathered(ranks: list[dict[str, Any]], key: str) -> torch.Tensor:
    return torch.cat([rank[key] for rank in ranks])


@pytest.mark.parametrize("world", ["one", "two"])
def test_log_probs_match_plain_transformers(
    runs: dict[str, Any], tiny_models: dict[str, Path], world: str
) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_models["qwen2"], dtype=torch.float32)
    expected_lp, expected_entropy = _direct_log_probs(model)
    got_lp = _gathered(runs[world], "log_probs_before")
    got_entropy = _gathered(runs[world], "entropy_before")
    assert got_lp.shape == expected_lp.shape == (5, 5)
    torch.testing.assert_close(_masked(got_lp), _masked(expected_lp), atol=1e-5, rtol=0)
    torch.testing.assert_close(_masked(got_entropy), _masked(expected_entropy), atol=1e-5, rtol=0)


def test_training_reduces_the_loss(runs: dict[str, Any]) -> None:
    losses = runs["two"][0]["losses"]
    assert losses[-1] < losses[0] - 0.2, losses


def test_two_ranks_match_one_rank(runs: dict[str, Any]) -> None:
    torch.testing.assert_close(
        torch.tensor(runs["two"][0]["losses"]),
        torch.tensor(runs["one"][0]["losses"]),
        atol=1e-4,
        rtol=0,
    )
    torch.testing.assert_close(
        _masked(_gathered(runs["two"], "log_probs_after")),
        _masked(_gathered(runs["one"], "log_probs_after")),
        atol=1e-4,
        rtol=0,
    )


@pytest.mark.parametrize("world", ["one", "two"])
def test_resume_replays_the_next_steps_exactly(runs: dict[str, Any], world: str) -> None:
    for rank in runs[world]:
        assert rank["resumed_step"] == 2
        assert rank["resumed_losses"] == rank["losses"][2:]


def test_checkpoint_resumes_on_a_different_number_of_ranks(runs: dict[str, Any]) -> None:
    torch.testing.assert_close(
        torch.tensor(runs["one"][0]["cross_resumed_losses"]),
        torch.tensor(runs["two"][0]["losses"][2:]),
        atol=1e-4,
        rtol=0,
    )


@pytest.mark.parametrize("world", ["one", "two"])
def test_export_loads_with_from_pretrained(runs: dict[str, Any], world: str) -> None:
    model = AutoModelForCausalLM.from_pretrained(
        runs["root"] / world / "hf", dtype=torch.float32, local_files_only=True
    )
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, runs[world][0]["params"][name]), name
    log_probs, _ = _direct_log_probs(model)
    torch.testing.assert_close(
        _masked(log_probs), _masked(_gathered(runs[world], "log_probs_after")), atol=1e-5, rtol=0
    )


def test_iter_full_params_uses_hf_state_dict_names(
    runs: dict[str, Any], tiny_models: dict[str, Path]
) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_models["qwen2"], dtype=torch.float32)
    expected = list(model.state_dict())
    assert "lm_head.weight" in expected  # tied, yet listed under both names as in HF
    for rank in runs["two"]:
        assert rank["param_names"] == expected
    shapes = {name: tuple(t.shape) for name, t in runs["two"][0]["params"].items()}
    assert shapes == {name: tuple(t.shape) for name, t in model.state_dict().items()}


def test_critic_values_match_plain_transformers(
    runs: dict[str, Any], tiny_models: dict[str, Path]
) -> None:
    reference = build_hf_model(ModelConfig(path=str(tiny_models["llama"]), head="value", seed=3))
    batch = _probe()
    with torch.no_grad():
        logits = reference(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            position_ids=batch["position_ids"],
        ).logits
    expected = logits[:, -6:-1, 0]
    got = _gathered(runs["critic"], "values")
    torch.testing.assert_close(_masked(got), _masked(expected), atol=1e-5, rtol=0)
    losses = runs["critic"][0]["losses"]
    assert losses[-1] < losses[0], losses


def test_critic_export_loads_as_token_classification(runs: dict[str, Any]) -> None:
    model = AutoModelForTokenClassification.from_pretrained(
        runs["root"] / "critic" / "hf", local_files_only=True
    )
    assert type(model).__name__ == "LlamaForTokenClassification"
    assert model.config.num_labels == 1


def test_export_engine_checkpoint_rebuilds_the_model_offline(
    runs: dict[str, Any], tmp_path: Path
) -> None:
    from hf_engines.export import export_engine_checkpoint

    # a 2-rank DCP checkpoint, exported by one process from its own files only
    out = export_engine_checkpoint(runs["root"] / "two" / "final", tmp_path / "hf", "bfloat16")
    model = AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    assert model.dtype == torch.bfloat16
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, runs["two"][0]["params"][name].to(torch.bfloat16)), name


@pytest.mark.parametrize("world_size", [1, 2])
def test_host_overhead_variants_train_like_the_default(
    world_size: int, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    """``optim.fused``, ``fsdp.blocks_per_unit`` (0: one unit) and ``fsdp.gradient_sync``
    change how the step runs, not what it computes: the same losses over 4 steps of 2
    micro-batches per rank. ``auto`` reduces gradients after the last micro-batch only at
    ``dp_shard`` 1."""
    ranks = _run(world_size, ["variants", str(tiny_models["qwen2"])], tmp_path)
    losses = ranks[0]["losses"]
    assert losses["default"][-1] < losses["default"][0]
    for name, variant in losses.items():
        assert variant == pytest.approx(losses["default"], rel=1e-4), name
    synced_at_last = ranks[0]["synced_at_last"]
    assert synced_at_last["default"] is (world_size == 1)
    assert synced_at_last["sync_every_micro_batch"] is False
    assert synced_at_last["sync_at_last_kept_gathered"] is True
