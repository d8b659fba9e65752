"""Test helpers: a real multi-node Ray cluster on one machine, and a process tree.

``ray.cluster_utils.Cluster`` starts one raylet per "node", each with its own node
id and resources (all on 127.0.0.1), so multi-node placement and cross-node
collectives can be tested without a second machine. :func:`descendant_pids` lets a test
check that a failure left no orphaned process behind.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from hf_controller.ray.cluster import ensure_ray, use_loopback_by_default


@contextlib.contextmanager
def local_multinode_cluster(cpus_per_node: Sequence[float] = (2.0, 2.0)) -> Iterator[Any]:
    """A Ray cluster of ``len(cpus_per_node)`` local nodes, this process connected as driver.

    The first node is the head (and the driver's node). A Ray this process was
    already connected to is disconnected first (one driver connection per process).
    Yields the ``ray.cluster_utils.Cluster``; on exit disconnects and stops every node.
    """
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    use_loopback_by_default()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": cpus_per_node[0]})
    try:
        for cpus in cpus_per_node[1:]:
            cluster.add_node(num_cpus=cpus)
        cluster.wait_for_nodes()
        ensure_ray(address=cluster.address, log_to_driver=False)
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def descendant_pids(root: int | None = None) -> set[int]:
    """Every live process below ``root`` (this process by default), read from ``/proc``."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:  # the process ended while we listed
                continue
            parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    found: set[int] = set()
    frontier = {root or os.getpid()}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found
