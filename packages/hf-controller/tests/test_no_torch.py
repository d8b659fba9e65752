"""hf-controller alone must never import torch (it serves non-RL jobs with only Ray)."""

import subprocess
import sys

CODE = """
import sys
from hf_controller import Dispatch, LocalWorkerGroup, RayClassWithInitArgs, Worker, register

class Echo(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def echo(self, x):
        return (self.rank, x)

group = LocalWorkerGroup(world_size=2, ray_cls_with_init=RayClassWithInitArgs(Echo))
assert group.echo("hi") == [(0, "hi"), (1, "hi")]
assert "torch" not in sys.modules, "torch was imported"
print("ok")
"""


def test_controller_runs_without_importing_torch() -> None:
    result = subprocess.run(
        [sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120
    )
    assert result.stdout.strip() == "ok", result.stderr[-2000:]
