"""PPO and its critic-free relatives (GRPO, RLOO, REINFORCE++, ReMax): one driver.

One step, as docs/architecture.md draws it ("Data flow of one PPO step")::

    batch = rollout.generate_sequences(prompts)          # n samples per prompt
    batch = batch.union(reward(batch))                   # token_level_scores
    batch = batch.union(actor.compute_log_prob(batch))   # old_log_probs (*)
    batch = batch.union(ref.compute_ref_log_prob(batch)) # when a KL term needs it
    batch = batch.union(critic.compute_values(batch))    # gae only
    batch = compute_advantage(batch, estimator)          # pure functions
    critic.update_critic(batch); actor.update_actor(batch)
    sync actor weights -> rollout                        # in-process when hybrid

(*) Unless the update is one optimizer step over the batch (``ppo_epochs=1``, one
mini-batch): then the actor's loss takes them from that step's own forward, detached, and
applies the rollout correction there (:func:`~hf_algos.trainers.steps.old_log_probs_from_update`).

With ``algorithm.filter_groups`` (DAPO dynamic sampling) the first two lines repeat on more
prompt batches until ``data.train_batch_size`` prompt groups whose samples differ are in
hand (:meth:`PPOTrainer.sample`). In the hybrid placement the rollout wakes up for generation
and sleeps after it, and with ``actor.engine.offload`` the actor's memory goes to CPU while
the rollout generates (:func:`~hf_algos.trainers.steps.generation_phase`).

With ``trainer.async_mode`` ``one_step_off`` or ``fully_async`` the first line moves out of
the step: :class:`~hf_algos.trainers.async_loop.AsyncRollout` keeps generations queued on
the rollout's own processes and :meth:`PPOTrainer.next_batch` hands out the oldest finished
one (weights pushed on its schedule, stale groups generated again; docs/async.md).

The estimator's registry entry decides the rest: one that reads ``values`` (``gae``) gets a
critic, one that reads ``reward_baselines`` (``remax``) a greedy rollout whose score is the
baseline, the others need nothing more.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from hf_algos.advantages import compute_advantage
from hf_algos.advantages.registry import AdvantageEstimator, get_advantage_estimator
from hf_algos.checkpoint import Checkpointable
from hf_algos.config.loading import config_to_dict
from hf_algos.config.trainers import RLConfig
from hf_algos.data.loader import CollatingDataset
from hf_algos.kl import AdaptiveKLController, FixedKLController, KLController, apply_kl_penalty
from hf_algos.rewards import RewardManager, RewardModelScorer
from hf_algos.tracking import (
    compute_data_metrics,
    compute_throughput_metrics,
    compute_timing_metrics,
    timed,
    timing_metrics,
)
from hf_algos.trainers import builders
from hf_algos.trainers.async_loop import AsyncRollout, AsyncSpec
from hf_algos.trainers.base import Metrics, Trainer, WorkerClasses
from hf_algos.trainers.groups import RewardScorer
from hf_algos.trainers.multiturn import MultiTurnScorer, data_with_tools
from hf_algos.trainers.steps import (
    MODEL_FIELDS,
    absorb,
    apply_rollout_correction,
    check_rollout_log_probs,
    first_groups,
    for_worker,
    generate,
    generation_phase,
    generation_rows,
    has_rollout_log_probs,
    keep_varied_groups,
    old_log_probs_from_update,
    rename_prefix,
    sampled_validation_metrics,
    score_validation,
    tensors,
    validation_metrics,
    vote_keys,
)
from hf_controller import RayClassWithInitArgs
from hf_protocol import DataProto, fields
from hf_rollout import SamplingConfig

logger = logging.getLogger(__name__)

ACTOR_UPDATE_FIELDS = (
    *MODEL_FIELDS,
    fields.OLD_LOG_PROBS,
    fields.ADVANTAGES,
    fields.REF_LOG_PROB,
    fields.ROLLOUT_IS_WEIGHTS,
)
CRITIC_UPDATE_FIELDS = (*MODEL_FIELDS, fields.VALUES, fields.RETURNS)


class PPOTrainer(Trainer):
    """Builds the worker groups of an :class:`~hf_algos.config.RLConfig` and trains.

    ``PPOTrainer(config).fit()`` runs the whole job; call :meth:`shutdown` (or use it as a
    context manager) to end the workers.
    """

    def __init__(self, config: RLConfig) -> None:
        super().__init__(config.trainer, config_to_dict(config))
        self.config = config
        self.tokenizer = builders.load_tokenizer(config.data, config.actor)
        self.kl_ctrl = build_kl_controller(config)
        # "auto": TIS when the samples are off-policy (an async mode), else off
        algorithm, async_mode = config.algorithm, config.trainer.async_mode
        self._rollout_correction = algorithm.rollout_correction.settings(async_mode)
        self.estimator = get_advantage_estimator(config.algorithm.adv_estimator)
        needed = roles_needed(config, self.estimator)
        self.use_critic = "critic" in needed
        self.use_ref = "ref" in needed
        self.actor_is_reference = self.use_ref and config.actor.lora.enabled
        turns = config.rollout.multi_turn
        env_only = turns.enable and turns.reward == "environment"  # no reward function runs
        # rule-based scoring reads data_source, ground truth
        rules = config.reward.model is None and not env_only
        self.reward: RewardScorer
        try:
            # Start early: with Ray, the worker processes start and import torch (seconds)
            # while the driver starts the reward and loads the data below.
            self.start_workers()
            manager: RewardManager | None = None
            if rules:
                # A reward function that cannot be loaded fails here, within seconds; its
                # scoring process starts and scores one row while the data loads.
                manager = builders.reward_manager(config.reward, self.tokenizer)
                self.reward = manager
                manager.start()
            if env_only:
                self.reward = MultiTurnScorer(None, "environment")
            elif manager is not None and turns.enable:
                self.reward = MultiTurnScorer(manager, turns.reward)
            data = data_with_tools(config.data, turns)
            # one function for every row (reward.function_path): data_source is optional
            fields_needed = rules and config.reward.function_path is None
            self.loader = builders.rl_loader(data, self.tokenizer, fields_needed)
            self.val_data = (
                builders.val_dataset(data, self.tokenizer, fields_needed)
                if data.val_files
                else None
            )
            check = manager.check_async(builders.check_row(self._check_rows())) if manager else None
            self.build_workers()  # waits for the workers started above, builds the models
            if check is not None:
                check.result()  # e.g. a function the scoring process cannot load
            self.pipeline = async_rollout(self) if config.trainer.async_mode != "off" else None
            self._async_metrics: Metrics = {}
        except BaseException:
            self.shutdown()
            raise

    def worker_classes(self) -> WorkerClasses:
        """Actor (+ reference, critic, reward model as needed) and the rollout."""
        return self._role_classes(), self._rollout_cls()

    def workers_ready(self) -> None:
        """Push the actor's weights to the rollout, put it to sleep (hybrid) and score
        with the new reward-model group (when there is one)."""
        self.roles.sync_weights()
        if self.roles.fused:  # steady state between steps: the rollout sleeps
            self.roles.rollout.sleep()
        turns = self.config.rollout.multi_turn
        if self.roles.has("reward_model") and not (turns.enable and turns.reward == "environment"):
            scorer = RewardModelScorer(self.roles.reward_model)
            self.reward = MultiTurnScorer(scorer, turns.reward) if turns.enable else scorer

    def _role_classes(self) -> dict[str, RayClassWithInitArgs]:
        config = self.config
        rows = config.data.train_batch_size * config.rollout.n
        actor_steps = builders.optimizer_steps(
            self.total_steps, rows, config.actor.ppo_mini_batch_size, config.actor.ppo_epochs
        )
        actor = builders.actor_class(
            config.actor,
            config.trainer,
            rollout_correction=self._rollout_correction,
            run_steps=actor_steps,
        )
        roles = {"actor": actor}
        reference = builders.reference_class(config.actor, config.trainer) if self.use_ref else None
        if reference is not None:
            roles["ref"] = reference
        if self.use_critic:
            assert config.critic is not None  # validated
            critic = config.critic
            critic_steps = builders.optimizer_steps(
                self.total_steps, rows, critic.ppo_mini_batch_size, critic.ppo_epochs
            )
            roles["critic"] = builders.critic_class(critic, config.trainer, critic_steps)
        if config.reward.model is not None:
            roles["reward_model"] = builders.reward_model_class(config.reward.model, config.trainer)
        return roles

    def _rollout_cls(self) -> RayClassWithInitArgs:
        config = self.config
        return builders.rollout_class(config.rollout, config.actor, config.trainer, self.tokenizer)

    def _check_rows(self) -> CollatingDataset:
        """The rows the reward set-up check scores one of: validation, else training."""
        return self.val_data[0] if self.val_data is not None else self.loader.dataset

    # ------------------------------------------------------------------ one step

    def train_step(self, batch: DataProto) -> Metrics:
        """Generate, score, evaluate, estimate advantages, update; returns the step's metrics."""
        metrics: Metrics = {}
        timing: dict[str, float] = {}
        start = time.perf_counter()
        if self.pipeline is not None:  # generated ahead (next_batch): score it
            start -= self._take_generated(batch, metrics, timing)
        else:
            with generation_phase(self.roles, self.config.actor.engine.offload, timing):
                batch = self.sample(batch, metrics, timing)
        if len(batch) == 0:
            logger.warning(
                "step %d: every prompt group scored alike (algorithm.filter_groups); "
                "the update is skipped",
                self.global_step,
            )
            metrics["filter_groups/skipped_update"] = 1.0
            metrics.update(timing_metrics(timing))
            return metrics
        if old_log_probs_from_update(self.config, len(batch)):  # one optimizer step: from it
            batch.meta_info[fields.OLD_LOG_PROBS_FROM_UPDATE] = True
            check_rollout_log_probs(self._rollout_correction, has_rollout_log_probs(batch))
        else:
            with timed("old_log_prob", timing):
                self.old_log_probs(batch, metrics)
            if not self.config.actor.use_rollout_log_probs:  # else old == rollout: no mismatch
                metrics.update(apply_rollout_correction(batch, self._rollout_correction))
        if self.use_ref:
            with timed("ref", timing):
                absorb(batch, self.roles.ref.compute_ref_log_prob(for_worker(batch)), metrics)
        if self.use_critic:
            with timed("values", timing):
                absorb(batch, self.roles.critic.compute_values(for_worker(batch)), metrics)
        with timed("adv", timing):
            metrics.update(self.compute_advantages(batch))
        self.update(batch, metrics, timing)
        step_seconds = time.perf_counter() - start
        timing["step"] = step_seconds
        metrics.update(self.batch_metrics(batch, timing, step_seconds))
        return metrics

    def next_batch(self) -> DataProto:
        """The loader's next batch; in an async mode, the next generated one."""
        if self.pipeline is None:
            return super().next_batch()
        batch, self._async_metrics = self.pipeline.next_batch(self.global_step)
        return batch

    def _take_generated(
        self, batch: DataProto, metrics: Metrics, timing: dict[str, float]
    ) -> float:
        """Score a batch the async pipeline generated; returns the time waited for it."""
        metrics.update(self._async_metrics)
        waited = self._async_metrics.get("async/wait_s", 0.0)
        timing["gen"] = waited
        with timed("reward", timing):
            self.score(batch, metrics)
        return waited

    def sample(self, prompts: DataProto, metrics: Metrics, timing: dict[str, float]) -> DataProto:
        """Generate and score ``prompts``. With ``algorithm.filter_groups``: keep only prompt
        groups whose samples differ, drawing more prompt batches from the loader until there
        are ``data.train_batch_size`` groups (then trimmed to that) or the batch limit is
        reached (then what there is, maybe nothing)."""
        batch = self.generate_and_score(prompts, metrics, timing)
        spec = self.config.algorithm.filter_groups
        if not spec.enable:
            return batch
        target = self.config.data.train_batch_size
        limit = spec.max_num_gen_batches or len(self.loader)
        batch, kept, dropped = keep_varied_groups(batch, spec.metric)
        draws = 1
        while kept < target and draws < limit:
            more = self.generate_and_score(self.loader.next_batch(), metrics, timing, draws)
            more, more_kept, more_dropped = keep_varied_groups(more, spec.metric)
            # the parts' sampling configs differ by their seed only; nothing downstream reads it
            for part in (batch, more):
                part.meta_info.pop(fields.SAMPLING, None)
            batch = DataProto.concat([batch, more])
            kept, dropped, draws = kept + more_kept, dropped + more_dropped, draws + 1
        if 0 < kept < target:
            logger.warning(
                "step %d: %d prompt groups with differing %s after %d batches (target %d); "
                "training on those",
                self.global_step, kept, spec.metric, draws, target,
            )  # fmt: skip
        metrics["filter_groups/kept_groups"] = float(min(kept, target))  # trained on
        metrics["filter_groups/dropped_groups"] = float(dropped)  # all samples alike
        metrics["filter_groups/gen_batches"] = float(draws)
        metrics["filter_groups/short_of_target"] = float(kept < target)
        return first_groups(batch, target) if kept > target else batch

    def generate_and_score(
        self, prompts: DataProto, metrics: Metrics, timing: dict[str, float], draw: int = 0
    ) -> DataProto:
        """Samples of ``prompts`` with their scores (``draw`` counts the step's extra
        prompt batches; it varies the sampling seed)."""
        with timed("gen", timing):
            batch = self.generate(prompts, metrics, draw)
        with timed("reward", timing):
            self.score(batch, metrics)
        return batch

    def generate(self, prompts: DataProto, metrics: Metrics, draw: int = 0) -> DataProto:
        """``rollout.n`` samples per prompt (seeded by the step and ``draw``, so a resumed
        run repeats)."""
        seed = builders.step_seed(self.config.trainer.seed, self.global_step, draw)
        sampling = builders.sampling_config(self.config.rollout, self.tokenizer, seed=seed)
        batch = self._rollout(prompts, sampling, metrics)
        if self.estimator.needs_greedy_baseline:
            tensors(batch)[fields.REWARD_BASELINES] = self.greedy_baseline(prompts, metrics)
        return batch

    def _rollout(self, prompts: DataProto, sampling: SamplingConfig, metrics: Metrics) -> DataProto:
        return generate(self.roles.rollout, prompts, sampling, metrics)

    def old_log_probs(self, batch: DataProto, metrics: Metrics) -> None:
        """The behaviour policy's log-probs: recomputed by the actor, or the rollout's."""
        if self.config.actor.use_rollout_log_probs:
            tensors(batch)[fields.OLD_LOG_PROBS] = tensors(batch)[fields.ROLLOUT_LOG_PROBS]
        else:
            absorb(batch, self.roles.actor.compute_log_prob(for_worker(batch)), metrics)

    def greedy_baseline(self, prompts: DataProto, metrics: Metrics) -> torch.Tensor:
        """ReMax: the score of each prompt's greedy answer, repeated for its ``n`` samples."""
        sampling = builders.sampling_config(self.config.rollout, self.tokenizer, greedy=True)
        greedy = self._rollout(prompts, sampling, {})
        scores = self.reward.score(greedy)
        baseline = tensors(scores)[fields.TOKEN_LEVEL_SCORES].sum(-1)
        metrics["critic/reward_baseline/mean"] = float(baseline.mean())
        return baseline.repeat_interleave(self.config.rollout.n)

    def score(self, batch: DataProto, metrics: Metrics) -> None:
        """``token_level_scores``, then ``token_level_rewards`` (minus a KL penalty if set)."""
        absorb(batch, self.reward.score(batch), metrics)
        if not self.config.algorithm.use_kl_in_reward:
            tensors(batch)[fields.TOKEN_LEVEL_REWARDS] = tensors(batch)[fields.TOKEN_LEVEL_SCORES]

    def compute_advantages(self, batch: DataProto) -> Metrics:
        """Apply the reward KL penalty (if set) and the configured advantage estimator."""
        algorithm = self.config.algorithm
        metrics: Metrics = {}
        if algorithm.use_kl_in_reward:
            _, metrics = apply_kl_penalty(batch, self.kl_ctrl, algorithm.kl_penalty)
        options = {
            "gamma": algorithm.gamma,
            "lam": algorithm.lam,
            "norm_adv_by_std": algorithm.norm_adv_by_std_in_grpo,
        }
        accepted = {k: v for k, v in options.items() if k in self.estimator.hyperparameters}
        compute_advantage(batch, self.estimator, **accepted)
        return metrics

    def update(self, batch: DataProto, metrics: Metrics, timing: dict[str, float]) -> None:
        """Critic then actor updates, then the new weights go to the rollout."""
        if self.use_critic:
            with timed("update_critic", timing):
                update = for_worker(batch, CRITIC_UPDATE_FIELDS)
                absorb(None, self.roles.critic.update_critic(update), metrics)
        with timed("update_actor", timing):
            keys: tuple[str, ...] = ACTOR_UPDATE_FIELDS
            if batch.meta_info.get(fields.OLD_LOG_PROBS_FROM_UPDATE):  # the loss corrects
                keys = (*keys, fields.ROLLOUT_LOG_PROBS)
            update = for_worker(batch, keys)
            absorb(None, self.roles.actor.update_actor(update), metrics)
            rename_prefix(metrics, "actor/rollout_correction/", "rollout_correction/")
        if self.pipeline is None:  # async: the pipeline pushes when its schedule says
            with timed("sync_weights", timing):
                self.roles.sync_weights()

    def batch_metrics(
        self, batch: DataProto, timing: dict[str, float], step_seconds: float
    ) -> Metrics:
        """Data, timing and throughput metrics of the step (verl's names)."""
        metrics = compute_data_metrics(
            batch, self.config.rollout.max_new_tokens, self.config.data.max_prompt_length
        )
        metrics.update(compute_timing_metrics(batch, timing))
        metrics.update(
            compute_throughput_metrics(batch, step_seconds, self.config.trainer.n_workers)
        )
        return metrics

    # ------------------------------------------------------------------ validation

    def validate(self) -> Metrics:
        """Greedy answers on the validation set (``val/score/mean``, ``val/accuracy``,
        ``val/<data_source>/score/mean``), and with ``trainer.val_samples=k`` also ``k``
        sampled answers per prompt at the rollout's temperature (``val/sampled/accuracy``
        = mean@k, ``val/sampled/pass@k``, ``val/sampled/maj@k``)."""
        if self.val_data is None:
            return {}
        greedy = builders.sampling_config(self.config.rollout, self.tokenizer, greedy=True)
        every = len(self.val_data[0]) if self.trainer_config.val_only else 0  # eval: all
        keep = max(self.trainer_config.log_val_generations, every)
        rows = self.val_generations
        if self.pipeline is not None:  # validate the trainer's weights, not the rollout's
            self.pipeline.sync(self.global_step)

        def sample(output: DataProto, scores: torch.Tensor, _: DataProto) -> None:
            if len(rows) < keep:
                rows.extend(generation_rows(output, scores, self._decode, keep - len(rows)))

        answers: list[str] = []

        def vote(output: DataProto, _: torch.Tensor, scored: DataProto) -> None:
            answers.extend(vote_keys(output, scored, self._decode))

        samples = self.trainer_config.val_samples
        with generation_phase(self.roles, self.config.actor.engine.offload, {}):
            scores, sources = score_validation(
                self.roles.rollout, self.reward, self.val_data, greedy, sample if keep else None
            )
            metrics = validation_metrics(scores, sources)
            if samples:
                sampled = builders.sampling_config(
                    self.config.rollout, self.tokenizer, seed=self.global_step, n=samples
                )
                scores, _ = score_validation(
                    self.roles.rollout, self.reward, self.val_data, sampled, vote
                )
                metrics.update(sampled_validation_metrics(scores, samples, answers))
        return metrics

    def _decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    # ------------------------------------------------------------------ state

    def checkpoint_roles(self) -> dict[str, Checkpointable]:
        """The actor, and the critic when there is one."""
        roles: dict[str, Checkpointable] = {"actor": self.roles.actor}
        if self.use_critic:
            roles["critic"] = self.roles.critic
        return roles

    def extra_state(self) -> dict[str, Any]:
        """The KL controller's coefficient; in an async mode, the generations in flight."""
        state: dict[str, Any] = {"kl_ctrl": self.kl_ctrl.state_dict()}
        if self.pipeline is not None:
            state["async"] = self.pipeline.state_dict()
        return state

    def load_extra_state(self, state: dict[str, Any]) -> None:
        """Restore the KL controller and, in an async mode, the generations in flight."""
        if "kl_ctrl" in state:
            self.kl_ctrl.load_state_dict(state["kl_ctrl"])
        if self.pipeline is not None and "async" in state:
            self.pipeline.load_state_dict(state["async"], self.global_step)

    def after_resume(self) -> None:
        """The rollout must generate with the restored weights."""
        self.roles.sync_weights()

    def shutdown(self) -> None:
        """Stop reward processes and workers."""
        reward: RewardScorer | None = getattr(self, "reward", None)  # None if __init__ failed
        if reward is not None:
            reward.close()
        super().shutdown()

    def __enter__(self) -> PPOTrainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def roles_needed(config: RLConfig, estimator: AdvantageEstimator) -> frozenset[str]:
    """The training roles a run of ``config`` builds (the rollout aside); starts nothing.

    ``actor`` always; ``ref`` when a KL term (``actor.use_kl_loss`` or
    ``algorithm.use_kl_in_reward``) reads the reference policy; ``critic`` when ``estimator``
    reads ``values``; ``reward_model`` when ``reward.model`` is set.
    """
    roles = {"actor"}
    if config.reference and (config.actor.use_kl_loss or config.algorithm.use_kl_in_reward):
        roles.add("ref")
    if estimator.needs_critic:
        roles.add("critic")
    if config.reward.model is not None:
        roles.add("reward_model")
    return frozenset(roles)


def async_rollout(trainer: PPOTrainer) -> AsyncRollout:
    """The generation pipeline of ``trainer.async_mode`` (``one_step_off``: depth 1, a push
    every step, no staleness bound; ``fully_async``: the trainer section's settings)."""
    config, tokenizer = trainer.config, trainer.tokenizer
    section = config.trainer
    if section.async_mode == "one_step_off":
        spec = AsyncSpec(depth=1, push_every=1, max_staleness=None)
    else:
        pad = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        )
        spec = AsyncSpec(
            depth=section.queue_size,
            push_every=section.weight_push_every,
            max_staleness=section.max_staleness,
            chunk_tokens=config.rollout.partial_chunk_tokens if config.rollout.partial else None,
            pad_id=int(pad or 0),
        )

    def sampling(index: int, draw: int) -> SamplingConfig:
        seed = builders.step_seed(section.seed, index, draw)  # as generate(): same seeds
        return builders.sampling_config(config.rollout, tokenizer, seed=seed)

    return AsyncRollout(
        spec,
        lambda: trainer.roles,
        trainer.loader.next_batch,
        sampling,
        lambda: trainer.total_steps,
    )


def build_kl_controller(config: RLConfig) -> KLController:
    """The reward-penalty coefficient controller of ``algorithm.kl_ctrl``."""
    ctrl = config.algorithm.kl_ctrl
    if ctrl.type == "adaptive":
        return AdaptiveKLController(ctrl.kl_coef, ctrl.target_kl, ctrl.horizon)
    return FixedKLController(ctrl.kl_coef)
