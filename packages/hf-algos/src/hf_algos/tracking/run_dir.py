"""One directory per run: ``<log_dir>/<project>/<experiment>/<run id>``.

A run directory holds everything a run logs: ``metrics.jsonl``, TensorBoard events,
``generations.jsonl`` (sample validation generations), the W&B offline files, the trace and
the resolved ``config.yaml``. A new run gets a new, timestamp-based id, so it never appends
to an earlier run's files; a resumed run reuses the id stored with its checkpoint and
appends to its own. Readers find a run's metrics with :func:`metrics_path` or
:func:`latest_run_dir` instead of hard-coding file names.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Mapping
from os import PathLike
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.jsonl"
"""Name of the JSON-lines metrics file in a run directory."""
GENERATIONS_FILE = "generations.jsonl"
"""Name of the JSON-lines file of sample validation generations in a run directory."""
CONFIG_FILE = "config.yaml"
"""Name of the resolved configuration written into a run (and checkpoint) directory."""


def new_run_id() -> str:
    """A fresh run id: the local start time to the microsecond.

    ``20250131-142501-048213``: sorts by start time (as TensorBoard and W&B list runs, and
    as :func:`latest_run_dir` relies on), even for runs started in the same second. Letters,
    digits and ``-`` only, so it is a valid W&B run id too.
    """
    return datetime.datetime.now().strftime("%Y%m%d-%H%M%S-%f")


def run_dir(log_dir: str | PathLike[str], project: str, experiment: str, run_id: str) -> Path:
    """The directory of run ``run_id``: ``<log_dir>/<project>/<experiment>/<run_id>``."""
    return Path(log_dir) / project / experiment / run_id


def latest_run_dir(log_dir: str | PathLike[str], project: str, experiment: str) -> Path | None:
    """The most recently started run of ``project``/``experiment`` under ``log_dir``.

    Run ids start with their start time, so the newest sorts last; ``None`` when there is
    no run yet.
    """
    parent = Path(log_dir) / project / experiment
    if not parent.is_dir():
        return None
    runs = sorted(p for p in parent.iterdir() if p.is_dir())
    return runs[-1] if runs else None


def metrics_path(
    log_dir: str | PathLike[str], project: str, experiment: str, run_id: str | None = None
) -> Path:
    """The ``metrics.jsonl`` of run ``run_id`` (default: the latest run) of an experiment.

    Raises ``FileNotFoundError`` naming the directory when the experiment has no run.
    """
    if run_id is not None:
        return run_dir(log_dir, project, experiment, run_id) / METRICS_FILE
    latest = latest_run_dir(log_dir, project, experiment)
    if latest is None:
        where = Path(log_dir) / project / experiment
        raise FileNotFoundError(
            f"no run of project {project!r}, experiment {experiment!r} under {str(where)!r}; "
            f"check trainer.log_dir, trainer.project_name and trainer.experiment_name"
        )
    return latest / METRICS_FILE


def write_config(path: str | PathLike[str], config: Mapping[str, Any]) -> Path:
    """Write ``config`` (plain data, e.g. ``config_to_dict(cfg)``) as YAML to ``path``.

    Tuples become lists and paths strings, so the file loads back with any YAML reader and
    can be passed to ``hybridflow ... --config``.
    """
    import yaml

    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(_plain(config), sort_keys=False, default_flow_style=False)
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, target)  # a reader never sees half a file
    return target


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, PathLike):
        return os.fspath(value)
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)
