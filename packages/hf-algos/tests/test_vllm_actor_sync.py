"""An FSDP2 actor and a vLLM engine in one process, the hybrid placement's pair: weights pushed
from the trained actor reach vLLM, and sleep / wake_up release and restore its memory.

Runs wherever vLLM is installed: on the CPU build (``tools/setup_vllm_env.sh``; gloo, fp32,
sleep is a no-op there) in CI, and on a GPU (NCCL, bf16, sleep mode) in the GPU script's
``vllm_actor`` stage (``tools/gpu/run_stages.py``). With ``HYBRIDFLOW_GPU_RECORD`` set, each
test appends what it measured to that file as one JSON line, for the GPU report.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
import torch

pytest.importorskip("vllm")

from hf_engines import EngineConfig, FSDPEngine, config_from_dict
from hf_engines.testing import make_toy_batch, toy_nll_loss
from hf_engines.workers import init_distributed
from hf_protocol import DataProto, fields
from hf_rollout import RolloutConfig, SamplingConfig, build_rollout
from hf_rollout.testing import build_tiny_model, make_prompts, random_prompt_ids

pytestmark = pytest.mark.timeout(900)

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
PAD = 0
GREEDY = SamplingConfig(greedy=True, max_new_tokens=8)
LOG_PROB_TOLERANCE = 0.1 if CUDA else 2e-3
"""Largest |actor - vLLM| log-prob of a sampled token: fp32 on CPU; bf16 kernels on GPU."""
GIB = 2**30


def record(name: str, values: dict[str, Any]) -> None:
    """Append ``values`` under ``name`` to ``$HYBRIDFLOW_GPU_RECORD`` (if set) as JSON."""
    path = os.environ.get("HYBRIDFLOW_GPU_RECORD")
    if path:
        with open(path, "a") as file:
            file.write(json.dumps({"test": name, "device": DEVICE, **values}) + "\n")


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FSDPEngine, Any]]:
    """A trainable FSDP2 actor and a vLLM engine, both started from one tiny qwen2."""
    model = build_tiny_model(
        tmp_path_factory.mktemp("actor-sync") / "qwen2",
        "qwen2",
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=2,
        num_key_value_heads=1,  # head size 32: vLLM's kernels reject the tiny default of 8
    )
    init_distributed(0, 1, 0, device=DEVICE)
    fsdp: dict[str, Any] = {"device": DEVICE}
    if CUDA:
        fsdp["param_dtype"] = "bfloat16"
    actor = FSDPEngine(
        config_from_dict(
            EngineConfig,
            {
                "model": {"path": str(model)},
                "optim": {"lr": 1e-2},
                "micro_batch": {"micro_batch_size": 4},
                "fsdp": fsdp,
            },
        )
    )
    engine_kwargs: dict[str, Any] = {"kv_cache_space_gib": 1}
    if CUDA:
        engine_kwargs.update(gpu_memory_utilization=0.2, enforce_eager=True)
    rollout = build_rollout(
        RolloutConfig(
            backend="vllm",
            model_path=str(model),
            pad_token_id=PAD,
            max_model_len=128,
            dtype="bfloat16" if CUDA else "float32",
            engine_kwargs=engine_kwargs,
        )
    )
    yield actor, rollout
    rollout.shutdown()
    torch.distributed.destroy_process_group()


def largest_gap(actor: FSDPEngine, samples: DataProto) -> float:
    """Largest |actor log-prob - rollout log-prob| over the samples' response tokens."""
    actor_log_probs, _ = actor.compute_log_prob(samples)
    mask = samples.batch[fields.RESPONSE_MASK].bool()
    rollout_log_probs = samples.batch[fields.ROLLOUT_LOG_PROBS].float()
    return float((actor_log_probs - rollout_log_probs)[mask].abs().max())


def test_weights_pushed_from_the_trained_actor_reach_vllm(
    pair: tuple[FSDPEngine, Any],
) -> None:
    actor, rollout = pair
    prompts = make_prompts(random_prompt_ids(8, seed=3), PAD)
    before = rollout.generate(prompts, GREEDY)
    assert largest_gap(actor, before) < LOG_PROB_TOLERANCE  # the same start
    batch = make_toy_batch(8, seed=100)
    for _ in range(4):
        actor.train_step(batch, toy_nll_loss)
    stale_gap = largest_gap(actor, before)
    assert stale_gap > 5 * LOG_PROB_TOLERANCE  # training moved the actor away from vLLM
    rollout.update_weights(actor.iter_full_params())
    after = rollout.generate(prompts, GREEDY)
    gap = largest_gap(actor, after)
    record("update_weights", {"stale_gap": stale_gap, "gap_after_push": gap})
    assert gap < LOG_PROB_TOLERANCE


def test_sleep_releases_memory_and_wake_up_restores_the_same_engine(
    pair: tuple[FSDPEngine, Any],
) -> None:
    _, rollout = pair
    prompts = make_prompts(random_prompt_ids(6, seed=5), PAD)
    expected = rollout.generate(prompts, GREEDY)
    free = [torch.cuda.mem_get_info()[0] / GIB] if CUDA else []
    rollout.sleep()
    with pytest.raises(RuntimeError, match="asleep"):
        rollout.generate(prompts, GREEDY)
    free += [torch.cuda.mem_get_info()[0] / GIB] if CUDA else []
    rollout.wake_up()
    free += [torch.cuda.mem_get_info()[0] / GIB] if CUDA else []
    again = rollout.generate(prompts, GREEDY)
    assert torch.equal(again.batch["responses"], expected.batch["responses"])
    if CUDA:
        awake, asleep, woken = free
        record(
            "sleep_wake",
            {"free_gib_awake": awake, "free_gib_asleep": asleep, "free_gib_woken": woken},
        )
        # gpu_memory_utilization=0.2 of the card is mostly KV cache: sleep frees most of it
        released = asleep - awake
        assert released > 0.1 * torch.cuda.mem_get_info()[1] / GIB
        assert abs(woken - awake) < 0.25 * released
