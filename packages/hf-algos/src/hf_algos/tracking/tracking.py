"""``Tracking``: one object that fans a step's metrics out to every configured logger."""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from os import PathLike
from pathlib import Path
from typing import Any

from hf_algos.tracking.loggers import LOGGERS, Generation, Logger, RunInfo
from hf_algos.tracking.run_dir import METRICS_FILE, new_run_id, run_dir


class Tracking:
    """Sends metrics to the loggers named in ``loggers`` (keys of :data:`LOGGERS`).

    The run gets its own directory ``<log_dir>/<project>/<experiment>/<run_id>``
    (:attr:`run_dir`): a new ``run_id`` unless one is given, so a run never appends to an
    earlier run's files; pass the id of the run being resumed to continue its files.

    An unknown name is an error listing the registered ones. A logger whose optional
    package is missing (wandb, mlflow) is skipped with a warning that says what to install,
    unless ``strict=True``.
    """

    def __init__(
        self,
        project: str,
        experiment: str,
        loggers: Sequence[str] = ("console",),
        log_dir: str | PathLike[str] = "outputs/logs",
        config: Mapping[str, Any] | None = None,
        strict: bool = False,
        run_id: str | None = None,
        wandb_mode: str = "auto",
    ) -> None:
        unknown = [name for name in loggers if name not in LOGGERS]
        if unknown:
            raise ValueError(
                f"unknown logger(s) {unknown}; choose from {sorted(LOGGERS)} "
                "(or add one with hf_algos.tracking.register_logger)"
            )
        self.run_id = run_id or new_run_id()
        """The run's id: the name of its directory (and its W&B run id)."""
        self.run_dir = run_dir(log_dir, project, experiment, self.run_id)
        """The run's own directory of file logs."""
        run = RunInfo(
            project,
            experiment,
            self.run_dir,
            dict(config or {}),
            run_id=self.run_id,
            root_dir=Path(log_dir),
            wandb_mode=wandb_mode,
            resumed=run_id is not None,
        )
        self.loggers: dict[str, Logger] = {}
        for name in dict.fromkeys(loggers):
            try:
                self.loggers[name] = LOGGERS[name](run)
            except ImportError as error:
                if strict:
                    raise
                warnings.warn(f"skipping logger {name!r}: {error}", stacklevel=2)

    @property
    def metrics_path(self) -> Path:
        """The run's ``metrics.jsonl`` (written when the ``jsonl`` logger is on)."""
        return self.run_dir / METRICS_FILE

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Record ``metrics`` for ``step`` in every logger (values converted to float)."""
        clean = {name: float(value) for name, value in metrics.items()}
        for logger in self.loggers.values():
            logger.log(clean, step)

    def log_generations(self, rows: list[Generation], step: int) -> None:
        """Record sample generations in every logger that can show them (a table in W&B,
        MLflow and TensorBoard, ``generations.jsonl``, short console lines)."""
        if not rows:
            return
        for logger in self.loggers.values():
            log_generations = getattr(logger, "log_generations", None)
            if log_generations is not None:
                log_generations(rows, step)

    def finish(self) -> None:
        """Close every logger (safe to call twice)."""
        loggers, self.loggers = self.loggers, {}
        for logger in loggers.values():
            logger.close()

    def __enter__(self) -> Tracking:
        return self

    def __exit__(self, *exc: object) -> None:
        self.finish()


def finite(metrics: Mapping[str, float]) -> bool:
    """True when every metric value is a finite number."""
    return all(math.isfinite(float(v)) for v in metrics.values())
