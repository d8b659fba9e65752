"""Router replay (R3): the native rollout records each token's experts, and a forward
under ``hf_protocol.routing.replay_routing`` routes exactly as recorded."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from hf_protocol import DataProto, fields
from hf_protocol.routing import ROUTED_EXPERTS, RoutingRecorder, replay_routing
from hf_rollout import RolloutConfig, SamplingConfig
from hf_rollout.backends.native import NativeRollout
from hf_rollout.testing import build_tiny_model, make_prompts, random_prompt_ids

LAYERS, TOP_K = 2, 2


@pytest.fixture(scope="module")
def moe_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("moe") / "m", "qwen3_moe")


def _rollout(model: Path, dtype: str) -> DataProto:
    engine = NativeRollout(RolloutConfig(model_path=str(model), dtype=dtype, max_model_len=64))
    prompts = make_prompts(random_prompt_ids(6, seed=1))
    return engine.generate(prompts, SamplingConfig(n=2, max_new_tokens=10, seed=3))


def _forward(model: torch.nn.Module, batch: DataProto) -> tuple[torch.Tensor, torch.Tensor]:
    """Response log-probs ``(B, R)`` and the routing used ``(B, T, L, k)``."""
    tensors = batch.batch
    recorder = RoutingRecorder(model)
    with torch.no_grad():
        logits = model(
            input_ids=tensors[fields.INPUT_IDS],
            attention_mask=tensors[fields.ATTENTION_MASK],
            position_ids=tensors[fields.POSITION_IDS],
        ).logits
    used = recorder.pop().reshape(*tensors[fields.INPUT_IDS].shape, LAYERS, TOP_K)
    recorder.close()
    responses = tensors[fields.RESPONSES]
    scores = torch.log_softmax(logits[:, -responses.shape[1] - 1 : -1].float(), dim=-1)
    return scores.gather(-1, responses.unsqueeze(-1)).squeeze(-1), used


def test_rollout_records_the_routing_a_full_forward_takes(moe_model: Path) -> None:
    batch = _rollout(moe_model, "float32")
    routed = batch.batch[ROUTED_EXPERTS]
    rows, width = batch.batch[fields.INPUT_IDS].shape
    assert routed.shape == (rows, width, LAYERS, TOP_K) and routed.dtype == torch.int16
    assert routed.max() < 4
    lengths = batch.batch[fields.RESPONSE_MASK].sum(dim=1)
    prompt_width = width - batch.batch[fields.RESPONSES].shape[1]
    for row, length in enumerate(lengths.tolist()):  # the last sampled token is never fed
        assert (routed[row, prompt_width + length - 1 :] == -1).all()
    model = AutoModelForCausalLM.from_pretrained(moe_model, dtype=torch.float32)
    _, used = _forward(model, batch)
    known = routed >= 0
    assert torch.equal(used[known].to(torch.int16), routed[known])


def test_replay_routes_as_recorded_and_closes_the_log_prob_gap(moe_model: Path) -> None:
    batch = _rollout(moe_model, "bfloat16")
    routed = batch.batch[ROUTED_EXPERTS]
    actor = AutoModelForCausalLM.from_pretrained(moe_model, dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # the actor's router moved a little since the rollout
        for name, param in actor.named_parameters():
            if name.endswith("mlp.gate.weight"):
                param.add_(torch.randn(param.shape, generator=generator) * param.std() * 0.1)
    mask = batch.batch[fields.RESPONSE_MASK].bool()
    rollout_log_probs = batch.batch[fields.ROLLOUT_LOG_PROBS]
    known = routed >= 0
    own, own_routing = _forward(actor, batch)
    with replay_routing(actor, routed):
        replayed, replayed_routing = _forward(actor, batch)
    assert not torch.equal(own_routing[known].to(torch.int16), routed[known])
    assert torch.equal(replayed_routing[known].to(torch.int16), routed[known])
    own_gap = (own - rollout_log_probs)[mask].abs().mean()
    replayed_gap = (replayed - rollout_log_probs)[mask].abs().mean()
    assert replayed_gap < 0.7 * own_gap


def test_replay_keeps_the_router_trainable(moe_model: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(moe_model, dtype=torch.float32)
    ids = torch.tensor([[5, 6, 7, 8]])
    per_token = torch.tensor([[0, 1], [2, 3], [1, 0], [3, 2]])
    routed = per_token[None, :, None].expand(1, 4, LAYERS, 2).contiguous()
    with replay_routing(model, routed):
        model(input_ids=ids).logits.sum().backward()
    gate = model.model.layers[0].mlp.gate.weight
    assert gate.grad is not None and gate.grad.abs().sum() > 0
    wrong = replay_routing(model, routed[:, :, :1])
    with pytest.raises(ValueError, match=r"expected \(B, T, 2 MoE layers, k\)"):
        wrong.__enter__()


def test_a_dense_model_records_no_routing(tiny_models: dict[str, Path]) -> None:
    engine = NativeRollout(RolloutConfig(model_path=str(tiny_models["qwen2"]), max_model_len=64))
    batch = engine.generate(make_prompts([[5, 6]]), SamplingConfig(max_new_tokens=3))
    assert ROUTED_EXPERTS not in batch.batch.keys()  # noqa: SIM118 (a TensorDict)
