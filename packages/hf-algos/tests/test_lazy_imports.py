"""Lazy package exports: every public name resolves, and light modules stay torch-free."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest


@pytest.mark.parametrize("package", ["hf_algos", "hf_algos.rewards", "hf_algos.data"])
def test_every_public_name_resolves(package: str) -> None:
    module = importlib.import_module(package)
    assert sorted(module.__all__) == sorted(module._WHERE)
    for name in module.__all__:
        assert getattr(module, name) is not None, name
    assert set(module.__all__) <= set(dir(module))
    with pytest.raises(AttributeError, match=f"module '{package}' has no attribute 'nope'"):
        module.nope  # noqa: B018


def test_the_scoring_process_modules_do_not_import_torch() -> None:
    """The reward's scoring processes import these; torch would cost them seconds."""
    code = (
        "import sys\n"
        "import hf_algos.rewards.scoring_worker, hf_algos.examples.letter_tasks\n"
        "from hf_algos.rewards import register_scoring_function\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'tensordict') if m in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert result.stdout.strip() == "", f"imported {result.stdout.strip()}"
