"""The role workers through real worker groups: 2 CPU ranks on Ray (gloo), and the local
backend at world size 1. Tiny models, a handful of tokens, one group per test."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

from hf_controller import (
    Dispatch,
    LocalWorkerGroup,
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    Worker,
    create_colocated_worker_cls,
    create_colocated_worker_cls_fused,
    register,
)
from hf_controller.threads import usable_cores
from hf_engines import (
    ActorConfig,
    ActorWorker,
    CriticConfig,
    CriticWorker,
    EngineConfig,
    ModelConfig,
    ReferenceWorker,
    RewardModelWorker,
    config_from_dict,
)
from hf_engines.models import build_hf_model
from hf_engines.testing import make_toy_batch, toy_nll_loss, toy_value_loss
from hf_protocol import DataProto

ACTOR_METRICS = {"actor/nll", "actor/loss", "actor/grad_norm", "actor/lr"}
CRITIC_METRICS = {"critic/vf_loss", "critic/loss", "critic/grad_norm", "critic/lr"}


def engine_config(model: Path, **model_options: Any) -> EngineConfig:
    return config_from_dict(
        EngineConfig,
        {
            "model": {"path": str(model), **model_options},
            "optim": {"lr": 1e-2},
            "micro_batch": {"micro_batch_size": 2},
        },
    )


def actor_config(model: Path) -> ActorConfig:
    return ActorConfig(
        engine=engine_config(model), ppo_mini_batch_size=4, ppo_epochs=2, shuffle=True
    )


def pool() -> RayResourcePool:
    return RayResourcePool([2], use_gpu=False)


def probe() -> DataProto:
    return make_toy_batch(5, seed=7)  # 5 rows: 3/2 over two ranks


def masked(values: torch.Tensor) -> torch.Tensor:
    return values * probe().batch["response_mask"]


def model_logits(model: torch.nn.Module, batch: DataProto) -> torch.Tensor:
    """Plain transformers forward on the whole (padded) batch, one process."""
    with torch.no_grad():
        return model(
            input_ids=batch.batch["input_ids"],
            attention_mask=batch.batch["attention_mask"],
            position_ids=batch.batch["position_ids"],
        ).logits.float()


def plain_log_probs(model_dir: Path) -> torch.Tensor:
    """Response log-probs computed with plain transformers."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    batch = probe()
    responses = batch.batch["responses"]
    logits = model_logits(model, batch)[:, -responses.shape[1] - 1 : -1]
    return torch.log_softmax(logits, -1).gather(-1, responses.unsqueeze(-1)).squeeze(-1)


def check_actor_metrics(metrics: dict[str, list[float]], steps_per_rank: int) -> None:
    assert set(metrics) == ACTOR_METRICS
    for name in ACTOR_METRICS:
        assert len(metrics[name]) == 2 * steps_per_rank, name  # gathered from both ranks
    # The engine's loss, norm and lr are global: both ranks report the same.
    for name in ("actor/loss", "actor/grad_norm", "actor/lr"):
        assert metrics[name][:steps_per_rank] == metrics[name][steps_per_rank:], name


@pytest.mark.timeout(240)
def test_actor_log_probs_update_and_export(
    ray_session: Any, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    model_dir = tiny_models["qwen2"]
    group = RayWorkerGroup(
        pool(), RayClassWithInitArgs(ActorWorker, actor_config(model_dir), loss_fn=toy_nll_loss)
    )
    group.init_model()
    out = group.compute_log_prob(probe())
    assert set(out.batch.keys()) == {"old_log_probs", "entropys"}
    assert out.batch["old_log_probs"].shape == (5, 5)
    expected = plain_log_probs(model_dir)
    torch.testing.assert_close(
        masked(out.batch["old_log_probs"]), masked(expected), atol=1e-5, rtol=0
    )

    batch = make_toy_batch(8, seed=11)
    metrics = group.update_actor(batch).meta_info["metrics"]
    check_actor_metrics(metrics, steps_per_rank=4)  # 8 rows / 4 per mini-batch x 2 epochs
    assert metrics["actor/loss"][-1] < metrics["actor/loss"][0]
    assert group.global_step() == [4, 4]

    group.export_hf(str(tmp_path / "hf"))
    after = group.compute_log_prob(probe()).batch["old_log_probs"]
    assert not torch.allclose(masked(after), masked(expected), atol=1e-3)
    torch.testing.assert_close(
        masked(after), masked(plain_log_probs(tmp_path / "hf")), atol=1e-5, rtol=0
    )


@pytest.mark.timeout(240)
def test_critic_and_reward_model_colocated(ray_session: Any, tiny_models: dict[str, Path]) -> None:
    model_dir = tiny_models["llama"]
    critic = CriticConfig(
        engine=engine_config(model_dir, head="value", seed=3), ppo_mini_batch_size=4
    )
    roles = {
        "critic": RayClassWithInitArgs(CriticWorker, critic, loss_fn=toy_value_loss),
        "rm": RayClassWithInitArgs(
            RewardModelWorker, engine_config(model_dir, head="value", seed=5)
        ),
    }
    views = RayWorkerGroup(pool(), create_colocated_worker_cls(roles)).spawn({"critic", "rm"})
    views["critic"].init_model()
    views["rm"].init_model()
    batch = probe()
    tensors = batch.batch
    response_length = tensors["responses"].shape[1]

    value_model = build_hf_model(ModelConfig(path=str(model_dir), head="value", seed=3))
    expected_values = model_logits(value_model, batch)[:, -response_length - 1 : -1, 0]
    values = views["critic"].compute_values(batch).batch["values"]
    torch.testing.assert_close(masked(values), masked(expected_values), atol=1e-5, rtol=0)

    rm_model = build_hf_model(ModelConfig(path=str(model_dir), head="value", seed=5))
    at_tokens = model_logits(rm_model, batch)[:, -response_length:, 0]
    last = tensors["response_mask"].sum(-1) - 1
    expected_scores = torch.zeros(5, response_length)
    expected_scores[torch.arange(5), last] = at_tokens[torch.arange(5), last]
    scores = views["rm"].compute_rm_score(batch).batch["rm_scores"]
    torch.testing.assert_close(scores, expected_scores, atol=1e-5, rtol=0)

    metrics = views["critic"].update_critic(make_toy_batch(8, seed=3)).meta_info["metrics"]
    assert set(metrics) == CRITIC_METRICS
    assert len(metrics["critic/vf_loss"]) == 4  # 2 mini-batches on each of 2 ranks


@pytest.mark.timeout(240)
def test_fused_actor_and_reference_share_a_process(
    ray_session: Any, tiny_models: dict[str, Path]
) -> None:
    model_dir = tiny_models["qwen3"]
    roles = {
        "actor": RayClassWithInitArgs(ActorWorker, actor_config(model_dir), loss_fn=toy_nll_loss),
        "ref": RayClassWithInitArgs(ReferenceWorker, engine_config(model_dir)),
    }
    group = RayWorkerGroup(pool(), create_colocated_worker_cls_fused(roles))
    group.fuse({"actor", "ref"})
    group.actor.init_model()  # type: ignore[attr-defined]
    group.ref.init_model()  # type: ignore[attr-defined]
    batch = probe()
    old = group.actor.compute_log_prob(batch).batch["old_log_probs"]  # type: ignore[attr-defined]
    ref = group.ref.compute_ref_log_prob(batch).batch["ref_log_prob"]  # type: ignore[attr-defined]
    torch.testing.assert_close(masked(old), masked(ref), atol=1e-6, rtol=0)

    group.actor.update_actor(make_toy_batch(8, seed=11))  # type: ignore[attr-defined]
    new = group.actor.compute_log_prob(batch).batch["old_log_probs"]  # type: ignore[attr-defined]
    ref_again = group.ref.compute_ref_log_prob(batch).batch["ref_log_prob"]  # type: ignore[attr-defined]
    torch.testing.assert_close(ref_again, ref, atol=0, rtol=0)  # the reference never moves
    assert not torch.allclose(masked(new), masked(ref), atol=1e-3)


@pytest.mark.timeout(240)
def test_local_worker_group_world_size_one(tiny_models: dict[str, Path]) -> None:
    model_dir = tiny_models["qwen2"]
    group = LocalWorkerGroup(
        world_size=1,
        ray_cls_with_init=RayClassWithInitArgs(
            ActorWorker, actor_config(model_dir), loss_fn=toy_nll_loss
        ),
    )
    try:
        group.init_model()
        log_probs = group.compute_log_prob(probe()).batch["old_log_probs"]
        torch.testing.assert_close(
            masked(log_probs), masked(plain_log_probs(model_dir)), atol=1e-5, rtol=0
        )
        metrics = group.update_actor(make_toy_batch(8, seed=11)).meta_info["metrics"]
        assert set(metrics) == ACTOR_METRICS
        assert len(metrics["actor/loss"]) == 4  # 2 mini-batches x 2 epochs, one rank
        names = [name for name, _ in group.workers[0].iter_full_params()]
        assert names == list(AutoModelForCausalLM.from_pretrained(model_dir).state_dict())
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def local_actor(model_dir: Path) -> LocalWorkerGroup:
    """A one-rank ActorWorker group in this process (shuffled mini-batches, 2 epochs)."""
    return LocalWorkerGroup(
        world_size=1,
        ray_cls_with_init=RayClassWithInitArgs(
            ActorWorker, actor_config(model_dir), loss_fn=toy_nll_loss
        ),
    )


@pytest.mark.timeout(240)
def test_resumed_actor_shuffles_like_an_uninterrupted_run(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    model_dir = tiny_models["llama"]
    first, second = make_toy_batch(8, seed=11), make_toy_batch(8, seed=12)
    checkpoint = str(tmp_path / "ckpt")
    try:
        straight = local_actor(model_dir)
        straight.init_model()
        straight.update_actor(first)
        straight.save_checkpoint(checkpoint)
        expected = straight.update_actor(second).meta_info["metrics"]

        resumed = local_actor(model_dir)  # a fresh worker, as after a restart
        resumed.init_model()
        assert resumed.load_checkpoint(checkpoint) == [4]  # 2 mini-batches x 2 epochs
        got = resumed.update_actor(second).meta_info["metrics"]
        # Same shuffled order, hence the same per-step losses, step for step.
        assert got["actor/nll"] == pytest.approx(expected["actor/nll"], rel=1e-6, abs=1e-7)
        assert got["actor/lr"] == expected["actor/lr"]
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


class TorchThreadsWorker(Worker):
    @register(Dispatch.ALL_TO_ALL)
    def torch_threads(self) -> int:
        return torch.get_num_threads()


@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("prestart", [False, True])
def test_worker_torch_uses_its_share_of_the_cores(prestart: bool) -> None:
    """Ray starts a fractional-CPU actor with OMP_NUM_THREADS=1; the group's thread count
    reaches torch, also in a prestarted process that imported torch before its rank's
    environment arrived."""
    one = RayResourcePool([1], use_gpu=False)
    if prestart:
        one.prestart(("torch",))
    group = RayWorkerGroup(one, RayClassWithInitArgs(TorchThreadsWorker))
    try:
        assert group.torch_threads() == [usable_cores()]
    finally:
        group.shutdown()
        one.release()
