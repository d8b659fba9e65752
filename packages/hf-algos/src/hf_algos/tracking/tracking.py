"""``Tracking``: one object that fans a step's metrics out to every configured logger."""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from os import PathLike
from pathlib import Path
from typing import Any

from hf_algos.tracking.loggers import LOGGERS, Logger, RunInfo


class Tracking:
    """Sends metrics to the loggers named in ``loggers`` (keys of :data:`LOGGERS`).

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
    ) -> None:
        unknown = [name for name in loggers if name not in LOGGERS]
        if unknown:
            raise ValueError(
                f"unknown logger(s) {unknown}; choose from {sorted(LOGGERS)} "
                "(or add one with hf_algos.tracking.register_logger)"
            )
        run = RunInfo(project, experiment, Path(log_dir), dict(config or {}))
        self.loggers: dict[str, Logger] = {}
        for name in dict.fromkeys(loggers):
            try:
                self.loggers[name] = LOGGERS[name](run)
            except ImportError as error:
                if strict:
                    raise
                warnings.warn(f"skipping logger {name!r}: {error}", stacklevel=2)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Record ``metrics`` for ``step`` in every logger (values converted to float)."""
        clean = {name: float(value) for name, value in metrics.items()}
        for logger in self.loggers.values():
            logger.log(clean, step)

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
