"""PPO and its critic-free relatives (GRPO, RLOO, REINFORCE++, ReMax): one driver.

:meth:`PPOTrainer.train_step` is the whole algorithm, top to bottom (docs/architecture.md,
"Data flow of one PPO step")::

    batch = rollout.generate_sequences(prompts)          # 1. n samples per prompt
    batch = batch.union(reward(batch))                   #    token_level_scores
    batch = keep groups whose samples differ             #    DAPO, when asked
    loader.observe(scores of batch)                      #    a curriculum may advance
    batch = batch.union(actor.compute_log_prob(batch))   # 2. old_log_probs (*)
    batch = batch.union(ref.compute_ref_log_prob(batch)) # 3. when a KL term needs it
    batch = batch.union(critic.compute_values(batch))    #    gae only
    batch = compute_advantage(batch, estimator)          # 4. pure functions
    critic.update_critic(batch); actor.update_actor(batch)  # 5.
    sync actor weights -> rollout                        # 6. in-process when hybrid

(*) Unless the update is one optimizer step over the batch (``ppo_epochs=1``, one
mini-batch): then the actor's loss takes them from that step's own forward, detached, and
applies the rollout correction there (:func:`old_log_probs_source`, chosen once per run).

Around the step sit small modules: :mod:`~hf_algos.trainers.roles.batch_io` (what goes to and
comes back from the worker groups, and the hybrid placement's memory phases around
generation), :mod:`~hf_algos.trainers.ppo.dynamic_sampling` (``algorithm.filter_groups``: more
prompt batches until ``data.train_batch_size`` groups whose samples differ are in hand) and
:mod:`~hf_algos.trainers.ppo.evaluation`.

With ``trainer.async_mode`` ``one_step_off`` or ``fully_async`` line 1 moves out of the
step: :class:`~hf_algos.trainers.async_rollout.pipeline.AsyncRollout` keeps generations
queued on the rollout's own processes and :meth:`PPOTrainer.next_batch` hands out the
oldest finished one
(weights pushed on its schedule, stale groups generated again; docs/async.md).

The estimator's registry entry decides the rest: one that reads ``values`` (``gae``) gets a
critic, one that reads ``reward_baselines`` (``remax``) a greedy rollout whose score is the
baseline, the others need nothing more.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict
from typing import Literal

import torch

from hf_algos.advantages import compute_advantage
from hf_algos.advantages.registry import AdvantageEstimator, get_advantage_estimator
from hf_algos.config.correction import RolloutCorrectionSection
from hf_algos.config.keywords import section_kwargs
from hf_algos.config.loading import config_to_dict
from hf_algos.config.root import RLConfig
from hf_algos.data.curriculum_loader import curriculum_loader
from hf_algos.data.loader import CollatingDataset, first_row
from hf_algos.data.prompts import announce_prompt_format
from hf_algos.data.rl_dataset import rl_loader, val_dataset
from hf_algos.data.tokenizer import load_tokenizer
from hf_algos.kl import (
    AdaptiveKLController,
    FixedKLController,
    KLController,
    apply_kl_penalty,
    penalized_rewards,
)
from hf_algos.losses.rollout_correction import compute_rollout_correction
from hf_algos.rewards import RewardManager, RewardModelScorer
from hf_algos.tracking import (
    compute_step_metrics,
    timed,
    timing_metrics,
)
from hf_algos.trainers.async_rollout.pipeline import AsyncRollout, AsyncSpec, GeneratedSamples
from hf_algos.trainers.lifecycle.trainer import Metrics, Trainer
from hf_algos.trainers.ppo.dynamic_sampling import sample_varied_groups
from hf_algos.trainers.ppo.evaluation import (
    generation_rows,
    sampled_validation_metrics,
    score_validation,
    validation_metrics,
    vote_keys,
)
from hf_algos.trainers.ppo.multiturn import MultiTurnScorer, data_with_tools
from hf_algos.trainers.roles.batch_io import (
    MODEL_FIELDS,
    absorb,
    call_group,
    generate,
    generation_phase,
    rename_prefix,
    tensors,
)
from hf_algos.trainers.roles.protocols import RewardScorer
from hf_algos.trainers.roles.sampling import sampling_config, step_seed
from hf_algos.trainers.roles.self_healing import RolloutReplacement
from hf_algos.trainers.roles.workers import (
    actor_class,
    critic_class,
    optimizer_steps,
    reference_class,
    reward_model_class,
    rollout_class,
)
from hf_controller import ConfigurationError, RayClassWithInitArgs
from hf_protocol import DataProto, fields
from hf_protocol.routing import ROUTED_EXPERTS
from hf_rollout import SamplingConfig

logger = logging.getLogger(__name__)

OldLogProbs = Literal["update", "rollout", "actor"]
"""Where ``old_log_probs`` come from: the update's own forward, the rollout, or a forward of
the actor before the update (:func:`old_log_probs_source`)."""

ACTOR_UPDATE_FIELDS = (
    *MODEL_FIELDS,
    fields.OLD_LOG_PROBS,
    fields.ADVANTAGES,
    fields.REF_LOG_PROB,
    fields.ROLLOUT_IS_WEIGHTS,
)
CRITIC_UPDATE_FIELDS = (*MODEL_FIELDS, fields.VALUES, fields.RETURNS)


class PPOTrainer(Trainer[DataProto | GeneratedSamples]):
    """Builds the worker groups of an :class:`~hf_algos.config.RLConfig` and trains.

    ``with PPOTrainer(config) as trainer: trainer.fit()`` runs the whole job: constructing
    it checks the config and loads the tokenizer, :meth:`start` (called by ``with`` and
    :meth:`fit`) starts the workers, data and reward (:meth:`start_up`), and leaving the
    block ends them (:meth:`shutdown`).
    """

    def __init__(self, config: RLConfig) -> None:
        super().__init__(config.trainer, config_to_dict(config))
        self.config = config
        self.tokenizer = load_tokenizer(config.data, config.actor)
        announce_prompt_format(config.data, self.tokenizer)
        self.kl_ctrl = build_kl_controller(config)
        # "auto": TIS when the samples are off-policy (an async mode), else off
        algorithm, async_mode = config.algorithm, config.trainer.async_mode
        self._rollout_correction = algorithm.rollout_correction.resolved(async_mode)
        self.estimator = get_advantage_estimator(config.algorithm.adv_estimator)
        # gamma, lam, norm_adv_by_std: the section's fields the estimator takes, by name
        self.estimator_options = section_kwargs(config.algorithm, self.estimator.hyperparameters)
        needed = roles_needed(config, self.estimator)
        self.use_critic = "critic" in needed
        self.use_ref = "ref" in needed
        self.actor_is_reference = self.use_ref and config.actor.lora.enabled
        self.old_log_probs: OldLogProbs = old_log_probs_source(config)
        """Where each step's ``old_log_probs`` come from, chosen once for the run."""
        self.reward: RewardScorer
        self.pipeline: AsyncRollout | None = None

    def start_up(self) -> None:
        """Start the run, top to bottom, the slow parts overlapped:

        1. the reward's scoring process starts and imports the reward function (one that
           cannot be loaded fails here, within seconds, before any worker starts);
        2. the data loads (the run's length, and with it the workers' LR schedules, may be
           its epochs);
        3. the worker groups start: with Ray their processes start, import torch and build
           their classes in the background (the ``hybridflow`` command started Ray and the
           processes even earlier), while 4. the scoring process scores one row;
        5. the workers build their models and the rollout gets the actor's weights (a
           reward model, when there is one, scores);
        6. in an async mode, the generation pipeline starts;
        7. the run state learns what checkpoints keep beyond the groups' shards, the loader
           and the RNG: the KL controller's coefficient and the generations in flight.
        """
        config, turns = self.config, self.config.rollout.multi_turn
        env_only = turns.enable and turns.reward == "environment"  # no reward function runs
        rules = config.reward.model is None and not env_only  # data_source, ground truth
        manager = RewardManager.from_config(config.reward, self.tokenizer) if rules else None
        if manager is not None:  # 1.
            self.reward = manager  # closed by shutdown(), whatever fails next
            manager.start()
        data = data_with_tools(config.data, turns)  # 2.
        fields_needed = rules and config.reward.function_path is None  # else one function
        if data.curriculum is not None:  # prompts generated as the model learns
            self.loader = curriculum_loader(data, self.tokenizer)
        else:
            self.loader = rl_loader(data, self.tokenizer, fields_needed)
        self.val_data = val_dataset(data, self.tokenizer, fields_needed) if data.val_files else None
        roles, rollout = self._role_classes(), self._rollout_cls()  # 3.
        self.roles = self.start_groups(roles, rollout, config.rollout.max_replacements)
        check = manager.check_async(first_row(self._check_rows())) if manager else None  # 4.
        self.roles.build(self.global_step)  # 5. waits for the processes started above
        if check is not None:
            check.result()  # e.g. a function the scoring process cannot load
        model = config.reward.model is not None and not env_only
        scorer = RewardModelScorer(self.roles.current("reward_model")) if model else manager
        if turns.enable:
            self.reward = MultiTurnScorer(scorer, turns.reward)
        else:
            assert scorer is not None  # a reward function or a reward model (validated)
            self.reward = scorer
        if config.trainer.async_mode != "off":  # 6.
            self.pipeline = async_rollout(self)
            self.run_state.keep("async", self.pipeline.in_flight(self.run_state))
        self.run_state.keep("kl_ctrl", self.kl_ctrl)  # 7.

    @property
    def replacement(self) -> RolloutReplacement:
        """The separate placement's rollout recovery and its counts (``roles.recovery``)."""
        return self.roles.recovery

    def _role_classes(self) -> dict[str, RayClassWithInitArgs]:
        config = self.config
        rows = config.data.train_batch_size * config.rollout.n
        actor_steps = optimizer_steps(
            self.total_steps, rows, config.actor.ppo_mini_batch_size, config.actor.ppo_epochs
        )
        actor = actor_class(
            config.actor,
            config.trainer,
            rollout_correction=self._rollout_correction,
            run_steps=actor_steps,
        )
        roles = {"actor": actor}
        reference = reference_class(config.actor, config.trainer) if self.use_ref else None
        if reference is not None:
            roles["ref"] = reference
        if self.use_critic:
            assert config.critic is not None  # validated
            critic = config.critic
            critic_steps = optimizer_steps(
                self.total_steps, rows, critic.ppo_mini_batch_size, critic.ppo_epochs
            )
            roles["critic"] = critic_class(critic, config.trainer, critic_steps)
        if config.reward.model is not None:
            roles["reward_model"] = reward_model_class(config.reward.model, config.trainer)
        return roles

    def _rollout_cls(self) -> RayClassWithInitArgs:
        config = self.config
        return rollout_class(config.rollout, config.actor, config.trainer, self.tokenizer)

    def _check_rows(self) -> CollatingDataset:
        """The rows the reward set-up check scores one of: validation, else training."""
        return self.val_data[0] if self.val_data is not None else self.loader.dataset

    # ------------------------------------------------------------------ one step

    def train_step(self, prompts: DataProto | GeneratedSamples) -> Metrics:
        """One step on a batch of prompts, top to bottom: generate and score (the hybrid
        placement's rollout awake only for that), keep the groups that differ (DAPO), then
        :meth:`learn`. An async mode's pipeline hands over samples it generated ahead
        instead: :meth:`train_on_samples`. Returns the step's metrics."""
        if isinstance(prompts, GeneratedSamples):
            return self.train_on_samples(prompts)
        config = self.config
        metrics: Metrics = {}
        timing: dict[str, float] = {}
        start = time.perf_counter()
        with generation_phase(self.roles, config.actor.engine.offload, timing):
            batch = self.sample_and_score(prompts, metrics, timing)
            if config.algorithm.filter_groups.enable:  # DAPO: groups whose samples differ
                batch, filtered = sample_varied_groups(
                    batch,
                    lambda draw: self.sample_and_score(
                        self.loader.next_batch(), metrics, timing, draw
                    ),
                    config.algorithm.filter_groups,
                    config.data.train_batch_size,
                    len(self.loader),
                    self.global_step,
                )
                metrics.update(filtered)
        # the scores back to the prompts' source: a curriculum (data.curriculum) may advance
        metrics.update(self.loader.observe(sample_scores(batch)))
        return self.learn(batch, metrics, timing, start)

    def train_on_samples(self, samples: GeneratedSamples) -> Metrics:
        """One async step: the pipeline's samples (generated ahead on the rollout's own
        processes, :mod:`~hf_algos.trainers.async_rollout.pipeline`), scored, then
        :meth:`learn`. The time waited for them counts as the step's generation time."""
        metrics: Metrics = dict(samples.metrics)
        timing = {"gen": samples.waited_s}
        start = time.perf_counter() - samples.waited_s
        with timed("reward", timing):
            self.score(samples.batch, metrics)
        return self.learn(samples.batch, metrics, timing, start)

    def learn(
        self, batch: DataProto, metrics: Metrics, timing: dict[str, float], start: float
    ) -> Metrics:
        """From scored samples to new weights: old log-probs, reference and values,
        advantages, updates, the weights to the rollout. Returns the step's metrics."""
        config, roles, correction = self.config, self.roles, self._rollout_correction
        if len(batch) == 0:
            return self.skipped_update(metrics, timing)
        assert batch.batch is not None, "generated samples hold tensors"
        data = batch.batch

        # 2. The behaviour policy's log-probs (chosen once, at construction), and the
        #    rollout correction against them.
        if self.old_log_probs == "update":  # one optimizer step: the update's own forward
            batch.meta_info[fields.OLD_LOG_PROBS_FROM_UPDATE] = True
            check_rollout_log_probs(correction, has_rollout_log_probs(batch))
        elif self.old_log_probs == "rollout":  # old == rollout: nothing to correct
            with timed("old_log_prob", timing):
                data[fields.OLD_LOG_PROBS] = data[fields.ROLLOUT_LOG_PROBS]
        else:
            with timed("old_log_prob", timing):
                keys = self._actor_fields(batch, MODEL_FIELDS)
                call_group(roles.actor.compute_log_prob, batch, metrics, keys)
            metrics.update(apply_rollout_correction(batch, correction))

        # 3. The reference policy's log-probs (a KL term reads them) and the critic's values.
        if self.use_ref:
            with timed("ref", timing):
                call_group(roles.ref.compute_ref_log_prob, batch, metrics)
        if self.use_critic:
            with timed("values", timing):
                call_group(roles.critic.compute_values, batch, metrics)

        # 4. Rewards (the scores, minus the reward's KL penalty if set), then advantages:
        #    pure functions of the batch.
        with timed("adv", timing):
            if config.algorithm.use_kl_in_reward:  # token_level_kl_penalty, its own field
                metrics.update(self.kl_penalty(batch))
            data[fields.TOKEN_LEVEL_REWARDS] = penalized_rewards(batch)
            compute_advantage(batch, self.estimator, **self.estimator_options)

        # 5. Critic and actor updates; 6. the new weights to the rollout.
        self.update(batch, metrics, timing)
        if self.pipeline is None:  # async: the pipeline pushes when its schedule says
            with timed("sync_weights", timing):
                roles.sync_weights(self.global_step)  # self-healing (separate placement)
        if not roles.fused:
            metrics.update(roles.recovery.metrics())

        timing["step"] = time.perf_counter() - start
        lengths = config.rollout.max_new_tokens, config.data.max_prompt_length
        metrics.update(compute_step_metrics(batch, timing, config.trainer.n_workers, *lengths))
        return metrics

    def next_batch(self) -> DataProto | GeneratedSamples:
        """The loader's next batch of prompts; in an async mode, the pipeline's next
        generated samples."""
        if self.pipeline is None:
            return super().next_batch()
        return self.pipeline.next_batch(self.global_step)

    def skipped_update(self, metrics: Metrics, timing: dict[str, float]) -> Metrics:
        """The metrics of a step whose every prompt group scored alike (dynamic sampling):
        nothing to train on, the update is skipped."""
        logger.warning(
            "step %d: every prompt group scored alike (algorithm.filter_groups); "
            "the update is skipped",
            self.global_step,
        )
        metrics["filter_groups/skipped_update"] = 1.0
        metrics.update(timing_metrics(timing))
        return metrics

    def sample_and_score(
        self, prompts: DataProto, metrics: Metrics, timing: dict[str, float], draw: int = 0
    ) -> DataProto:
        """Samples of ``prompts`` with their scores (``draw`` counts the step's extra
        prompt batches; it varies the sampling seed)."""
        with timed("gen", timing):
            batch = self.sample(prompts, metrics, draw)
        with timed("reward", timing):
            self.score(batch, metrics)
        return batch

    def sample(self, prompts: DataProto, metrics: Metrics, draw: int = 0) -> DataProto:
        """``rollout.n`` samples per prompt (seeded by the step and ``draw``, so a resumed
        run repeats); ReMax adds the greedy answer's score as each sample's baseline."""
        seed = step_seed(self.config.trainer.seed, self.global_step, draw)
        sampling = sampling_config(self.config.rollout, self.tokenizer, seed=seed)
        batch = generate(self.roles.rollout, prompts, sampling, metrics)
        if self.estimator.needs_greedy_baseline:
            tensors(batch)[fields.REWARD_BASELINES] = self.greedy_baseline(prompts, metrics)
        return batch

    def greedy_baseline(self, prompts: DataProto, metrics: Metrics) -> torch.Tensor:
        """ReMax: the score of each prompt's greedy answer, repeated for its ``n`` samples."""
        sampling = sampling_config(self.config.rollout, self.tokenizer, greedy=True)
        greedy = generate(self.roles.rollout, prompts, sampling, {})
        scores = self.reward.score(greedy)
        baseline = tensors(scores)[fields.TOKEN_LEVEL_SCORES].sum(-1)
        metrics["critic/reward_baseline/mean"] = float(baseline.mean())
        return baseline.repeat_interleave(self.config.rollout.n)

    def score(self, batch: DataProto, metrics: Metrics) -> None:
        """``token_level_scores`` of every sample (the reward's only output)."""
        absorb(batch, self.reward.score(batch), metrics)

    def kl_penalty(self, batch: DataProto) -> Metrics:
        """``token_level_kl_penalty``: the reward's KL penalty against the reference
        (``algorithm.use_kl_in_reward``); the controller adapts its coefficient."""
        _, metrics = apply_kl_penalty(
            batch, self.kl_ctrl, kl_penalty=self.config.algorithm.kl_penalty
        )
        return metrics

    def _actor_fields(self, batch: DataProto, keys: tuple[str, ...]) -> tuple[str, ...]:
        """``keys``, plus the rollout's ``routed_experts`` with ``actor.router_replay``."""
        if not self.config.actor.router_replay:
            return keys
        if ROUTED_EXPERTS not in tensors(batch).keys():  # noqa: SIM118 (a TensorDict)
            raise ConfigurationError(
                "actor.router_replay=true but the rollout recorded no routed_experts; it is "
                "recorded by rollout.backend=native for mixture-of-experts models with "
                "rollout.prefix_cache_rows=0 (set actor.router_replay=false otherwise)"
            )
        return (*keys, ROUTED_EXPERTS)

    def update(self, batch: DataProto, metrics: Metrics, timing: dict[str, float]) -> None:
        """The critic's update, then the actor's (each a worker-group call)."""
        if self.use_critic:
            with timed("update_critic", timing):
                update_critic = self.roles.critic.update_critic
                call_group(update_critic, batch, metrics, CRITIC_UPDATE_FIELDS, keep_output=False)
        with timed("update_actor", timing):
            keys: tuple[str, ...] = ACTOR_UPDATE_FIELDS
            if self.old_log_probs == "update":  # the loss applies the correction
                keys = (*keys, fields.ROLLOUT_LOG_PROBS)
            keys = self._actor_fields(batch, keys)
            call_group(self.roles.actor.update_actor, batch, metrics, keys, keep_output=False)
            rename_prefix(metrics, "actor/rollout_correction/", "rollout_correction/")

    # ------------------------------------------------------------------ validation

    def validate(self) -> Metrics:
        """Greedy answers on the validation set (``val/score/mean``, ``val/accuracy``,
        ``val/<data_source>/score/mean``), and with ``trainer.val_samples=k`` also ``k``
        sampled answers per prompt at the rollout's temperature (``val/sampled/accuracy``
        = mean@k, ``val/sampled/pass@k``, ``val/sampled/maj@k``)."""
        if self.val_data is None:
            return {}
        greedy = sampling_config(self.config.rollout, self.tokenizer, greedy=True)
        every = len(self.val_data[0]) if self.trainer_config.val_only else 0  # eval: all
        keep = max(self.trainer_config.log_val_generations, every)
        rows = self.val_generations
        if self.pipeline is not None:  # validate the trainer's weights, not the rollout's
            self.pipeline.sync(self.global_step)

        def keep_rows(output: DataProto, scores: torch.Tensor, _: DataProto) -> None:
            if len(rows) < keep:
                rows.extend(generation_rows(output, scores, self._decode, keep - len(rows)))

        answers: list[str] = []

        def vote(output: DataProto, _: torch.Tensor, scored: DataProto) -> None:
            answers.extend(vote_keys(output, scored, self._decode))

        samples = self.trainer_config.val_samples
        with generation_phase(self.roles, self.config.actor.engine.offload, {}):
            scores, sources = score_validation(
                self.roles.rollout, self.reward, self.val_data, greedy, keep_rows if keep else None
            )
            metrics = validation_metrics(scores, sources)
            if samples:
                sampled = sampling_config(
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

    def shutdown(self) -> None:
        """Stop reward processes and workers."""
        reward: RewardScorer | None = getattr(self, "reward", None)  # None if __init__ failed
        if reward is not None:
            reward.close()
        super().shutdown()


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


def sample_scores(batch: DataProto) -> list[float]:
    """Each sample's score: its ``token_level_scores`` summed over the response (none for
    an empty batch: dynamic sampling kept no group)."""
    if len(batch) == 0:
        return []
    return tensors(batch)[fields.TOKEN_LEVEL_SCORES].sum(-1).tolist()


def async_rollout(trainer: PPOTrainer) -> AsyncRollout:
    """The generation pipeline of ``trainer.async_mode`` (``one_step_off``: depth 1, a push
    every step, no staleness bound; ``fully_async``: the trainer section's settings)."""
    config, tokenizer = trainer.config, trainer.tokenizer
    section = config.trainer
    if section.async_mode == "one_step_off":
        spec = AsyncSpec(queue_size=1, weight_push_every=1, max_staleness=None)
    else:
        pad = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        )
        spec = AsyncSpec(
            queue_size=section.queue_size,
            weight_push_every=section.weight_push_every,
            max_staleness=section.max_staleness,
            partial_chunk_tokens=config.rollout.partial_chunk_tokens
            if config.rollout.partial
            else None,
            pad_id=int(pad or 0),
        )

    def sampling(index: int, draw: int) -> SamplingConfig:
        seed = step_seed(section.seed, index, draw)  # as generate(): same seeds
        return sampling_config(config.rollout, tokenizer, seed=seed)

    return AsyncRollout(
        spec,
        trainer.roles,
        trainer.loader.next_batch,
        sampling,
        trainer.total_steps,
    )


def old_log_probs_source(config: RLConfig) -> OldLogProbs:
    """Where a run's ``old_log_probs`` come from, decided once from its config.

    ``update``: when every step's update is exactly one optimizer step over the whole batch
    (``ppo_epochs=1`` and ``ppo_mini_batch_size`` at least the step's ``train_batch_size x
    rollout.n`` rows), the log-probs a separate no-grad forward would compute equal that
    step's own forward, detached: the driver skips the forward
    (``actor.old_log_probs_from_update``, on by default). Not when they come from the
    rollout (``rollout``: ``actor.use_rollout_log_probs``) or are needed before the update
    (the reward's KL penalty, ``algorithm.use_kl_in_reward``). Otherwise ``actor``: the
    actor's own forward before the update.
    """
    actor = config.actor
    if actor.use_rollout_log_probs:
        return "rollout"
    rows = config.data.train_batch_size * config.rollout.n  # dynamic sampling: at most
    one_step = actor.ppo_epochs == 1 and rows <= actor.ppo_mini_batch_size
    if actor.old_log_probs_from_update and one_step and not config.algorithm.use_kl_in_reward:
        return "update"
    return "actor"


def apply_rollout_correction(batch: DataProto, settings: RolloutCorrectionSection) -> Metrics:
    """Compare ``old_log_probs`` with ``rollout_log_probs`` over the whole step's batch:
    returns the ``rollout_correction/*`` metrics and, when ``settings.mode`` is not ``off``,
    writes the per-token ``rollout_is_weights`` the actor's policy loss multiplies by.

    Call it after ``old_log_probs`` are in the batch (recomputed by the actor), with the
    section resolved for the run's async mode (``RolloutCorrectionSection.resolved``). A batch
    without ``rollout_log_probs`` has nothing to compare: no metrics, and an error when a
    correction is asked for.
    """
    if not has_rollout_log_probs(batch):
        check_rollout_log_probs(settings, present=False)
        return {}
    data = tensors(batch)
    correction = compute_rollout_correction(
        data[fields.OLD_LOG_PROBS],
        data[fields.ROLLOUT_LOG_PROBS],
        data[fields.RESPONSE_MASK],
        **asdict(settings),
    )
    if settings.enabled:
        data[fields.ROLLOUT_IS_WEIGHTS] = correction.weights
    return correction.metrics


def check_rollout_log_probs(settings: RolloutCorrectionSection, present: bool) -> None:
    """Refuse a correction (``tis`` / ``mis``) when the rollout wrote no log-probs."""
    if settings.enabled and not present:
        raise KeyError(
            f"algorithm.rollout_correction.mode={settings.mode!r} needs the rollout's "
            f"'{fields.ROLLOUT_LOG_PROBS}' in the batch, and this rollout wrote none; use "
            "a rollout backend that returns log-probs or set the mode to off"
        )


def has_rollout_log_probs(batch: DataProto) -> bool:
    """Whether the rollout wrote its own log-probs into ``batch``."""
    return batch.batch is not None and fields.ROLLOUT_LOG_PROBS in batch.batch


def build_kl_controller(config: RLConfig) -> KLController:
    """The reward-penalty coefficient controller of ``algorithm.kl_ctrl``."""
    ctrl = config.algorithm.kl_ctrl
    if ctrl.type == "adaptive":
        return AdaptiveKLController(
            kl_coef=ctrl.kl_coef, target_kl=ctrl.target_kl, horizon=ctrl.horizon
        )
    return FixedKLController(ctrl.kl_coef)
