"""Run verl's own single-controller and DataProto tests against HybridFlow's compat modules.

verl users port worker code by changing its imports. This checks that promise with verl's
own tests: the source distribution of verl on PyPI (it holds ``tests/``) is downloaded into a
cache, the tests in scope are copied into a work folder with their ``verl`` imports pointed at
``hf_controller.compat.verl`` and ``hf_protocol.compat.verl``, and pytest runs them. Nothing
else in a test is changed, except in the files marked ``resources``: verl marks them for GPUs
although they need only Ray resources, so there ``use_gpu=True`` becomes ``use_gpu=False``
(and a ``RayResourcePool(...)`` that leaves ``use_gpu`` at its default gets ``use_gpu=False``).

The tests left out are listed in ``EXCLUDED_FILES`` and ``EXCEPTIONS``, each with its
reason: verl internals we do not have, GPU-only work, or a place where our behaviour is
deliberately different (docs/from-verl.md).

    python tools/verl_tests.py                 # download (once), rewrite, run; exit code of pytest
    python tools/verl_tests.py --all           # also the excepted tests (to see where they stand)
    python tools/verl_tests.py -- -k padding   # extra pytest arguments after --
    python tools/verl_tests.py --only test_protocol_on_cpu.py   # one file in scope (repeatable)
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

VERL_VERSION = "0.9.1"
REPO = Path(__file__).resolve().parent.parent
DEFAULT_CACHE = REPO / ".ci-work" / "verl-tests"

# the test files of verl's tests/ that run here: path -> how ("cpu": as they are;
# "resources": GPU-marked, but they need only Ray resources, so use_gpu=False)
IN_SCOPE: dict[str, str] = {
    "test_protocol_on_cpu.py": "cpu",
    "single_controller/test_auto_padding_on_cpu.py": "cpu",
    "single_controller/test_decorator_on_cpu.py": "cpu",
    "single_controller/test_fused_workers_on_cpu.py": "cpu",
    "single_controller/test_get_set_dispatch_collect_cpu.py": "cpu",
    "single_controller/test_ray_local_envs_on_cpu.py": "cpu",
    "single_controller/test_ray_utils_on_cpu.py": "cpu",
    "single_controller/test_worker_group_basics.py": "resources",
    "single_controller/test_nested_worker.py": "resources",
    "single_controller/test_colocated_workers.py": "resources",
    "single_controller/test_colocated_workers_fused.py": "resources",
    "single_controller/test_driverfunc_to_worker.py": "resources",
}

# the files of verl's tests/single_controller left out, and why
EXCLUDED_FILES: dict[str, str] = {
    "single_controller/test_data_transfer.py": "GPU-only: moves CUDA tensors between workers",
    "single_controller/test_device_mesh_register.py": (
        "GPU-only: builds a 2x2 (or 2x2x2) CUDA device mesh with NCCL"
    ),
    "single_controller/test_high_level_scheduling_api.py": (
        "GPU-only: asserts CUDA_VISIBLE_DEVICES per worker"
    ),
    "single_controller/test_ray_collectives.py": "GPU-only: ray.util.collective over NCCL",
    "single_controller/test_rvdz.py": "GPU-only: NCCL rendezvous between num_gpus=1 actors",
    "single_controller/test_split_resource_pool.py": "GPU-only: CUDA tensors per split pool",
    "single_controller/test_worker_group_torch.py": "GPU-only: NCCL all-reduce across workers",
}

# single tests in the files above that are left out: node id -> reason
EXCEPTIONS: dict[str, str] = {
    "test_protocol_on_cpu.py::test_chunk_concat": (
        "deliberately different: chunk(5) of 6 rows gives balanced parts (2/1/1/1/1) where "
        "verl asserts that the length divides evenly (docs/from-verl.md)"
    ),
}

# (pattern, replacement) applied to each line of a test file in scope, in order
IMPORT_REWRITES: list[tuple[str, str]] = [
    (r"\bverl\.single_controller(?:\.[A-Za-z_]+)*\b", "hf_controller.compat.verl"),
    (r"\bverl\.utils\.ray_utils\b", "hf_controller.compat.verl"),
    (r"\bverl\.utils\.device\b", "hf_controller.compat.verl"),
    (r"\bverl\.utils\.tensordict_utils\b", "hf_protocol.compat.verl_tensordict"),
    (
        r"^(\s*)from verl\.utils import tensordict_utils as tu\b",
        r"\1import hf_protocol.compat.verl_tensordict as tu",
    ),
    (r"\bverl\.protocol\b", "hf_protocol.compat.verl"),
    (r"^(\s*)from verl import\b", r"\1from hf_protocol.compat.verl import"),
]


def download(cache: Path) -> Path:
    """verl's sdist in ``cache`` (downloaded once with pip), unpacked; its ``tests/`` folder."""
    tests = cache / f"verl-{VERL_VERSION}" / "tests"
    if tests.is_dir():
        return tests
    cache.mkdir(parents=True, exist_ok=True)
    archive = cache / f"verl-{VERL_VERSION}.tar.gz"
    if not archive.exists():
        # pip builds the sdist's metadata in an isolated environment (setuptools from the index)
        sdist = ["--no-deps", "--no-binary", ":all:", f"verl=={VERL_VERSION}"]
        command = [sys.executable, "-m", "pip", "download", "--quiet", *sdist, "-d", str(cache)]
        subprocess.run(command, check=True)
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if "/tests/" in m.name]
        tar.extractall(cache, members=members, filter="data")
    return tests


def rewrite(source: str, mode: str) -> str:
    """A verl test file with its imports pointed at the compat modules (and, for
    ``resources`` files, ``use_gpu=True`` turned off)."""
    lines = []
    for line in source.splitlines(keepends=True):
        for pattern, replacement in IMPORT_REWRITES:
            line = re.sub(pattern, replacement, line)
        if mode == "resources":
            line = line.replace("use_gpu=True", "use_gpu=False")
            # a pool that leaves use_gpu at verl's default (True) asks for GPUs too
            line = re.sub(
                r"(RayResourcePool\((?:(?!use_gpu)[^()])*)\)", r"\1, use_gpu=False)", line
            )
        lines.append(line)
    text = "".join(lines)
    leftover = re.findall(r"^\s*(?:from|import) verl\b.*$", text, flags=re.M)
    if leftover:
        raise SystemExit(f"verl imports with no compat module: {leftover}")
    return text


def prepare(tests: Path, work: Path) -> list[str]:
    """Copy the tests in scope into ``work`` rewritten; the pytest paths to run."""
    shutil.rmtree(work, ignore_errors=True)
    (work / "single_controller").mkdir(parents=True)
    (work / "pytest.ini").write_text("[pytest]\n")
    paths = []
    for relative, mode in IN_SCOPE.items():
        target = work / relative
        target.write_text(rewrite((tests / relative).read_text(), mode))
        paths.append(relative)
    return paths


def main(argv: list[str] | None = None) -> int:
    """Download, rewrite and run verl's tests; pytest's exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--all", action="store_true", help="run the excepted tests too")
    parser.add_argument(
        "--only",
        action="append",
        choices=sorted(IN_SCOPE),
        help="run only this file in scope (repeatable; default: every file in scope)",
    )
    parser.add_argument("pytest_args", nargs="*", help="after --: passed to pytest")
    args = parser.parse_args(argv)
    tests = download(args.cache)
    work = args.cache / "rewritten"
    paths = prepare(tests, work)
    if args.only:
        paths = [path for path in paths if path in args.only]
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-c",
        "pytest.ini",
        "--rootdir",
        ".",
        "-rfE",
        *paths,
    ]
    if not args.all:
        for node, _reason in EXCEPTIONS.items():
            command += ["--deselect", node]
    env = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    return subprocess.run([*command, *args.pytest_args], cwd=work, env=env).returncode


if __name__ == "__main__":
    raise SystemExit(main())
