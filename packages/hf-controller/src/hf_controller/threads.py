"""How many CPU threads a worker process computes with: the cores its bundle holds.

Ray starts an actor that reserves a fraction of a CPU with ``OMP_NUM_THREADS=1``, so torch
in a CPU worker ran on one thread while the node's other cores sat idle (issue 28: a real
model's update at 100% of one core of two). A group therefore tells each rank how many
threads its bundle stands for (:data:`THREADS_ENV`, set with the rank's environment), and
:class:`~hf_controller.Worker` applies it when the worker is built:

* a bundle of ``cpus_per_worker >= 1`` holds ``int(cpus_per_worker)`` cores;
* fractional bundles (the CPU default, 0.1, so several workers share a node) share the
  node: with ``k`` bundles reserved on a node of ``c`` CPUs (this pool's and every other
  one's, e.g. a separate rollout pool's), each rank gets ``c // k`` (at least 1).

Either way a worker never takes more than its share of the cores it may run on (its CPU
affinity divided among the group's ranks on its node, ``LOCAL_WORLD_SIZE``): a test
cluster that declares more CPUs than the machine has must not oversubscribe it.

Torch-free: torch is touched only where the worker process has imported it already.
"""

from __future__ import annotations

import os
import sys

THREADS_ENV = "HF_WORKER_THREADS"
"""CPU threads a worker computes with; set per rank by the worker group."""


def threads_per_worker(cpus_per_worker: float, workers_on_node: int, node_cpus: float) -> int:
    """The threads of one worker: its whole cores, or its share of the node's cores when
    its bundle holds less than one (at least 1)."""
    if cpus_per_worker >= 1:
        return int(cpus_per_worker)
    return max(1, int(node_cpus) // max(1, workers_on_node))


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS tells it)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def apply_worker_threads() -> int | None:
    """Set this process's thread count from :data:`THREADS_ENV` (capped at its share of
    the usable cores among its group's ``LOCAL_WORLD_SIZE`` ranks on this node):
    ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` for libraries loaded later, and
    ``torch.set_num_threads`` when torch is loaded already (a prestarted worker host
    imports it before its rank's environment arrives). The count applied, or ``None``
    when the group set none (the local backend keeps the driver's own setting)."""
    text = os.environ.get(THREADS_ENV, "").strip()
    if not text:
        return None
    local_ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    threads = max(1, min(int(text), usable_cores() // local_ranks))
    os.environ["OMP_NUM_THREADS"] = str(threads)
    os.environ["MKL_NUM_THREADS"] = str(threads)
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "set_num_threads"):
        torch.set_num_threads(threads)
    return threads
