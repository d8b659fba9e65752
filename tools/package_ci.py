"""Prove that one workspace package stands alone: built, installed from wheels, tested.

Usage::

    python tools/package_ci.py hf-protocol [--python python3.11] [--keep]
    python tools/package_ci.py --list        # package names in dependency order
    python tools/package_ci.py --wheels dist # every package's wheel into dist/ (to install
                                             # with pip install --find-links dist hf-algos)

Steps, each printed with its duration:

1. build a wheel of the package and of every sibling it needs, transitively and
   through its ``test`` extra (``pip wheel --no-deps``, in an isolated build env);
2. create a fresh virtual environment in ``.ci-work/<package>/venv``;
3. install the wheel *files* (``<own wheel>[test]`` plus the sibling wheels) with
   ``-c tools/constraints.txt``, so pip resolves the declared version ranges for
   real and can never take a same-named project from an index instead;
4. check that the package imports from that venv, not from ``packages/<p>/src``;
5. run ``python -m pytest tests -m "not second_lane"`` from ``packages/<p>`` with the
   venv's Python, under the package's own pytest configuration. "No tests collected"
   (exit 5) is a failure. Tests marked ``second_lane`` (the slow multi-rank ones) run in
   ``tools/test_all.sh``'s workspace lane instead, so the two lanes take about as long.

The work directory is removed after a pass unless ``--keep`` is given, and kept
after a failure so it can be inspected.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from workspace import REPO_ROOT, Package, Workspace, WorkspaceError, discover

PYTEST_NO_TESTS = 5  # pytest's exit code when it collected nothing
SECOND_LANE = "second_lane"
"""The pytest marker of the tests ``tools/test_all.sh`` runs in its workspace lane."""


class StepFailedError(Exception):
    """A step failed; the message says which and why. ``code`` is the exit code to use."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


@contextmanager
def step(title: str, timings: list[tuple[str, float]]) -> Iterator[None]:
    """Print a step header, then its duration when the block ends; record it in ``timings``."""
    print(f"\n==> [{len(timings) + 1}] {title}", flush=True)
    start = time.monotonic()
    try:
        yield
    finally:
        elapsed = time.monotonic() - start
        timings.append((title, elapsed))
        print(f"    ({elapsed:.1f}s)", flush=True)


def run(command: list[str], cwd: Path, env: dict[str, str] | None = None) -> int:
    """Run ``command``, echoing it first; return its exit code."""
    print(f"$ cd {shlex.quote(str(cwd))} && {shlex.join(command)}", flush=True)
    return subprocess.run(command, cwd=cwd, env=env, check=False).returncode


def child_env() -> dict[str, str]:
    """Environment for child processes: PYTHONPATH dropped, so no sources leak in."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    env.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # local Ray on 127.0.0.1
    return env


def build_wheel(package: Package, out_dir: Path, root: Path) -> Path:
    """Build ``package`` into ``out_dir`` and return the wheel file."""
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(out_dir)]
    if run([*command, str(package.path)], cwd=root, env=child_env()) != 0:
        raise StepFailedError(f"building the wheel of {package.name} ({package.path}) failed")
    wheels = sorted(out_dir.glob("*.whl"))
    if len(wheels) != 1:
        raise StepFailedError(f"expected one wheel for {package.name} in {out_dir}, found {wheels}")
    return wheels[0]


def create_venv(python: str, venv: Path, root: Path) -> Path:
    """Create a fresh venv with ``python``; return the venv's interpreter."""
    if run([python, "-m", "venv", str(venv)], cwd=root, env=child_env()) != 0:
        raise StepFailedError(f"creating a virtual environment with {python!r} failed")
    return venv / "bin" / "python"


def install(venv_python: Path, own: Path, siblings: list[Path], root: Path) -> None:
    """Install the package's wheel with its test extra, plus the sibling wheels."""
    constraints = root / "tools" / "constraints.txt"
    if not constraints.is_file():
        raise StepFailedError(f"missing {constraints}: every install is constrained by it")
    command = [str(venv_python), "-m", "pip", "install", "--constraint", str(constraints)]
    command += [f"{own}[test]", *map(str, siblings)]
    if run(command, cwd=root, env=child_env()) != 0:
        raise StepFailedError(
            "pip could not install the wheels. If it reports a conflict on a sibling, "
            "that sibling's declared range does not admit the version built here "
            "(python tools/check_versions.py explains)."
        )


def check_import(venv_python: Path, package: Package, venv: Path) -> None:
    """Fail unless ``import <package>`` resolves inside ``venv`` (i.e. to the wheel).

    It runs where the tests run, in the package directory, which ``python -m`` puts
    on sys.path: the src/ layout keeps the sources out of reach from there.
    """
    probe = (
        "import importlib.util, sys; spec = importlib.util.find_spec(sys.argv[1]); "
        "print(spec.origin if spec else '')"
    )
    command = [str(venv_python), "-c", probe, package.import_name]
    print(f"$ cd {shlex.quote(str(package.path))} && {shlex.join(command)}", flush=True)
    result = subprocess.run(
        command, cwd=package.path, env=child_env(), capture_output=True, text=True, check=False
    )
    origin = result.stdout.strip()
    print(f"    {package.import_name} -> {origin or '(not found)'}")
    if result.returncode != 0 or not origin:
        raise StepFailedError(
            f"{package.import_name!r} is not importable from the installed wheel. Import "
            f"names follow the distribution name ({package.name} -> {package.import_name}) "
            f"and live in src/{package.import_name}/. {result.stderr.strip()}"
        )
    if not Path(origin).resolve().is_relative_to(venv.resolve()):
        raise StepFailedError(f"{package.import_name} was imported from {origin}, outside the venv")


def run_tests(venv_python: Path, package: Package, root: Path) -> None:
    """Run the package's tests with the venv's pytest; raise on any failure.

    pytest runs from the package directory, as a developer would run it: Ray workers
    add the driver's working directory to their sys.path, and need it to import
    actor classes defined in test modules (``tests.test_x``).
    """
    tests = package.path / "tests"
    if not tests.is_dir():
        raise StepFailedError(f"{package.name} has no tests directory ({tests})")
    # --durations: the slowest tests in the log, to keep the whole CI under its budget
    command = [str(venv_python), "-m", "pytest", "tests", "-p", "no:cacheprovider"]
    command += ["--durations=15", "-m", f"not {SECOND_LANE}"]
    code = run(command, cwd=package.path, env=child_env())
    if code == PYTEST_NO_TESTS:
        raise StepFailedError(
            f"pytest collected no tests in {tests.relative_to(root)}; "
            "a package must ship tests that run against its installed wheel",
            code,
        )
    if code != 0:
        raise StepFailedError(f"the tests of {package.name} failed (pytest exit code {code})", code)


def build_all_wheels(workspace: Workspace, out_dir: Path) -> list[Path]:
    """Every package's wheel in ``out_dir`` (older wheels of the same packages removed), in
    dependency order: ``pip install --find-links <out_dir> hf-algos`` then installs from them."""
    out_dir.mkdir(parents=True, exist_ok=True)
    built = []
    for package in workspace.topological_order():
        for old in out_dir.glob(f"{package.key.replace('-', '_')}-*.whl"):
            old.unlink()
        scratch = out_dir / f".build-{package.key}"
        shutil.rmtree(scratch, ignore_errors=True)
        wheel = build_wheel(package, scratch, workspace.root)
        built.append(wheel.rename(out_dir / wheel.name))
        shutil.rmtree(scratch)
    return built


def run_package_ci(workspace: Workspace, name: str, python: str, keep: bool) -> int:
    """Run every step for package ``name``; return the process exit code."""
    package = workspace.get(name)
    root = workspace.root
    if "test" not in package.extras:
        raise StepFailedError(
            f"{package.pyproject} has no test extra; add [project.optional-dependencies] "
            "test = [...] listing pytest and whatever the tests import"
        )
    siblings = workspace.sibling_closure(package.name, extras=["test"])
    work = root / ".ci-work" / package.name
    venv = work / "venv"
    timings: list[tuple[str, float]] = []
    shutil.rmtree(work, ignore_errors=True)
    try:
        names = ", ".join(p.name for p in [*siblings, package])
        with step(f"build wheels: {names}", timings):
            wheels = {p.key: build_wheel(p, work / "wheels" / p.key, root) for p in siblings}
            own = build_wheel(package, work / "wheels" / package.key, root)
        with step(f"create a fresh venv in {venv.relative_to(root)}", timings):
            venv_python = create_venv(python, venv, root)
        with step(f"install {own.name}[test] and {len(wheels)} sibling wheel(s)", timings):
            install(venv_python, own, list(wheels.values()), root)
        with step(f"check that {package.import_name} comes from the venv", timings):
            check_import(venv_python, package, venv)
        with step(f"run {package.name} tests against the installed wheel", timings):
            run_tests(venv_python, package, root)
    except StepFailedError as failure:
        print(f"\npackage_ci {package.name}: FAILED: {failure}", file=sys.stderr)
        print(f"(work directory kept for inspection: {work})", file=sys.stderr)
        return failure.code
    if not keep:
        shutil.rmtree(work, ignore_errors=True)
    total = sum(seconds for _, seconds in timings)
    print(f"\npackage_ci {package.name}: PASSED in {total:.1f}s")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse arguments and run; return the process exit code."""
    parser = argparse.ArgumentParser(description="Build, install and test one package alone.")
    parser.add_argument("package", nargs="?", help="package name, e.g. hf-protocol")
    parser.add_argument("--python", default=sys.executable, help="interpreter for the venv")
    parser.add_argument("--keep", action="store_true", help="keep .ci-work/<package> after")
    parser.add_argument("--list", action="store_true", help="print packages in dependency order")
    parser.add_argument("--root", type=Path, default=REPO_ROOT, help="workspace root")
    parser.add_argument("--wheels", type=Path, help="build every package's wheel into this dir")
    args = parser.parse_args(argv)
    if not args.list and not args.package and args.wheels is None:
        parser.error("give a PACKAGE, --list or --wheels DIR")
    try:
        workspace = discover(args.root.resolve())
        if args.list:
            print("\n".join(p.name for p in workspace.topological_order()))
            return 0
        if args.wheels is not None:
            built = build_all_wheels(workspace, args.wheels.resolve())
            print("\n".join(str(wheel) for wheel in built))
            return 0
        return run_package_ci(workspace, args.package, args.python, args.keep)
    except (WorkspaceError, StepFailedError) as error:
        print(f"package_ci: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
