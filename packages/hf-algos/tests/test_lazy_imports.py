"""Lazy package exports: every public name resolves, and light modules stay torch-free."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    "package", ["hf_algos", "hf_algos.rewards", "hf_algos.data", "hf_algos.trainers"]
)
def test_every_public_name_resolves(package: str) -> None:
    """``__all__`` is read from the package's ``__init__.pyi`` (lazy_loader.attach_stub)."""
    module = importlib.import_module(package)
    assert len(module.__all__) > 5
    for name in module.__all__:
        assert getattr(module, name) is not None, name
    assert set(module.__all__) <= set(dir(module))
    with pytest.raises(AttributeError, match="nope"):
        module.nope  # noqa: B018


def heavy_imports(code: str) -> str:
    """The heavy modules (torch, transformers, tensordict) a fresh interpreter holds after
    running ``code``, comma-separated ("" when none)."""
    check = (
        "\nimport sys\n"
        "print(','.join(m for m in ('torch', 'transformers', 'tensordict') if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code + check],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return result.stdout.strip()


def test_the_scoring_process_modules_do_not_import_torch() -> None:
    """The reward's scoring processes import these (the packaged configs' reward file
    included); torch would cost them seconds."""
    code = (
        "import runpy\n"
        "import hf_algos.rewards.scoring_worker, hf_algos.examples.letter_tasks\n"
        "from hf_algos.examples.assets import _reward_file\n"
        "runpy.run_path(_reward_file())\n"
        "from hf_algos.rewards import register_scoring_function\n"
    )
    assert heavy_imports(code) == ""


def test_composing_a_command_config_does_not_import_torch() -> None:
    """``hybridflow`` composes the config, then starts Ray, then imports torch (the checks and
    the trainers): the composition must stay light for Ray's start to overlap the imports."""
    code = (
        "from hf_algos.cli.main import COMMANDS, build_parser, compose_command_config\n"
        "args = build_parser().parse_args(['grpo', '--config-name', 'quickstart'])\n"
        "tree = compose_command_config(COMMANDS['grpo'], args)\n"
        "assert tree.trainer.backend == 'ray', tree.trainer.backend\n"
    )
    assert heavy_imports(code) == ""
