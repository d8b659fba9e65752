"""RolloutWorker through real worker groups: 2 CPU ranks on Ray, a rollout fused with
hf-engines' ActorWorker (in-process weight sync), and the local backend at world size 1."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from ray import cloudpickle
from transformers import AutoModelForCausalLM

from hf_controller import (
    LocalWorkerGroup,
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    WorkerGroupError,
    create_colocated_worker_cls_fused,
)
from hf_engines import (
    ActorConfig,
    ActorWorker,
    EngineConfig,
    LossOutput,
    ModelOutputs,
    mini_batch_total,
)
from hf_engines import config_from_dict as engine_config_from_dict
from hf_protocol import DataProto
from hf_rollout import RolloutConfig, SamplingConfig
from hf_rollout.backends.native import NativeRollout
from hf_rollout.base import pad_responses_to
from hf_rollout.testing import make_prompts, random_prompt_ids
from hf_rollout.workers import RolloutWorker

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests/

PAD = 0
GREEDY = SamplingConfig(greedy=True, max_new_tokens=6, eos_token_id=1, n=2)


def nll_loss(outputs: ModelOutputs, micro_batch: DataProto) -> LossOutput:
    """This micro-batch's share of the mini-batch's token-mean NLL of the responses."""
    mask = micro_batch.batch["response_mask"].float()
    nll_sum = -(outputs["log_probs"] * mask).sum()
    loss = nll_sum / mini_batch_total(micro_batch, "tokens", mask.sum())
    return loss, {"nll": float(nll_sum.detach() / mask.sum())}


def rollout_config(model: Path) -> RolloutConfig:
    return RolloutConfig(model_path=str(model), pad_token_id=PAD)


def prompts_with_sampling(rows: int, seed: int, sampling: SamplingConfig) -> DataProto:
    prompts = make_prompts(random_prompt_ids(rows, seed=seed), PAD)
    prompts.meta_info["sampling"] = sampling
    return prompts


def single_process(model: Path, prompts: DataProto) -> DataProto:
    engine = NativeRollout(rollout_config(model))
    out = engine.generate(prompts, prompts.meta_info["sampling"])
    return pad_responses_to(out, GREEDY.max_new_tokens, PAD)


@pytest.mark.timeout(240)
def test_two_ranks_generate_update_and_sleep(
    ray_session: Any, tiny_models: dict[str, Path]
) -> None:
    group = RayWorkerGroup(
        RayResourcePool([2], use_gpu=False),
        RayClassWithInitArgs(RolloutWorker, rollout_config(tiny_models["qwen2"])),
    )
    group.init_model()
    prompts = prompts_with_sampling(5, seed=1, sampling=GREEDY)  # 3 / 2 prompts per rank
    out = group.generate_sequences(prompts)
    expected = single_process(tiny_models["qwen2"], prompts)
    assert len(out) == 10
    for key in ("input_ids", "attention_mask", "position_ids", "response_mask"):
        assert torch.equal(out.batch[key], expected.batch[key]), key
    torch.testing.assert_close(
        out.batch["rollout_log_probs"], expected.batch["rollout_log_probs"], atol=1e-5, rtol=0
    )
    assert len(out.meta_info["metrics"]["rollout/generate_s"]) == 2

    other = AutoModelForCausalLM.from_pretrained(tiny_models["qwen2_other"])
    group.sleep()
    group.update_weights(dict(other.state_dict()))
    group.wake_up()
    switched = group.generate_sequences(prompts)
    assert torch.equal(
        switched.batch["responses"],
        single_process(tiny_models["qwen2_other"], prompts).batch["responses"],
    )


@pytest.mark.timeout(300)
def test_fused_with_actor_syncs_weights_in_process(
    ray_session: Any, tiny_models: dict[str, Path]
) -> None:
    model = tiny_models["qwen2"]
    engine: EngineConfig = engine_config_from_dict(
        EngineConfig,
        {
            "model": {"path": str(model)},
            "optim": {"lr": 5e-2},
            "micro_batch": {"micro_batch_size": 4},
        },
    )
    roles = {
        "actor": RayClassWithInitArgs(
            ActorWorker, ActorConfig(engine=engine, ppo_mini_batch_size=8), loss_fn=nll_loss
        ),
        "rollout": RayClassWithInitArgs(RolloutWorker, rollout_config(model)),
    }
    group = RayWorkerGroup(
        RayResourcePool([2], use_gpu=False), create_colocated_worker_cls_fused(roles)
    )
    group.fuse({"actor", "rollout"})
    actor, rollout = group.actor, group.rollout  # type: ignore[attr-defined]
    actor.init_model()
    rollout.init_model()
    sampling = SamplingConfig(temperature=0.8, max_new_tokens=5, seed=3, eos_token_id=1)
    batch = rollout.generate_sequences(prompts_with_sampling(8, seed=2, sampling=sampling))
    actor.update_actor(batch)  # the actor moves away from the rollout's weights
    before = rollout.generate_sequences(prompts_with_sampling(4, seed=3, sampling=sampling))
    stale = actor.compute_log_prob(before).batch["old_log_probs"]
    mask = before.batch["response_mask"].bool()
    assert not torch.allclose(stale[mask], before.batch["rollout_log_probs"][mask], atol=1e-3)

    rollout.update_weights()  # from the fused actor, on every rank
    after = rollout.generate_sequences(prompts_with_sampling(4, seed=3, sampling=sampling))
    fresh = actor.compute_log_prob(after).batch["old_log_probs"]
    mask = after.batch["response_mask"].bool()
    torch.testing.assert_close(
        fresh[mask], after.batch["rollout_log_probs"][mask], atol=1e-5, rtol=0
    )


def local_group(model: Path) -> LocalWorkerGroup:
    return LocalWorkerGroup(
        world_size=1, ray_cls_with_init=RayClassWithInitArgs(RolloutWorker, rollout_config(model))
    )


def test_local_group_raw_prompts_and_errors(tiny_models: dict[str, Path]) -> None:
    group = local_group(tiny_models["llama"])
    with pytest.raises(WorkerGroupError, match="call init_model"):
        group.sleep()
    group.init_model()
    raw = DataProto.from_dict(
        non_tensors={"raw_prompt_ids": [[5, 6, 7], [8]]},
        meta_info={"max_prompt_length": 6, "sampling": SamplingConfig(max_new_tokens=4)},
    )
    out = group.generate_sequences(raw)
    assert out.batch["prompts"].shape == (2, 6) and out.batch["responses"].shape == (2, 4)
    assert out.batch["prompts"][1].tolist() == [PAD] * 5 + [8]
    with pytest.raises(WorkerGroupError, match=r"reads the fused 'actor' role.*fused roles \[\]"):
        group.update_weights()


def test_worker_samples_with_the_config_object_it_is_sent(tiny_models: dict[str, Path]) -> None:
    group = local_group(tiny_models["llama"])
    group.init_model()
    sampling = SamplingConfig(n=3, max_new_tokens=5, temperature=0.5, seed=7)
    out = group.generate_sequences(prompts_with_sampling(2, seed=4, sampling=sampling))
    assert out.batch["responses"].shape == (6, 5)  # n rows per prompt, max_new_tokens wide
    assert out.meta_info["temperature"] == 0.5
    assert out.meta_info["sampling"] == sampling  # rides along unchanged, still an object

    default = group.generate_sequences(make_prompts(random_prompt_ids(2, seed=4), PAD))
    assert default.batch["responses"].shape == (2, SamplingConfig().max_new_tokens)
    assert default.meta_info["temperature"] == SamplingConfig().temperature


def test_worker_rejects_a_sampling_dict_naming_the_fix(tiny_models: dict[str, Path]) -> None:
    group = local_group(tiny_models["llama"])
    group.init_model()
    prompts = make_prompts(random_prompt_ids(2, seed=4), PAD)
    prompts.meta_info["sampling"] = {"n": 2, "max_new_tokens": 4}
    with pytest.raises(WorkerGroupError, match=r"must be a hf_rollout.SamplingConfig, got dict"):
        group.generate_sequences(prompts)
