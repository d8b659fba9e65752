"""What every trainer shares: the step loop, validation cadence, checkpoints, resume, logging.

A trainer subclass supplies its start-up (``start_up``: one script that loads its data,
starts its reward and its worker groups, ``self.roles``), ``train_step(batch) -> metrics``
and optionally ``validate()``; what its checkpoints keep beyond the loader, the RNG and the
groups' shards it adds to :attr:`Trainer.run_state`
(:mod:`hf_algos.trainers.lifecycle.run_state`). :meth:`Trainer.fit` does the rest:

    start -> resume if asked -> [validate] -> for each step: train, [validate], [save], log

Each run logs into its own directory (``<log_dir>/<project>/<experiment>/<run id>``, see
:mod:`hf_algos.tracking.run_dir`) with its resolved ``config.yaml``; the run id is saved with
every checkpoint, so a resumed run appends to its own files. An evaluation
(``trainer.val_only``, ``hybridflow eval``) gets a new run directory (``<run id>-eval``) even on
a checkpoint, and writes nothing into the checkpoint's directory or the run that saved it.
``trainer.trace_file`` writes the worker groups' call timeline when ``fit`` ends, and
``trainer.log_val_generations`` logs sample generations at each validation.

With ``trainer.max_restarts=K``, a worker that dies during a step (its process killed, OOM,
a crash) does not end the run: the trainer tears every worker group and its pools down,
builds them again, loads the last checkpoint this run saved or resumed from (or goes back
to the start) and continues; with deterministic settings the run ends as an uninterrupted
one would. After K restarts the next death raises :class:`RestartsExhaustedError`.
"""

from __future__ import annotations

import logging
import multiprocessing
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Generic, Self, TypeVar, cast

from hf_algos.checkpoint import CheckpointManager
from hf_algos.config.trainer import TrainerSection
from hf_algos.data.loader import BatchSource
from hf_algos.run_dirs import CHECKPOINT_KEY, check_writable
from hf_algos.run_identity import check_resume_identity, identity_text, run_identity
from hf_algos.run_lock import RunLock, lock_run_directory
from hf_algos.tracking import CONFIG_FILE, Generation, Tracking, write_config
from hf_algos.tracking.run_dir import new_run_id
from hf_algos.trainers.lifecycle.run_state import RNGState, RunState
from hf_algos.trainers.roles.groups import RoleGroups, build_role_groups
from hf_controller import (
    RayClassWithInitArgs,
    WorkerGroupError,
    export_chrome_trace,
    is_worker_death,
)

logger = logging.getLogger(__name__)

Metrics = dict[str, float]


class RestartsExhaustedError(RuntimeError):
    """A worker died again after the run had used all ``trainer.max_restarts`` restarts."""


def refuse_in_reimported_main() -> None:
    """Refuse to build a trainer while a multiprocessing child re-runs the driver's script.

    Python's ``spawn`` and ``forkserver`` start methods (the reward's scoring processes use
    ``forkserver``) run the main script again in every child before the child's own work,
    so a script that trains at module level, without ``if __name__ == "__main__":``, would
    start a second run, with a Ray of its own, inside each scoring process. This stops it at
    once with the fix; the driver then reports the scoring process's death with the same
    hint. The flag read is the one Python's own check of this mistake reads.
    """
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        raise RuntimeError(
            "a trainer is being built while a child process re-runs the driver's script "
            "(Python's multiprocessing imports the main module in every 'spawn' or "
            "'forkserver' child, such as the reward's scoring processes): put the training "
            'under `if __name__ == "__main__":`'
        )


StepInput = TypeVar("StepInput")
"""What one step trains on (:meth:`Trainer.next_batch` hands it to :meth:`Trainer.train_step`):
a batch of prompts or pairs, or an async pipeline's generated samples."""


class Trainer(Generic[StepInput]):
    """The driver loop over a :class:`~hf_algos.data.loader.BatchSource` (a
    :class:`~hf_algos.data.StatefulDataLoader`, or a curriculum's generated batches).

    Subclasses set ``self.roles`` (the worker groups, one object for the whole run: a
    restart rebuilds the groups inside it) and ``self.loader`` in :meth:`start_up`, and
    implement :meth:`train_step`.
    """

    roles: RoleGroups
    loader: BatchSource
    tokenizer: Any = None
    """The run's tokenizer (subclasses set it); saved with every checkpoint, so
    :func:`hf_algos.export.export_checkpoint` writes it next to the exported model."""
    actor_is_reference: bool = False
    """The actor group serves ``compute_ref_log_prob`` (LoRA: the base model, adapters off)
    instead of a reference group of its own."""

    def __init__(self, trainer: TrainerSection, config_dict: dict[str, Any]) -> None:
        refuse_in_reimported_main()
        self.trainer_config = trainer
        self.config_dict = config_dict
        self.run_state = RunState(  # absolute: Ray workers write their shards into it
            CheckpointManager(
                Path(trainer.resolved_checkpoint_dir).absolute(),
                max_checkpoints=trainer.max_checkpoints,
            )
        )
        """What checkpoints keep and a restart goes back to
        (:mod:`hf_algos.trainers.lifecycle.run_state`): the base keeps the loader's position, the
        RNG and the actor; a trainer adds its own."""
        self.checkpoints = self.run_state.checkpoints
        self.identity = run_identity(config_dict)
        """What this run's checkpoints belong to (:mod:`hf_algos.run_identity`)."""
        self.run_state.identity_record = identity_text(self.identity)
        self._locks: list[RunLock] = []  # the run's directories, held until shutdown
        self._resume_from: Path | None = None  # the checkpoint resume() loads, once checked
        self.tracking: Tracking | None = None
        self.history: list[Metrics] = []
        """Metrics of every step of the run, in order (a step re-run after a restart once)."""
        self.restarts = 0
        """Restarts after a dead worker so far (at most ``trainer.max_restarts``)."""
        self.val_generations: list[Generation] = []
        """Sample generations of the current validation (filled by :meth:`validate`, up to
        ``trainer.log_val_generations``; logged and cleared by the loop)."""
        self._config_saved = False  # config.yaml next to the checkpoints
        self.started = False
        """:meth:`start` ran: the workers, data and reward are up."""

    # ------------------------------------------------------------------ start-up

    def start(self) -> Self:
        """Start the run once: its directories claimed, then the trainer's :meth:`start_up`
        (data, reward, worker groups, the slow parts overlapped), then the run state learns
        the groups, the loader and the RNG. ``with trainer:`` and :meth:`fit` call it; the
        ``hybridflow`` command calls it explicitly. On a failure every worker and process
        started so far is ended before the error propagates."""
        if self.started:
            return self
        try:
            self.claim_directories()
            self.start_up()
        except BaseException:
            self.shutdown()
            raise
        self.run_state.groups = self.roles
        self.run_state.keep("loader", self.loader, core=True)
        self.run_state.keep("rng", RNGState(), core=True)
        self.run_state.tokenizer = self.tokenizer
        self.started = True
        return self

    @property
    def global_step(self) -> int:
        """The last step taken (0 before the first): the run state's."""
        return self.run_state.step

    @global_step.setter
    def global_step(self, step: int) -> None:
        self.run_state.step = step

    @property
    def run_id(self) -> str | None:
        """The run's id (its log directory's name): new, or the resumed checkpoint's."""
        return self.run_state.run_id

    @run_id.setter
    def run_id(self, run_id: str | None) -> None:
        self.run_state.run_id = run_id

    def claim_directories(self) -> None:
        """Before any worker starts: the log and checkpoint directories writable, the
        checkpoint directory locked for this run (:mod:`hf_algos.run_lock`; not for
        ``val_only``, which writes no checkpoint) and the checkpoint a resume would load
        checked to belong to this job (:mod:`hf_algos.run_identity`) and to be whole (its
        manifest; a damaged one is refused or replaced as ``trainer.resume_fallback`` says)."""
        config = self.trainer_config
        check_writable("trainer.log_dir", config.log_dir)
        if not config.val_only:
            check_writable(CHECKPOINT_KEY, self.checkpoints.root)
            self._locks.append(lock_run_directory(self.checkpoints.root, CHECKPOINT_KEY))
        checkpoint = self.checkpoints.to_resume(config.resume_mode, config.resume_from)
        if checkpoint is not None:  # eval may score another experiment's checkpoint
            check_resume_identity(
                checkpoint, self.identity, config.resume_force, not config.val_only
            )
            # eval never renames in a directory it does not hold: a damaged one is refused
            fallback = "refuse" if config.val_only else config.resume_fallback
            checkpoint = self.checkpoints.resumable(checkpoint, fallback)
        self._resume_from = checkpoint

    def start_up(self) -> None:
        """The trainer's start-up, one script that reads top to bottom: its data, its reward
        and its worker groups (:meth:`start_groups`, then ``self.roles.build()``), the slow
        parts overlapped; its docstring says what overlaps what."""
        raise NotImplementedError

    def start_groups(
        self,
        roles: dict[str, RayClassWithInitArgs],
        rollout: RayClassWithInitArgs | None,
        max_replacements: int = 0,
    ) -> RoleGroups:
        """Start the worker groups of ``roles`` (training roles by name, ``actor`` first) and
        ``rollout`` without waiting for them: with Ray their processes start, import and
        construct their classes while the driver goes on. ``RoleGroups.build`` then waits
        and builds the models (:func:`~hf_algos.trainers.roles.groups.build_role_groups`)."""
        return build_role_groups(
            self.trainer_config,
            roles,
            rollout,
            ref_from_actor=self.actor_is_reference,
            block_until_ready=False,
            max_replacements=max_replacements,
        )

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ------------------------------------------------------------------ workers

    def teardown_workers(self) -> None:
        """End every worker process and release the pools' reservations (at shut-down; a
        restart's :meth:`RoleGroups.rebuild` ends the old ones itself)."""
        roles = getattr(self, "roles", None)
        if roles is not None:
            roles.shutdown()

    # ------------------------------------------------------------------ to implement

    def train_step(self, batch: StepInput) -> Metrics:
        """One training step on a batch from the loader; returns its metrics."""
        raise NotImplementedError

    def validate(self) -> Metrics:
        """Metrics on the held-out set (``val/...``); empty when there is none.

        A trainer that generates may append up to ``trainer.log_val_generations`` rows
        (``prompt``, ``response``, ``ground_truth``, ``score``) to :attr:`val_generations`.
        """
        return {}

    # ------------------------------------------------------------------ the loop

    @property
    def total_steps(self) -> int:
        """Steps of the whole run: ``total_training_steps`` or epochs x batches per epoch."""
        configured = self.trainer_config.total_training_steps
        return configured or self.trainer_config.total_epochs * len(self.loader)

    @property
    def run_dir(self) -> Path | None:
        """The run's log directory (``None`` before :meth:`fit` opened it)."""
        return self.tracking.run_dir if self.tracking is not None else None

    @property
    def metrics_path(self) -> Path | None:
        """The run's ``metrics.jsonl`` (``None`` before :meth:`fit` opened the run)."""
        return self.tracking.metrics_path if self.tracking is not None else None

    def fit(self) -> list[Metrics]:
        """Train until :attr:`total_steps`; returns the metrics of the steps run here."""
        self.start()
        config = self.trainer_config
        self.run_state.mark_start()
        self.resume()  # first: a resumed run continues the run id of its checkpoint
        self.tracking = self._open_run()
        if not config.val_only and self.global_step >= self.total_steps:
            print(self._nothing_left_to_train(), flush=True)
        try:
            if config.val_only:
                self.history = [self._validate()]
                self.tracking.log(self.history[0], step=self.global_step)
                return self.history
            if config.val_before_train and self.global_step == 0:
                self.tracking.log(self._validate(), step=0)
            with self._progress() as bar:
                while True:
                    try:
                        self._train_steps(bar)
                        break
                    except Exception as error:
                        if config.max_restarts == 0 or not self._worker_died(error):
                            raise  # the group's own error names group, rank, method, node
                        self._restart(error)
                        bar.n = self.global_step
        finally:
            self._write_trace()
            self.tracking.finish()
        return self.history

    def _open_run(self) -> Tracking:
        """Open the run's directory and loggers; write its resolved ``config.yaml``."""
        config = self.trainer_config
        loggers = config.loggers
        if config.val_only and "jsonl" not in loggers:  # eval always keeps its generations
            loggers = (*loggers, "jsonl")
        tracking = Tracking(
            config.project_name,
            config.experiment_name,
            loggers,
            config.log_dir,
            self.config_dict,
            run_id=f"{new_run_id()}-eval" if config.val_only else self.run_id,
            wandb_mode=config.wandb_mode,
        )
        self.run_id = tracking.run_id
        self._locks.append(lock_run_directory(tracking.run_dir, "the run's log directory"))
        write_config(tracking.run_dir / CONFIG_FILE, self.config_dict)
        resumed = f" (resumed at step {self.global_step})" if self.global_step else ""
        print(f"run {self.run_id}{resumed}: logs and config.yaml in {tracking.run_dir}", flush=True)
        return tracking

    def _nothing_left_to_train(self) -> str:
        """The line of a resumed run whose checkpoint is already at the last step."""
        return (
            f"hybridflow: the checkpoint in {self.checkpoints.root} is at step "
            f"{self.global_step} of {self.total_steps}: nothing left to train. To train more, "
            f"raise trainer.total_training_steps (or total_epochs); to start over, give "
            f"another trainer.experiment_name or trainer.resume_mode=disable"
        )

    def _validate(self) -> Metrics:
        """:meth:`validate`, then log its sample generations (``trainer.log_val_generations``)."""
        self.val_generations = []
        metrics = self.validate()
        config = self.trainer_config
        rows = self.val_generations[: None if config.val_only else config.log_val_generations]
        self.val_generations = []
        if rows and self.tracking is not None:
            self.tracking.log_generations(rows, self.global_step)
        return metrics

    def _write_trace(self) -> None:
        """Write every group's call timings as one Chrome trace (``trainer.trace_file``)."""
        if self.trainer_config.trace_file is None or self.tracking is None:
            return
        path = Path(self.trainer_config.trace_file)
        if not path.is_absolute():
            path = self.tracking.run_dir / path
        roles = getattr(self, "roles", None)
        records = roles.timings() if roles is not None else []
        try:  # at the end of a failed run too: never hide the run's own error behind this
            path.parent.mkdir(parents=True, exist_ok=True)
            export_chrome_trace(records, path)
            print(f"trace of {len(records)} call phases: {path} (open in ui.perfetto.dev)")
        except OSError as error:
            logger.warning("could not write the trace to %s: %s", path, error)

    def _train_steps(self, bar: Any) -> None:
        for batch in self._batches():
            self.global_step += 1
            metrics = self.train_step(batch)
            metrics.update(self._periodic())
            metrics["training/global_step"] = float(self.global_step)
            assert self.tracking is not None
            self.tracking.log(metrics, step=self.global_step)
            self.history.append(metrics)
            bar.update(1)

    def _worker_died(self, error: Exception) -> bool:
        """Whether ``error`` came from a dead worker: it says so, or it is a failed call
        (e.g. a collective whose peer was killed) while a worker of the run is dead."""
        if is_worker_death(error):
            return True
        if not isinstance(error, WorkerGroupError):
            return False
        dead = self.roles.dead_workers()
        if dead:
            logger.warning("%s failed while %s died", error.method, ", ".join(dead))
        return bool(dead)

    def _restart(self, error: Exception) -> None:
        """Tear the groups down, build them again and go back to the last checkpoint."""
        limit = self.trainer_config.max_restarts
        if self.restarts >= limit:
            raise RestartsExhaustedError(
                f"a worker died at step {self.global_step} after the run had used all "
                f"{self.restarts} of its restarts (trainer.max_restarts={limit}): {error}\n"
                f"Fix the cause above, or raise trainer.max_restarts"
            ) from error
        self.restarts += 1
        failed_step = self.global_step
        where = self.run_state.resume_point or "the start (no checkpoint yet)"
        logger.warning(
            "step %d: a worker died (%s); restart %d of %d: re-creating the worker groups "
            "and resuming from %s",
            failed_step, str(error).splitlines()[0], self.restarts, limit, where,
        )  # fmt: skip
        self.roles.rebuild(self.run_state.step)  # the same object: nothing else changes hands
        self.run_state.go_back()
        # the steps after the checkpoint run again; keep each step's metrics once
        self.history = [m for m in self.history if m["training/global_step"] <= self.global_step]
        assert self.tracking is not None
        restart_metrics = {
            "trainer/restarts": float(self.restarts),
            "trainer/restart_failed_step": float(failed_step),
            "trainer/restart_resumed_step": float(self.global_step),
        }
        self.tracking.log(restart_metrics, step=self.global_step)

    def _batches(self) -> Iterator[StepInput]:
        """Loader batches across epochs until the run's last step.

        One batch at a time from the loader's position, so a step may draw more batches
        itself (:meth:`StatefulDataLoader.next_batch`) and the next step continues after them.
        """
        while self.global_step < self.total_steps:
            yield self.next_batch()

    def next_batch(self) -> StepInput:
        """The next step's input: the loader's next batch (PPO's async modes hand out
        samples generated ahead instead, :mod:`hf_algos.trainers.async_rollout.pipeline`)."""
        return cast(StepInput, self.loader.next_batch())

    def _periodic(self) -> Metrics:
        """Validation and checkpoint on their cadence (and at the last step)."""
        config, step = self.trainer_config, self.global_step
        last = step >= self.total_steps
        metrics: Metrics = {}
        if config.test_freq and (step % config.test_freq == 0 or last):
            metrics.update(self._validate())
        periodic = bool(config.save_freq) and step % config.save_freq == 0
        if periodic or (last and (config.save_freq or config.save_final)):
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
        """Save workers and driver state at the current step (:meth:`RunState.save`)."""
        directory = self.run_state.save()
        if not self._config_saved:  # the config the checkpoints were trained with
            write_config(self.checkpoints.root / CONFIG_FILE, self.config_dict)
            self._config_saved = True
        return directory

    def resume(self) -> None:
        """Continue from a checkpoint as ``trainer.resume_mode`` says (no-op for ``disable``).

        Stale temporary directories of saves that never finished are removed first. A
        damaged checkpoint (against its manifest) is refused or replaced by the newest
        earlier good one, as ``trainer.resume_fallback`` says.
        """
        if self._locks:  # only the run that holds the directory may delete in it
            self.checkpoints.remove_stale()
        directory = self._resume_from  # checked by claim_directories
        if directory is None:
            return
        self.run_state.load(directory)
        logger.info("resumed from %s at step %d", directory, self.global_step)

    def shutdown(self) -> None:
        """End the worker processes; release the run's directories."""
        try:
            self.teardown_workers()
        finally:
            while self._locks:
                self._locks.pop().release()
