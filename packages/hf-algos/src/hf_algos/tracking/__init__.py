"""Metrics and where they go: verl-named batch metrics, loggers, and the ``Tracking`` fan-out."""

from hf_algos.tracking.loggers import (
    LOGGERS,
    ConsoleLogger,
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
from hf_algos.tracking.tracking import Tracking, finite

__all__ = [
    "LOGGERS",
    "ConsoleLogger",
    "JsonlLogger",
    "Logger",
    "MLflowLogger",
    "RunInfo",
    "TensorBoardLogger",
    "Tracking",
    "WandbLogger",
    "compute_data_metrics",
    "compute_throughput_metrics",
    "compute_timing_metrics",
    "finite",
    "merge_worker_metrics",
    "prompt_and_response_lengths",
    "reduce_metrics",
    "register_logger",
    "timed",
]
