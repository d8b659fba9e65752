"""Metric sinks: console, JSON lines, TensorBoard, Weights & Biases (offline), MLflow (local).

Each logger takes ``log(metrics, step)`` and ``close()``. They are built by name from
:data:`LOGGERS`, an explicit registry; :func:`register_logger` adds one. Weights & Biases
and MLflow are optional installs (``pip install hf-algos[loggers]``): asking for one that is
not installed is an error that says what to install.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TextIO


@dataclass(frozen=True)
class RunInfo:
    """What every logger gets to know about the run."""

    project: str
    """Project (wandb project, MLflow experiment, file-name prefix)."""
    experiment: str
    """Run name."""
    log_dir: Path
    """Directory for file-based logs (created on demand)."""
    config: Mapping[str, Any] = field(default_factory=dict)
    """The run's configuration as plain data (stored as hyper-parameters)."""


class Logger(Protocol):
    """A metric sink."""

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Record ``metrics`` (name -> number) for training step ``step``."""
        ...

    def close(self) -> None:
        """Flush and release resources."""
        ...


def _format(value: float) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


class ConsoleLogger:
    """Prints one line per step: ``step 3 | critic/score/mean 0.41 | ...``."""

    def __init__(self, run: RunInfo, stream: TextIO | None = None) -> None:
        self.stream = stream

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Write the metrics as one line (through tqdm, so a progress bar stays intact)."""
        line = f"step {step} | " + " | ".join(f"{k} {_format(v)}" for k, v in metrics.items())
        try:
            from tqdm import tqdm

            tqdm.write(line, file=self.stream or sys.stdout)
        except ImportError:  # tqdm is a dependency; this only guards a broken install
            print(line, file=self.stream or sys.stdout, flush=True)

    def close(self) -> None:
        """Nothing to release."""


class JsonlLogger:
    """Appends ``{"step": k, name: value, ...}`` lines to ``<log_dir>/<experiment>.jsonl``."""

    def __init__(self, run: RunInfo) -> None:
        run.log_dir.mkdir(parents=True, exist_ok=True)
        self.path = run.log_dir / f"{run.experiment}.jsonl"
        self._file = self.path.open("a", encoding="utf-8")

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Append one JSON line (non-finite numbers are written as null)."""
        record: dict[str, float | None] = {"step": step}
        record.update({k: (v if math.isfinite(v) else None) for k, v in metrics.items()})
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def close(self) -> None:
        """Close the file."""
        self._file.close()


class TensorBoardLogger:
    """Scalars to a TensorBoard event file under ``<log_dir>/tensorboard/<experiment>``."""

    def __init__(self, run: RunInfo) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.directory = run.log_dir / "tensorboard" / run.experiment
        self.writer = SummaryWriter(log_dir=str(self.directory))

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """One scalar per metric at ``step``."""
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, global_step=step)

    def close(self) -> None:
        """Flush and close the event file."""
        self.writer.flush()
        self.writer.close()


def _optional_import(module: str, logger: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(
            f"the {logger!r} logger needs the {module!r} package, which is not installed; "
            f"run pip install 'hf-algos[loggers]' (or pip install {module}), or drop "
            f"{logger!r} from trainer.loggers"
        ) from None


class WandbLogger:
    """Weights & Biases in offline mode: runs are written under ``<log_dir>/wandb``.

    Sync them later with ``wandb sync``. Set ``WANDB_MODE=online`` to stream instead.
    """

    def __init__(self, run: RunInfo) -> None:
        wandb = _optional_import("wandb", "wandb")
        run.log_dir.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=run.project,
            name=run.experiment,
            config=dict(run.config),
            dir=str(run.log_dir),
            mode=os.environ.get("WANDB_MODE", "offline"),
            reinit="finish_previous",
        )

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Log the metrics at ``step``."""
        self.run.log(dict(metrics), step=step)

    def close(self) -> None:
        """Finish the run (writes its files)."""
        self.run.finish()


class MLflowLogger:
    """MLflow with a local file store at ``<log_dir>/mlruns`` (``mlflow ui`` reads it)."""

    def __init__(self, run: RunInfo) -> None:
        mlflow = _optional_import("mlflow", "mlflow")
        self.store = (run.log_dir / "mlruns").resolve()
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if uri is None:
            # MLflow 3 keeps the file store but asks for an explicit opt-in to it.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            uri = self.store.as_uri()
        self.client = mlflow.tracking.MlflowClient(tracking_uri=uri)
        experiment = self.client.get_experiment_by_name(run.project)
        experiment_id = (
            experiment.experiment_id
            if experiment is not None
            else self.client.create_experiment(run.project)
        )
        self.run_id = self.client.create_run(experiment_id, run_name=run.experiment).info.run_id
        for name, value in _flatten(run.config).items():
            self.client.log_param(self.run_id, name, str(value)[:500])

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Log every metric at ``step`` in one batch call."""
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        batch = [Metric(_mlflow_name(k), float(v), stamp, step) for k, v in metrics.items()]
        self.client.log_batch(self.run_id, metrics=batch)

    def close(self) -> None:
        """Mark the run finished."""
        self.client.set_terminated(self.run_id)


def _mlflow_name(name: str) -> str:
    # MLflow accepts letters, digits, _ - . / and spaces in metric names.
    return "".join(c if c.isalnum() or c in "_-./ " else "_" for c in name)


def _flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


LoggerFactory = Callable[[RunInfo], Logger]
"""Builds a logger for a run."""

LOGGERS: dict[str, LoggerFactory] = {}
"""Logger factories by name (the values of ``trainer.loggers``)."""


def register_logger(name: str, factory: LoggerFactory) -> None:
    """Add ``factory`` to :data:`LOGGERS` under ``name``; a name used twice is an error."""
    if name in LOGGERS:
        raise ValueError(f"logger {name!r} is already registered; pick another name")
    LOGGERS[name] = factory


register_logger("console", ConsoleLogger)
register_logger("jsonl", JsonlLogger)
register_logger("tensorboard", TensorBoardLogger)
register_logger("wandb", WandbLogger)
register_logger("mlflow", MLflowLogger)
