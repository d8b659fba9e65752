"""What every trainer shares: the step loop, validation cadence, checkpoints, resume, logging.

A trainer subclass supplies ``train_step(batch) -> metrics``, optionally ``validate()``, the
roles to checkpoint and any extra driver state; :meth:`Trainer.fit` does the rest:

    resume if asked -> [validate] -> for each step: train, [validate], [save], log
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hf_algos.checkpoint import (
    Checkpointable,
    CheckpointManager,
    capture_rng_state,
    restore_rng_state,
)
from hf_algos.config.sections import TrainerSection
from hf_algos.data import StatefulDataLoader
from hf_algos.tracking import Tracking
from hf_algos.trainers.roles import RoleGroups
from hf_protocol import DataProto

logger = logging.getLogger(__name__)

Metrics = dict[str, float]


class Trainer:
    """The driver loop over a :class:`~hf_algos.data.StatefulDataLoader`.

    Subclasses set ``self.roles`` (the worker groups) and ``self.loader`` before calling
    :meth:`fit`, and implement :meth:`train_step`.
    """

    roles: RoleGroups
    loader: StatefulDataLoader

    def __init__(self, trainer: TrainerSection, config_dict: dict[str, Any]) -> None:
        self.trainer_config = trainer
        self.config_dict = config_dict
        self.global_step = 0
        self.checkpoints = CheckpointManager(trainer.checkpoint_dir, trainer.max_checkpoints)
        self.tracking: Tracking | None = None
        self.history: list[Metrics] = []
        """Metrics of every step this process ran (what was logged), in order."""

    # ------------------------------------------------------------------ to implement

    def train_step(self, batch: DataProto) -> Metrics:
        """One training step on a batch from the loader; returns its metrics."""
        raise NotImplementedError

    def validate(self) -> Metrics:
        """Metrics on the held-out set (``val/...``); empty when there is none."""
        return {}

    def checkpoint_roles(self) -> dict[str, Checkpointable]:
        """Role name -> group with ``save_checkpoint`` / ``load_checkpoint``."""
        return {"actor": self.roles.actor}

    def extra_state(self) -> dict[str, Any]:
        """Driver state beyond step, loader and RNG (e.g. a KL controller)."""
        return {}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`extra_state` returned."""

    def after_resume(self) -> None:
        """Called after worker state was loaded (e.g. to push weights to the rollout)."""

    # ------------------------------------------------------------------ the loop

    @property
    def total_steps(self) -> int:
        """Steps of the whole run: ``total_training_steps`` or epochs x batches per epoch."""
        configured = self.trainer_config.total_training_steps
        return configured or self.trainer_config.total_epochs * len(self.loader)

    def fit(self) -> list[Metrics]:
        """Train until :attr:`total_steps`; returns the metrics of the steps run here."""
        config = self.trainer_config
        self.tracking = Tracking(
            config.project_name,
            config.experiment_name,
            config.loggers,
            config.log_dir,
            self.config_dict,
        )
        try:
            self.resume()
            if config.val_before_train and self.global_step == 0:
                self.tracking.log(self.validate(), step=0)
            with self._progress() as bar:
                for batch in self._batches():
                    self.global_step += 1
                    metrics = self.train_step(batch)
                    metrics.update(self._periodic())
                    metrics["training/global_step"] = float(self.global_step)
                    self.tracking.log(metrics, step=self.global_step)
                    self.history.append(metrics)
                    bar.update(1)
        finally:
            self.tracking.finish()
        return self.history

    def _batches(self) -> Iterator[DataProto]:
        """Loader batches across epochs until the run's last step.

        One batch at a time from the loader's position, so a step may draw more batches
        itself (:meth:`StatefulDataLoader.next_batch`) and the next step continues after them.
        """
        while self.global_step < self.total_steps:
            yield self.loader.next_batch()

    def _periodic(self) -> Metrics:
        """Validation and checkpoint on their cadence (and at the last step)."""
        config, step = self.trainer_config, self.global_step
        last = step >= self.total_steps
        metrics: Metrics = {}
        if config.test_freq and (step % config.test_freq == 0 or last):
            metrics.update(self.validate())
        if config.save_freq and (step % config.save_freq == 0 or last):
            self.save_checkpoint()
        return metrics

    def _progress(self) -> Any:
        from tqdm import tqdm

        return tqdm(
            total=self.total_steps,
            initial=self.global_step,
            disable=not self.trainer_config.progress_bar,
            desc="steps",
            dynamic_ncols=True,
        )

    # ------------------------------------------------------------------ checkpoints

    def save_checkpoint(self) -> Path:
        """Save workers and driver state at the current step."""
        state = {
            "loader": self.loader.state_dict(),
            "rng": capture_rng_state(),
            "extra": self.extra_state(),
        }
        return self.checkpoints.save(self.global_step, state, self.checkpoint_roles())

    def resume(self) -> None:
        """Continue from a checkpoint as ``trainer.resume_mode`` says (no-op for ``disable``)."""
        config = self.trainer_config
        if config.resume_mode == "disable":
            return
        if config.resume_mode == "path":
            assert config.resume_from is not None  # checked by TrainerSection
            directory: Path | None = Path(config.resume_from)
        else:
            directory = self.checkpoints.latest()
        if directory is None:
            return
        state = self.checkpoints.load(directory, self.checkpoint_roles())
        self.global_step = int(state["global_step"])
        self.loader.load_state_dict(state["loader"])
        restore_rng_state(state["rng"])
        self.load_extra_state(state.get("extra", {}))
        self.after_resume()
        logger.info("resumed from %s at step %d", directory, self.global_step)

    def shutdown(self) -> None:
        """End the worker processes."""
        roles = getattr(self, "roles", None)
        if roles is not None:
            roles.shutdown()
