"""Metric sinks: console, JSON lines, TensorBoard, Weights & Biases, MLflow (local store).

Each logger takes ``log(metrics, step)`` and ``close()``, and, where it can show them,
``log_generations(rows, step)`` (sample validation generations: a table where the sink has
one). File-based loggers write into the run's directory (:mod:`hf_algos.tracking.run_dir`).
They are built by name from
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

from hf_algos.tracking.run_dir import GENERATIONS_FILE, METRICS_FILE
from hf_algos.tracking.wandb_mode import resolve_wandb_mode


@dataclass(frozen=True)
class RunInfo:
    """What every logger gets to know about the run."""

    project: str
    """Project (wandb project, MLflow experiment)."""
    experiment: str
    """Run name."""
    log_dir: Path
    """The run's own directory for file-based logs (created on demand)."""
    config: Mapping[str, Any] = field(default_factory=dict)
    """The run's configuration as plain data (stored as hyper-parameters)."""
    run_id: str = ""
    """The run's id (its directory's name); a resumed run keeps it."""
    root_dir: Path | None = None
    """``trainer.log_dir``: where stores shared by runs live (the MLflow store)."""
    wandb_mode: str = "auto"
    """``trainer.wandb_mode`` (see :func:`~hf_algos.tracking.resolve_wandb_mode`)."""
    resumed: bool = False
    """The run continues from a checkpoint of the same run id."""


Generation = Mapping[str, Any]
"""One sample validation generation: ``prompt``, ``response``, ``ground_truth``, ``score``
(and ``data_source``)."""
GENERATION_COLUMNS = ("step", "data_source", "prompt", "response", "ground_truth", "score")
"""Columns of the generation tables, in order."""


def generation_table(rows: list[Generation], step: int) -> list[list[Any]]:
    """``rows`` as table rows in :data:`GENERATION_COLUMNS` order (missing cells empty)."""
    return [[step, *(row.get(c, "") for c in GENERATION_COLUMNS[1:])] for row in rows]


class Logger(Protocol):
    """A metric sink."""

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Record ``metrics`` (name -> number) for training step ``step``."""
        ...

    def close(self) -> None:
        """Flush and release resources."""
        ...


class GenerationLogger(Logger, Protocol):
    """A metric sink that can also show sample generations (all built-in loggers)."""

    def log_generations(self, rows: list[Generation], step: int) -> None:
        """Record the sample validation generations ``rows`` of step ``step``."""
        ...


def _short(text: Any, limit: int = 120) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


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

    def log_generations(self, rows: list[Generation], step: int) -> None:
        """Print each generation on one short line (long texts cut)."""
        out = self.stream or sys.stdout
        print(f"step {step} | {len(rows)} validation generation(s):", file=out)
        for row in rows:
            print(
                f"  score {_format(float(row.get('score', float('nan'))))} | "
                f"prompt {_short(row.get('prompt', ''), 60)!r} | "
                f"response {_short(row.get('response', ''))!r} | "
                f"truth {_short(row.get('ground_truth', ''), 40)!r}",
                file=out,
                flush=True,
            )

    def close(self) -> None:
        """Nothing to release."""


class JsonlLogger:
    """Appends ``{"step": k, name: value, ...}`` lines to the run's ``metrics.jsonl``.

    The file is the run's own (a new run has a new directory); a resumed run appends to it.
    Sample generations go to ``generations.jsonl`` next to it, one JSON object per row.
    """

    def __init__(self, run: RunInfo) -> None:
        run.log_dir.mkdir(parents=True, exist_ok=True)
        self.path = run.log_dir / METRICS_FILE
        self.generations_path = run.log_dir / GENERATIONS_FILE
        self._file = self.path.open("a", encoding="utf-8")

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Append one JSON line (non-finite numbers are written as null)."""
        record: dict[str, float | None] = {"step": step}
        record.update({k: (v if math.isfinite(v) else None) for k, v in metrics.items()})
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def log_generations(self, rows: list[Generation], step: int) -> None:
        """Append one ``{"step": k, "prompt": ..., ...}`` line per generation."""
        with self.generations_path.open("a", encoding="utf-8") as handle:
            for row in rows:
                handle.write(json.dumps({"step": step, **row}, default=str) + "\n")

    def close(self) -> None:
        """Close the file."""
        self._file.close()


class TensorBoardLogger:
    """Scalars to TensorBoard event files in the run directory.

    ``tensorboard --logdir <trainer.log_dir>`` lists every run as
    ``<project>/<experiment>/<run id>``.
    """

    def __init__(self, run: RunInfo) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.directory = run.log_dir
        self.writer = SummaryWriter(log_dir=str(self.directory))

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """One scalar per metric at ``step``."""
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, global_step=step)

    def log_generations(self, rows: list[Generation], step: int) -> None:
        """One Markdown table under the ``val/generations`` text tag (TEXT tab)."""
        header = " | ".join(GENERATION_COLUMNS[1:])
        lines = [header, " | ".join("---" for _ in GENERATION_COLUMNS[1:])]
        for cells in generation_table(rows, step):
            lines.append(" | ".join(_markdown_cell(c) for c in cells[1:]))
        self.writer.add_text("val/generations", "\n".join(lines), global_step=step)
        self.writer.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        self.writer.flush()
        self.writer.close()


def _markdown_cell(value: Any) -> str:
    text = f"{value:.4g}" if isinstance(value, float) else str(value)
    return text.replace("|", "\\|").replace("\n", "<br>")


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
    """Weights & Biases; files under the run directory's ``wandb/``.

    The mode follows ``trainer.wandb_mode`` (:func:`~hf_algos.tracking.resolve_wandb_mode`:
    ``auto`` is online when an API key is configured, offline when not) and is printed once.
    The W&B run id is the run's id, so a resumed run continues the same W&B run.
    Offline runs are uploaded later with ``wandb sync <run dir>/wandb/offline-run-*``.
    """

    def __init__(self, run: RunInfo) -> None:
        wandb = _optional_import("wandb", "wandb")
        run.log_dir.mkdir(parents=True, exist_ok=True)
        self.mode, reason = resolve_wandb_mode(run.wandb_mode)
        print(f"wandb: mode {self.mode} ({reason})", flush=True)
        self.run = wandb.init(
            project=run.project,
            name=run.experiment,
            id=run.run_id or None,
            resume="allow" if run.run_id else None,
            config=dict(run.config),
            dir=str(run.log_dir),
            mode=self.mode,
            reinit="finish_previous",
        )
        self._wandb = wandb

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Log the metrics at ``step``."""
        self.run.log(dict(metrics), step=step)

    def log_generations(self, rows: list[Generation], step: int) -> None:
        """A ``wandb.Table`` under ``val/generations`` at ``step``."""
        table = self._wandb.Table(
            columns=list(GENERATION_COLUMNS), data=generation_table(rows, step)
        )
        self.run.log({"val/generations": table}, step=step)

    def close(self) -> None:
        """Finish the run (writes its files)."""
        self.run.finish()


_RUN_ID_TAG = "hybridflow.run_id"


class MLflowLogger:
    """MLflow with a local file store at ``<trainer.log_dir>/mlruns`` (``mlflow ui`` reads it).

    ``MLFLOW_TRACKING_URI`` points it elsewhere. The run is tagged with the run id, so a
    resumed run logs into the same MLflow run.
    """

    def __init__(self, run: RunInfo) -> None:
        mlflow = _optional_import("mlflow", "mlflow")
        self.store = ((run.root_dir or run.log_dir) / "mlruns").resolve()
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
        existing = self._find_run(experiment_id, run.run_id) if run.resumed else None
        if existing is not None:
            self.run_id = existing
            self.client.update_run(existing, status="RUNNING")
            return
        tags = {_RUN_ID_TAG: run.run_id} if run.run_id else None
        created = self.client.create_run(experiment_id, run_name=run.experiment, tags=tags)
        self.run_id = created.info.run_id
        for name, value in _flatten(run.config).items():
            self.client.log_param(self.run_id, name, str(value)[:500])

    def _find_run(self, experiment_id: str, run_id: str) -> str | None:
        if not run_id:
            return None
        found = self.client.search_runs(
            [experiment_id], filter_string=f"tags.`{_RUN_ID_TAG}` = '{run_id}'", max_results=1
        )
        return found[0].info.run_id if found else None

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Log every metric at ``step`` in one batch call."""
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        batch = [Metric(_mlflow_name(k), float(v), stamp, step) for k, v in metrics.items()]
        self.client.log_batch(self.run_id, metrics=batch)

    def log_generations(self, rows: list[Generation], step: int) -> None:
        """``val_generations.json`` (an MLflow table, rows appended per validation)."""
        cells = generation_table(rows, step)
        data = {name: [row[i] for row in cells] for i, name in enumerate(GENERATION_COLUMNS)}
        try:
            self.client.log_table(self.run_id, data=data, artifact_file="val_generations.json")
        except ImportError:  # MLflow's tables need pandas; keep the rows as text then
            text = "\n".join(json.dumps({"step": step, **row}, default=str) for row in rows)
            self.client.log_text(self.run_id, text, f"val_generations/step_{step}.jsonl")

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
