"""The controller-only recipe runs in this package's own environment (no torch installed).

The recipe lives in the repository's ``recipes/`` folder, outside the package; from a
source checkout the per-package CI runs it here, in a venv holding only hf-controller's
declared dependencies, which proves a non-RL job needs nothing but Ray.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]
RECIPE = REPO_ROOT / "recipes" / "parallel_map" / "main.py"


@pytest.mark.skipif(not RECIPE.is_file(), reason="not in a source checkout: no recipes/ folder")
@pytest.mark.parametrize("fanout", ["16", "1"], ids=["default", "through-relays"])
def test_parallel_map_recipe_runs_without_torch(tmp_path: Path, fanout: str) -> None:
    command = [
        sys.executable,
        "-m",
        "recipes.parallel_map.main",
        "--small",
        "--output-dir",
        str(tmp_path),
    ]
    env = {**os.environ, "HF_CONTROLLER_RELAY_FANOUT": fanout}  # "1": every call via relays
    run = subprocess.run(
        command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, env=env
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "speed-up" in run.stdout
    assert (tmp_path / "result.json").is_file()
