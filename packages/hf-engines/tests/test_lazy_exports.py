"""The package's public names are imported on first use; its config modules stay light."""

from __future__ import annotations

import subprocess
import sys

import pytest

import hf_engines


def test_every_public_name_resolves() -> None:
    assert len(hf_engines.__all__) > 5  # read from __init__.pyi (lazy_loader.attach_stub)
    for name in hf_engines.__all__:
        if name == "MegatronEngine":  # behind the optional megatron extra
            continue
        assert getattr(hf_engines, name) is not None, name
    assert set(hf_engines.__all__) <= set(dir(hf_engines))
    with pytest.raises(AttributeError, match="nope"):
        hf_engines.nope  # noqa: B018


def test_config_modules_do_not_import_torch() -> None:
    """A trainer config is composed and checked from these before torch is imported."""
    code = (
        "import sys\n"
        "import hf_engines.config, hf_engines.hub\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'tensordict') if m in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert result.stdout.strip() == "", f"imported {result.stdout.strip()}"
