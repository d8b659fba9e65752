"""The quickstart's GRPO stage on a real two-node Ray cluster (two raylets on this machine).

The driver runs in a subprocess that joins the cluster through ``RAY_ADDRESS``, exactly as
a user's driver joins one started with ``ray start``. With ``trainer.nnodes=2`` and two
workers in total, each node runs one training rank; the two ranks form one gloo group
across the nodes. The recipe runs as shipped otherwise and must learn as it does on one
node: the reward of the last steps well above that of the first ones, and held-out greedy
accuracy at least 0.9 at the end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hf_algos.tracking import metrics_path

from .conftest import REPO_ROOT, python_path_with_repo_root


@pytest.fixture(scope="module")
def two_node_cluster() -> Iterator[str]:
    """Address of a Ray cluster of two nodes with one CPU each (its own processes)."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False}
    )
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    yield cluster.address
    cluster.shutdown()


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_grpo_with_two_nodes_trains_and_learns(two_node_cluster: str, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "RAY_ADDRESS": two_node_cluster,
        "PYTHONPATH": python_path_with_repo_root(),
    }
    command = [
        sys.executable,
        "-m",
        "recipes.quickstart.main",
        f"workdir={tmp_path}",
        "grpo.trainer.nnodes=2",
        "grpo.trainer.n_workers=2",
    ]
    done = subprocess.run(
        command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=850
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    grpo_metrics = metrics_path(tmp_path / "logs", "hybridflow", "grpo")
    records = [json.loads(line) for line in grpo_metrics.open()]
    scores = [r["critic/score/mean"] for r in records if "critic/score/mean" in r]
    accuracy = [r["val/accuracy"] for r in records if "val/accuracy" in r]
    first, last = mean(scores[:20]), mean(scores[-20:])
    print(f"reward {first:.3f} -> {last:.3f}, held-out accuracy {accuracy}")
    assert last > first + 0.3, f"the reward did not rise: {first:.3f} -> {last:.3f}"
    assert accuracy[-1] >= 0.9, f"GRPO on two nodes did not reach 0.9 accuracy: {accuracy}"
