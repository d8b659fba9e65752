"""DPO: offline on preference pairs, or online (sample ``n``, score, pair best vs worst).

A pair is two adjacent rows (chosen, rejected) of one batch; see :mod:`hf_algos.losses.dpo`.
Offline, one step is::

    batch = next(pairs)                                   # 2 x train_batch_size rows
    batch = batch.union(ref.compute_ref_log_prob(batch))
    actor.update_actor(batch)                             # dpo_loss_fn

Online, the batch comes from the policy itself: generate ``rollout.n`` responses per
prompt, score them, keep the best and the worst of each prompt as a pair, then the same
update, then a weight sync to the rollout.
"""

from __future__ import annotations

import dataclasses
import functools
import time

from hf_algos.config.actor import ActorSection
from hf_algos.config.cross_checks import DPO_MICRO_BATCH_ROWS
from hf_algos.config.keywords import keyword_names, section_kwargs
from hf_algos.config.loading import config_to_dict
from hf_algos.config.root import DPOConfig
from hf_algos.data import (
    PreferenceDataset,
    PreferenceDatasetConfig,
    StatefulDataLoader,
    make_preference_batch,
)
from hf_algos.data.prompts import announce_prompt_format, prompt_options
from hf_algos.data.rl_dataset import rl_loader
from hf_algos.data.tokenizer import load_tokenizer
from hf_algos.losses import dpo_loss_fn
from hf_algos.rewards import RewardManager
from hf_algos.tracking import compute_data_metrics, compute_timing_metrics, timed, timing_metrics
from hf_algos.trainers.lifecycle.trainer import Metrics, Trainer
from hf_algos.trainers.roles.batch_io import (
    MODEL_FIELDS,
    absorb,
    call_group,
    for_worker,
    generate,
    generation_phase,
    tensors,
)
from hf_algos.trainers.roles.sampling import sampling_config, step_seed
from hf_algos.trainers.roles.workers import (
    actor_class_with_loss,
    optimizer_steps,
    reference_class,
    rollout_class,
)
from hf_protocol import DataProto, fields

UPDATE_FIELDS = (*MODEL_FIELDS, fields.REF_LOG_PROB)


def pairs_per_micro_batch(actor: ActorSection) -> ActorSection:
    """``actor`` with whole pairs per micro-batch: an unset ``actor.engine.micro_batch``
    (token packing, which could split a pair) becomes :data:`DPO_MICRO_BATCH_ROWS` rows."""
    micro = actor.engine.micro_batch
    if micro.micro_batch_size is not None or micro.max_tokens is not None:
        return actor
    rows = dataclasses.replace(micro, micro_batch_size=DPO_MICRO_BATCH_ROWS)
    engine = dataclasses.replace(actor.engine, micro_batch=rows)
    return dataclasses.replace(actor, engine=engine)


class DPOTrainer(Trainer[DataProto]):
    """Trains an actor with a DPO loss against a frozen reference copy of itself."""

    def __init__(self, config: DPOConfig) -> None:
        super().__init__(config.trainer, config_to_dict(config))
        self.config = config
        self.online = config.dpo.online
        self.tokenizer = load_tokenizer(config.data, config.actor)
        announce_prompt_format(config.data, self.tokenizer)
        self.reward: RewardManager | None = None

    def start_up(self) -> None:
        """Load the pairs (online: the prompts), then start the actor and reference groups
        (online: and the rollout) and build their models; online, the reward starts last."""
        config = self.config
        if self.online:
            self.loader = rl_loader(config.data, self.tokenizer)
        else:
            self.loader = self._pair_loader(config.data.train_files)
        self.val_pairs = (
            self._pair_dataset(config.data.val_files)
            if config.data.val_files and not self.online
            else None
        )
        loss_fn = functools.partial(
            dpo_loss_fn, **section_kwargs(config.dpo, keyword_names(dpo_loss_fn))
        )
        # Online, the pair count varies per step: one optimizer step takes all of them.
        rows = 2 * (config.data.train_batch_size if self.online else config.dpo.mini_batch_size)
        run_steps = optimizer_steps(
            self.total_steps, 2 * config.data.train_batch_size, rows, row_group_size=2
        )
        actor = actor_class_with_loss(
            pairs_per_micro_batch(config.actor),
            config.trainer,
            loss_fn,
            rows,
            row_group_size=2,
            run_steps=run_steps,
        )
        roles = {"actor": actor}
        reference = reference_class(config.actor, config.trainer)
        if reference is not None:
            roles["ref"] = reference
        self.actor_is_reference = reference is None  # LoRA: the base, adapters off
        rollout = (
            rollout_class(config.rollout, config.actor, config.trainer, self.tokenizer)
            if self.online
            else None
        )
        self.roles = self.start_groups(roles, rollout)
        self.roles.build(self.global_step)  # online: the rollout gets the actor's weights
        if self.online:
            self.reward = RewardManager.from_config(
                config.reward, self.tokenizer, self.loader.dataset
            )

    def _pair_dataset(self, files: tuple[str, ...]) -> PreferenceDataset:
        data = self.config.data
        options = PreferenceDatasetConfig(
            max_prompt_length=data.max_prompt_length,
            max_response_length=self.config.max_response_length,
            overlong_prompts=data.overlong_prompts,
            **prompt_options(data),
        )
        return PreferenceDataset(list(files), self.tokenizer, options)

    def _pair_loader(self, files: tuple[str, ...]) -> StatefulDataLoader:
        data = self.config.data
        return StatefulDataLoader(
            self._pair_dataset(files), data.train_batch_size, data.shuffle, data.seed
        )

    # ------------------------------------------------------------------ one step

    def train_step(self, batch: DataProto) -> Metrics:
        """One DPO update on a batch of pairs (online: on freshly sampled pairs)."""
        metrics: Metrics = {}
        timing: dict[str, float] = {}
        start = time.perf_counter()
        if self.online:  # hybrid placement: the rollout is awake for this block only
            offload = self.config.actor.engine.offload
            with generation_phase(self.roles, offload, timing), timed("gen", timing):
                batch = self.sample_pairs(batch, metrics)
        if len(batch) > 0:
            with timed("ref", timing):
                call_group(self.roles.ref.compute_ref_log_prob, batch, metrics)
            with timed("update_actor", timing):
                update = self.roles.actor.update_actor
                call_group(update, batch, metrics, UPDATE_FIELDS, keep_output=False)
            metrics.update(compute_data_metrics(batch))
        if self.online:
            with timed("sync_weights", timing):
                self.roles.sync_weights()
        timing["step"] = time.perf_counter() - start
        if len(batch) > 0:
            metrics.update(compute_timing_metrics(batch, timing))
        else:  # no pair this step (online, every response scored the same): nothing trained
            metrics.update(timing_metrics(timing))
        return metrics

    def sample_pairs(self, prompts: DataProto, metrics: Metrics) -> DataProto:
        """Online: ``n`` scored samples per prompt -> best/worst pairs (a multiple of the
        worker count, so every rank gets whole pairs)."""
        assert self.reward is not None
        seed = step_seed(self.config.trainer.seed, self.global_step)
        sampling = sampling_config(self.config.rollout, self.tokenizer, seed=seed)
        batch = generate(self.roles.rollout, prompts, sampling, metrics)
        absorb(batch, self.reward.score(batch), metrics)
        scores = tensors(batch)[fields.TOKEN_LEVEL_SCORES].sum(-1)
        metrics.update({f"online/{k}": v for k, v in compute_data_metrics(batch).items()})
        pairs = make_preference_batch(batch, scores)
        workers = self.config.trainer.n_workers
        keep = (len(pairs) // 2 // workers) * workers * 2
        metrics["dpo/pairs"] = float(keep // 2)
        return pairs.slice(0, keep)

    # ------------------------------------------------------------------ validation

    def validate(self) -> Metrics:
        """Offline: implicit-reward accuracy and margin of the policy on held-out pairs."""
        if self.val_pairs is None:
            return {}
        dataset = self.val_pairs
        batch = dataset.collate([dataset[i] for i in range(len(dataset))])
        request = for_worker(batch)
        policy = tensors(self.roles.actor.compute_log_prob(request))[fields.OLD_LOG_PROBS]
        ref = tensors(self.roles.ref.compute_ref_log_prob(request))[fields.REF_LOG_PROB]
        mask = tensors(batch)[fields.RESPONSE_MASK].to(policy.dtype)
        ratio = ((policy - ref) * mask).sum(-1) * self.config.dpo.beta
        margin = ratio[0::2] - ratio[1::2]
        return {
            "val/dpo/reward_accuracy": float((margin > 0).float().mean()),
            "val/dpo/reward_margin": float(margin.mean()),
        }

    def shutdown(self) -> None:
        """Stop reward processes and workers."""
        if self.reward is not None:
            self.reward.close()
        super().shutdown()
