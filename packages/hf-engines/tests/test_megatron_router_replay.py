"""Router replay (R3) in the Megatron engine: on 1 rank, with 2 expert-parallel ranks, and
with 2 pipeline stages (each replays its own layer of the recorded routing).

The routing is recorded on the Hugging Face model in this process (``RoutingRecorder``):
``own`` from the model as is (what the engine would choose itself), ``nudged`` from a copy
whose routers are perturbed (some choices flip). Replaying ``own`` must change nothing,
neither log-probs nor gradients; replaying ``nudged`` must give the FSDP engine's replayed
log-probs, so both engines agree under the same replayed routing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("megatron.core", reason="needs the megatron extra (megatron-core)")

from transformers import AutoModelForCausalLM

from hf_engines import EngineConfig, FSDPEngine, ModelConfig
from hf_engines.testing import launch_ranks, make_toy_batch
from hf_protocol import DataProto, fields
from hf_protocol.routing import ROUTED_EXPERTS, RoutingRecorder
from hf_protocol.testing import save_tiny_model, tiny_decoder_config

pytestmark = [pytest.mark.second_lane, pytest.mark.timeout(600)]

SCENARIOS = Path(__file__).with_name("router_replay_scenarios.py")
QUIET = {
    "TRANSFORMERS_VERBOSITY": "error",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "PYTHONWARNINGS": "ignore",
}
TOLERANCE = 1e-5
NUDGE = 0.1  # the recording router differs from the engine's by this much noise (x its std)
ROWS = 5


def _batch() -> DataProto:
    return make_toy_batch(ROWS, seed=7)


def _record(model_dir: Path, nudge: float) -> torch.Tensor:
    """The probe batch's ``(B, T, L, k)`` routing on the HF model (routers perturbed by
    ``nudge``); -1 at padding, as the rollout records it."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                param.add_(torch.randn(param.shape, generator=generator) * param.std() * nudge)
    recorder = RoutingRecorder(model)
    tensors = _batch().batch
    with torch.no_grad():
        model(
            input_ids=tensors[fields.INPUT_IDS],
            attention_mask=tensors[fields.ATTENTION_MASK],
            position_ids=tensors[fields.POSITION_IDS],
        )
    recorder.close()
    routed = recorder.pop()
    routed = routed.reshape(*tensors[fields.INPUT_IDS].shape, *routed.shape[1:])
    routed[~tensors[fields.ATTENTION_MASK].bool()] = -1
    return routed


@pytest.fixture(scope="module")
def moe_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen3-MoE with wide weights, so a flipped expert changes the output."""
    config = tiny_decoder_config("qwen3_moe", initializer_range=0.2)
    return save_tiny_model(tmp_path_factory.mktemp("wide-moe"), config)


@pytest.fixture(scope="module")
def routing(moe_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The probe batch's tensors and its ``own`` and ``nudged`` recorded routings."""
    recorded = {
        "batch": dict(_batch().batch.items()),
        "own": _record(moe_model, 0.0),
        "nudged": _record(moe_model, NUDGE),
    }
    path = tmp_path_factory.mktemp("routing") / "routing.pt"
    torch.save(recorded, path)
    return {**recorded, "path": path}


# (ranks, pipeline stages): 1 rank; EP=2 (and 2 data-parallel replicas); PP=2
LAYOUTS = {"one_rank": (1, 1), "ep2": (2, 1), "pp2": (2, 2)}


@pytest.fixture(scope="module", params=list(LAYOUTS))
def megatron(
    request: pytest.FixtureRequest,
    moe_model: Path,
    routing: dict[str, Any],
    tmp_path_factory: pytest.TempPathFactory,
) -> list[dict[str, Any]]:
    """Every rank's results of the Megatron engine in the layout ``param``."""
    ranks, stages = LAYOUTS[request.param]
    out = tmp_path_factory.mktemp(f"megatron-{request.param}")
    args = [str(moe_model), str(routing["path"]), str(out), str(stages)]
    launch_ranks(SCENARIOS, ranks, args, 300, QUIET)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(ranks)]


def _gathered(ranks: list[dict[str, Any]], key: str) -> torch.Tensor:
    """The whole batch's ``key``: the data-parallel replicas' rows (every stage has them)."""
    return torch.cat([rank[key] for rank in ranks if rank["stage"] == 0])


def test_nudged_routing_differs_from_own(routing: dict[str, Any]) -> None:
    assert not torch.equal(routing["own"], routing["nudged"])


def test_replaying_own_routing_changes_nothing(megatron: list[dict[str, Any]]) -> None:
    mask = _batch().batch[fields.RESPONSE_MASK]
    own, plain = _gathered(megatron, "log_probs_own"), _gathered(megatron, "log_probs_plain")
    torch.testing.assert_close(own * mask, plain * mask, rtol=0, atol=1e-6)
    for rank in megatron:
        assert rank["loss_own"] == pytest.approx(rank["loss_plain"], abs=1e-6)
        assert set(rank["grads_own"]) == set(rank["grads_plain"])
        for name, grad in rank["grads_plain"].items():
            torch.testing.assert_close(rank["grads_own"][name], grad, rtol=0, atol=1e-6)


def test_megatron_replay_matches_fsdp_replay(
    megatron: list[dict[str, Any]], routing: dict[str, Any], moe_model: Path, one_rank: None
) -> None:
    engine = FSDPEngine(EngineConfig(model=ModelConfig(path=str(moe_model))))
    replay = DataProto.from_dict(tensors={**routing["batch"], ROUTED_EXPERTS: routing["nudged"]})
    fsdp, _ = engine.compute_log_prob(replay)
    mask = _batch().batch[fields.RESPONSE_MASK]
    replayed = _gathered(megatron, "log_probs_nudged")
    torch.testing.assert_close(replayed * mask, fsdp * mask, rtol=0, atol=TOLERANCE)
    # the replay mattered: the engine's own routing gives other log-probs
    plain = _gathered(megatron, "log_probs_plain")
    assert ((replayed - plain) * mask).abs().max() > 1e-3


def test_training_on_replayed_routing_uses_it(megatron: list[dict[str, Any]]) -> None:
    for rank in megatron:
        assert torch.isfinite(torch.tensor(rank["loss_nudged"]))
        assert rank["loss_nudged"] != pytest.approx(rank["loss_plain"], abs=1e-4)
        router = next(name for name in rank["grads_nudged"] if name.endswith("router.weight"))
        assert rank["grads_nudged"][router].abs().sum() > 0  # the router keeps its gradient
