"""Worker classes reach the workers whether or not the workers can import their module."""

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any


def _run_driver(script: Path) -> str:
    run = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd="/"
    )
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout.strip().splitlines()[-1]


def test_worker_class_defined_in_a_script_main(ray_session: Any, tmp_path: Path) -> None:
    address = ray_session.get_runtime_context().gcs_address
    script = tmp_path / "standalone.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import ray
            ray.init(address={address!r}, log_to_driver=False)
            from hf_controller import (
                Dispatch, RayClassWithInitArgs, RayResourcePool, RayWorkerGroup, Worker, register
            )

            class ScriptWorker(Worker):
                @register(Dispatch.ONE_TO_ALL)
                def hello(self):
                    return f"hello from {{self.rank}}"

            pool = RayResourcePool([2], use_gpu=False)
            group = RayWorkerGroup(pool, RayClassWithInitArgs(ScriptWorker))
            print(group.hello())
            """
        )
    )
    run = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd="/"
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1] == "['hello from 0', 'hello from 1']"


def test_worker_from_a_source_tree_the_workers_cannot_import(
    ray_session: Any, tmp_path: Path
) -> None:
    package = tmp_path / "src_tree" / "mytool"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "helpers.py").write_text("def shout(text):\n    return text.upper() + '!'\n")
    (package / "workers.py").write_text(
        textwrap.dedent(
            """
            from hf_controller import Dispatch, Worker, register
            from mytool.helpers import shout

            class ShoutWorker(Worker):
                @register(Dispatch.ONE_TO_ALL)
                def shout(self, text):
                    return shout(text)
            """
        )
    )
    address = ray_session.get_runtime_context().gcs_address
    script = tmp_path / "driver.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import sys
            sys.path.insert(0, {str(tmp_path / "src_tree")!r})
            import ray
            ray.init(address={address!r}, log_to_driver=False)
            from hf_controller import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
            from mytool.workers import ShoutWorker
            pool = RayResourcePool([2], use_gpu=False)
            group = RayWorkerGroup(pool, RayClassWithInitArgs(ShoutWorker))
            print(group.shout("hi"))
            """
        )
    )
    assert _run_driver(script) == "['HI!', 'HI!']"
