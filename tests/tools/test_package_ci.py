"""Tests for tools/package_ci.py on a fake workspace."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import package_ci
import pytest
import workspace

SCRIPT = Path(package_ci.__file__)


def test_list_prints_packages_in_dependency_order_when_run_as_a_script(
    workspace_root: Path, make_package: Callable[..., Path]
) -> None:
    make_package("aa-app", "0.1.0", dependencies=["hf-beta>=0.3,<0.4"])

    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--list", "--root", str(workspace_root)],
        capture_output=True,
        text=True,
        check=False,
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["hf-alpha", "hf-beta", "aa-app"]


def test_package_or_list_is_required(workspace_root: Path) -> None:
    with pytest.raises(SystemExit) as usage_error:
        package_ci.main(["--root", str(workspace_root)])

    assert usage_error.value.code == 2


def test_unknown_package_is_reported(
    workspace_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = package_ci.main(["hf-nope", "--root", str(workspace_root)])

    assert code == 1
    assert "known packages: hf-alpha, hf-beta" in capsys.readouterr().err


def test_package_without_test_extra_fails_before_building(
    workspace_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pyproject = workspace_root / "packages" / "hf-alpha" / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('test = ["pytest>=8"]\n', ""))

    code = package_ci.main(["hf-alpha", "--root", str(workspace_root)])

    assert code == 1
    assert "has no test extra" in capsys.readouterr().err
    assert not (workspace_root / ".ci-work").exists()


@pytest.mark.slow
def test_full_run_installs_wheels_and_tests_them(
    workspace_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Real pip, real venv: hf-beta's wheel plus hf-alpha's wheel, then hf-beta's own test
    # (which asserts it imported hf_beta from site-packages). Needs pytest from an index.
    code = package_ci.main(["hf-beta", "--root", str(workspace_root)])

    out = capsys.readouterr().out
    assert code == 0, out
    assert "build wheels: hf-alpha, hf-beta" in out
    assert "hf_beta -> " in out
    assert "package_ci hf-beta: PASSED" in out
    assert not (workspace_root / ".ci-work" / "hf-beta").exists()


def test_no_tests_collected_is_a_failure(workspace_root: Path) -> None:
    # The current interpreter stands in for the CI venv: it has pytest, that is all we need.
    alpha = workspace.discover(workspace_root).get("hf-alpha")
    for test_file in (alpha.path / "tests").glob("*.py"):
        test_file.unlink()

    with pytest.raises(package_ci.StepFailedError) as failure:
        package_ci.run_tests(Path(sys.executable), alpha, workspace_root)

    assert failure.value.code == package_ci.PYTEST_NO_TESTS
    assert "pytest collected no tests in packages/hf-alpha/tests" in str(failure.value)


def test_failing_tests_propagate_pytest_exit_code(workspace_root: Path) -> None:
    alpha = workspace.discover(workspace_root).get("hf-alpha")
    (alpha.path / "tests" / "test_hf_alpha.py").write_text(
        "def test_fails() -> None:\n    assert 0\n"
    )

    with pytest.raises(package_ci.StepFailedError) as failure:
        package_ci.run_tests(Path(sys.executable), alpha, workspace_root)

    assert failure.value.code == 1
    assert "the tests of hf-alpha failed (pytest exit code 1)" in str(failure.value)


def test_tests_never_see_the_package_sources(workspace_root: Path) -> None:
    # hf_alpha is not installed in this interpreter, and run_tests must not reach into
    # packages/hf-alpha/src for it, so importing it fails at collection (exit code 2).
    alpha = workspace.discover(workspace_root).get("hf-alpha")

    with pytest.raises(package_ci.StepFailedError) as failure:
        package_ci.run_tests(Path(sys.executable), alpha, workspace_root)

    assert failure.value.code == 2


@pytest.mark.slow
def test_wheels_builds_every_package_into_one_folder(workspace_root: Path, tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    dist.mkdir()
    (dist / "hf_alpha-0.0.1-py3-none-any.whl").write_text("an older build")
    code = package_ci.main(["--wheels", str(dist), "--root", str(workspace_root)])
    assert code == 0
    names = sorted(p.name for p in dist.iterdir())
    assert [n.split("-")[0] for n in names] == ["hf_alpha", "hf_beta"]  # the old one replaced
    assert all(n.endswith(".whl") for n in names)


def test_every_real_package_registers_the_second_lane_marker() -> None:
    """Both lanes select on ``second_lane``; under --strict-markers an unregistered one fails."""
    import tomllib

    root = Path(__file__).resolve().parents[2]
    missing = []
    for pyproject in sorted((root / "packages").glob("*/pyproject.toml")):
        pytest_config = tomllib.loads(pyproject.read_text())["tool"]["pytest"]["ini_options"]
        names = [marker.split(":")[0].strip() for marker in pytest_config.get("markers", [])]
        if package_ci.SECOND_LANE not in names:
            missing.append(pyproject.parent.name)
    assert not missing, f"register the {package_ci.SECOND_LANE!r} marker in: {missing}"
