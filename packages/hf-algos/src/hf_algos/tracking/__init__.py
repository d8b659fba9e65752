"""Metrics and where they go: verl-named batch metrics, loggers, the ``Tracking`` fan-out and
one directory per run."""

from hf_algos.tracking.loggers import (
    GENERATION_COLUMNS,
    LOGGERS,
    ConsoleLogger,
    Generation,
    GenerationLogger,
    JsonlLogger,
    Logger,
    MLflowLogger,
    RunInfo,
    TensorBoardLogger,
    WandbLogger,
    register_logger,
)
from hf_algos.tracking.metrics import (
    compute_data_metrics,
    compute_throughput_metrics,
    compute_timing_metrics,
    merge_worker_metrics,
    prompt_and_response_lengths,
    reduce_metrics,
    timed,
)
from hf_algos.tracking.run_dir import (
    CONFIG_FILE,
    GENERATIONS_FILE,
    METRICS_FILE,
    latest_run_dir,
    metrics_path,
    new_run_id,
    run_dir,
    write_config,
)
from hf_algos.tracking.tracking import Tracking, finite
from hf_algos.tracking.wandb_mode import (
    WANDB_MODES,
    WandbMode,
    resolve_wandb_mode,
    wandb_key_source,
)

__all__ = [
    "CONFIG_FILE",
    "GENERATIONS_FILE",
    "GENERATION_COLUMNS",
    "LOGGERS",
    "METRICS_FILE",
    "WANDB_MODES",
    "ConsoleLogger",
    "Generation",
    "GenerationLogger",
    "JsonlLogger",
    "Logger",
    "MLflowLogger",
    "RunInfo",
    "TensorBoardLogger",
    "Tracking",
    "WandbLogger",
    "WandbMode",
    "compute_data_metrics",
    "compute_throughput_metrics",
    "compute_timing_metrics",
    "finite",
    "latest_run_dir",
    "merge_worker_metrics",
    "metrics_path",
    "new_run_id",
    "prompt_and_response_lengths",
    "reduce_metrics",
    "register_logger",
    "resolve_wandb_mode",
    "run_dir",
    "timed",
    "wandb_key_source",
    "write_config",
]
