"""Router replay (R3) in the FSDP engine: a batch carrying ``routed_experts`` is routed as
recorded, in log-probs and in training, on one in-process gloo rank."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from hf_engines import EngineConfig, FSDPEngine, MicroBatchConfig, ModelConfig, OptimConfig
from hf_engines.testing import make_toy_batch, toy_nll_loss
from hf_protocol import DataProto, fields
from hf_protocol.routing import ROUTED_EXPERTS, RoutingRecorder
from hf_protocol.testing import save_tiny_model, tiny_decoder_config

NUDGE = 0.1  # the rollout router differs from the actor's by this much noise (x its std)


@pytest.fixture(scope="module")
def moe_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen3-MoE with wide weights, so a flipped expert changes the output."""
    config = tiny_decoder_config("qwen3_moe", initializer_range=0.2)
    return save_tiny_model(tmp_path_factory.mktemp("wide-moe"), config)


def _behaviour(model_dir: Path, batch: DataProto) -> tuple[torch.Tensor, torch.Tensor]:
    """A "rollout" model (the router nudged): its response log-probs and routing."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                param.add_(torch.randn(param.shape, generator=generator) * param.std() * NUDGE)
    recorder = RoutingRecorder(model)
    tensors = batch.batch
    with torch.no_grad():
        logits = model(
            input_ids=tensors[fields.INPUT_IDS],
            attention_mask=tensors[fields.ATTENTION_MASK],
            position_ids=tensors[fields.POSITION_IDS],
        ).logits
    routed = recorder.pop().reshape(*tensors[fields.INPUT_IDS].shape, 2, 2)
    recorder.close()
    responses = tensors[fields.RESPONSES]
    scores = torch.log_softmax(logits[:, -responses.shape[1] - 1 : -1], dim=-1)
    return scores.gather(-1, responses.unsqueeze(-1)).squeeze(-1), routed


def test_engine_replays_recorded_routing(moe_model: Path, one_rank: None) -> None:
    config = EngineConfig(
        model=ModelConfig(path=str(moe_model)),
        optim=OptimConfig(lr=1e-2),
        micro_batch=MicroBatchConfig(micro_batch_size=3),
    )
    engine = FSDPEngine(config)
    batch = make_toy_batch(6, seed=4)
    behaviour, routed = _behaviour(moe_model, batch)
    replay = DataProto.from_dict(tensors={**dict(batch.batch.items()), ROUTED_EXPERTS: routed})
    mask = batch.batch[fields.RESPONSE_MASK].bool()
    recorder = RoutingRecorder(engine.model)

    def routing_of(run: DataProto) -> tuple[torch.Tensor, torch.Tensor]:
        recorder.calls = [[] for _ in recorder.layers]
        log_probs, _ = engine.compute_log_prob(run)
        used = [torch.cat(calls) for calls in recorder.calls]  # the micro-batches, in order
        return log_probs, torch.stack(used, dim=1)

    own, own_routing = routing_of(batch)  # padding removal on: real tokens only
    replayed, replayed_routing = routing_of(replay)  # replay runs the padded forward
    recorder.close()
    real = batch.batch[fields.ATTENTION_MASK].bool().reshape(-1)
    recorded = routed.reshape(-1, 2, 2).to(torch.int16)
    assert torch.equal(replayed_routing, recorded)
    assert not torch.equal(own_routing, recorded[real])  # the nudge flipped some choices
    assert (replayed - behaviour)[mask].abs().mean() < 0.7 * (own - behaviour)[mask].abs().mean()
    metrics = engine.train_step(replay, toy_nll_loss)
    assert metrics["grad_norm"] > 0
