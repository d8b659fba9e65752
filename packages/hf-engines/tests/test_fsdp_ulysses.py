"""Ulysses sequence parallelism in the FSDP engine: refusals and the in-process forward,
then 2 gloo ranks with sp=2 (and 4 ranks as 2 DP x 2 SP) against 1 rank.

The multi-rank launches run ulysses_scenarios.py; the module takes about two minutes on
two loaded cores, so it runs in the workspace's second lane.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from hf_engines import EngineConfig, FSDPConfig, ModelConfig
from hf_engines.config import ConfigurationError
from hf_engines.fsdp.forward import forward_micro_batch
from hf_engines.fsdp.sp_forward import forward_sequence_parallel
from hf_engines.fsdp.ulysses import ATTENTION_NAME, enable_ulysses, sequence_parallel_group
from hf_engines.models import build_hf_model
from hf_engines.testing import launch_ranks, make_toy_batch

pytestmark = pytest.mark.second_lane

SCENARIOS = Path(__file__).with_name("ulysses_scenarios.py")
QUIET = {"TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
FP32 = {"atol": 1e-5, "rtol": 1e-5}


def _config(model_dir: Path, sp: int = 2, **model: Any) -> EngineConfig:
    return EngineConfig(
        model=ModelConfig(path=str(model_dir), **model),
        fsdp=FSDPConfig(ulysses_sequence_parallel_size=sp),
    )


def test_size_must_be_positive() -> None:
    with pytest.raises(ConfigurationError, match="ulysses_sequence_parallel_size=0"):
        FSDPConfig(ulysses_sequence_parallel_size=0)


@pytest.mark.parametrize(
    ("sp", "model", "match"),
    [
        (4, {}, r"heads \(4\) and the key/value heads \(2\)"),
        (2, {"attn_implementation": "flash_attention_2"}, "not 'flash_attention_2'"),
        (2, {"remove_padding": "trim"}, "remove_padding='trim' must be auto or pack"),
    ],
)
def test_refuses_what_it_cannot_split(
    tiny_models: dict[str, Path], sp: int, model: dict[str, Any], match: str
) -> None:
    config = _config(tiny_models["llama"], sp)
    with pytest.raises(ConfigurationError, match=match):
        enable_ulysses(build_hf_model(config.model), _config(tiny_models["llama"], sp, **model))


def test_size_must_divide_the_ranks(one_rank: None) -> None:
    with pytest.raises(ConfigurationError, match="does not divide world_size=1"):
        sequence_parallel_group(2, "cpu")


def test_packed_sequence_path_matches_the_plain_forward(
    tiny_models: dict[str, Path], one_rank: None
) -> None:
    """A group of one rank: packing across the group, the block-diagonal mask, the
    all-to-alls and the gather leave outputs and gradients as the plain forward's."""
    config = _config(tiny_models["qwen3"])
    batch = make_toy_batch(4, prompt_length=7, response_length=6, seed=3)
    inputs = {key: batch.batch[key] for key in ("input_ids", "attention_mask", "position_ids")}
    responses = batch.batch["responses"]
    plain, ulysses = build_hf_model(config.model), build_hf_model(config.model)
    enable_ulysses(ulysses, config)
    assert ulysses.config._attn_implementation == ATTENTION_NAME
    want = forward_micro_batch(plain, inputs, responses, False, 0.8, "trim")
    got = forward_sequence_parallel(ulysses, inputs, responses, False, 0.8, dist.group.WORLD)
    for key in ("log_probs", "entropy"):
        torch.testing.assert_close(got[key], want[key], **FP32)
    (want["log_probs"].sum() + want["entropy"].sum()).backward()
    (got["log_probs"].sum() + got["entropy"].sum()).backward()
    for (name, a), b in zip(plain.named_parameters(), ulysses.parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, **FP32, msg=name)


def _run(world_size: int, args: list[str], out: Path) -> list[dict[str, Any]]:
    out.mkdir(parents=True, exist_ok=True)
    launch_ranks(SCENARIOS, world_size, [args[0], args[1], str(out), args[2]], 240.0, QUIET)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(world_size)]


@pytest.fixture(scope="module")
def runs(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The actor (Qwen3, GQA) at 1 rank and at 2 ranks with sp=2; the critic (Llama) at
    1 rank and at 4 ranks (2 DP x 2 SP)."""
    root = tmp_path_factory.mktemp("ulysses")
    actor, critic = str(tiny_models["qwen3"]), str(tiny_models["llama"])
    return {
        "actor_one": _run(1, ["actor", actor, "1"], root / "actor1")[0],
        "actor_sp": _run(2, ["actor", actor, "2"], root / "actor2"),
        "critic_one": _run(1, ["critic", critic, "1"], root / "critic1")[0],
        "critic_sp": _run(4, ["critic", critic, "2"], root / "critic4"),
    }


def test_sp2_log_probs_and_entropy_match_one_rank(runs: dict[str, Any]) -> None:
    one, ranks = runs["actor_one"], runs["actor_sp"]
    for key in ("log_probs", "entropy", "log_probs_after"):
        torch.testing.assert_close(torch.cat([r[key] for r in ranks]), one[key], **FP32)


def test_sp2_losses_and_gradients_match_one_rank(runs: dict[str, Any]) -> None:
    one, ranks = runs["actor_one"], runs["actor_sp"]
    for step, (want, got) in enumerate(zip(one["metrics"], ranks[0]["metrics"], strict=True)):
        for key in ("loss", "grad_norm"):
            assert got[key] == pytest.approx(want[key], rel=1e-5), (step, key)
        for name, grad in one["grads"][step].items():
            for rank in ranks:
                torch.testing.assert_close(rank["grads"][step][name], grad, **FP32, msg=name)


@pytest.fixture(scope="module")
def lora_runs(
    tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """The LoRA actor (Qwen3, rank-4 adapters) at 1 rank and at 2 ranks with sp=2."""
    root = tmp_path_factory.mktemp("ulysses_lora")
    actor = str(tiny_models["qwen3"])
    return {
        "one": _run(1, ["lora", actor, "1"], root / "lora1")[0],
        "sp": _run(2, ["lora", actor, "2"], root / "lora2"),
    }


def test_sp2_with_lora_matches_one_rank(lora_runs: dict[str, Any]) -> None:
    """LoRA under Ulysses: log-probs, losses and the adapters' gradients equal 1 rank's,
    and only adapters get gradients."""
    one, ranks = lora_runs["one"], lora_runs["sp"]
    for key in ("log_probs", "entropy", "log_probs_after"):
        torch.testing.assert_close(torch.cat([r[key] for r in ranks]), one[key], **FP32)
    for step, (want, got) in enumerate(zip(one["metrics"], ranks[0]["metrics"], strict=True)):
        for key in ("loss", "grad_norm"):
            assert got[key] == pytest.approx(want[key], rel=1e-5), (step, key)
        assert one["grads"][step], "the adapters got no gradient"
        assert all("lora_" in name for name in one["grads"][step]), one["grads"][step].keys()
        for name, grad in one["grads"][step].items():
            for rank in ranks:
                torch.testing.assert_close(rank["grads"][step][name], grad, **FP32, msg=name)


def test_dp2_x_sp2_critic_with_recompute_matches_one_rank(runs: dict[str, Any]) -> None:
    one, ranks = runs["critic_one"], runs["critic_sp"]
    torch.testing.assert_close(torch.cat([r["values"] for r in ranks]), one["values"], **FP32)
    assert ranks[0]["losses"] == pytest.approx(one["losses"], rel=1e-5)
