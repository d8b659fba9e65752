"""The command line the recipes share: an optional ``--config`` file and YAML overrides.

Every recipe's ``main.py`` runs as ``python -m recipes.<name>.main [--config FILE]
[key.sub=value ...]``; the overrides are applied to the YAML before it is validated.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path


def parse_recipe_args(
    doc: str | None, default_config: Path, argv: Sequence[str] | None = None
) -> argparse.Namespace:
    """``config`` (a YAML path, ``default_config`` unless ``--config`` is given) and
    ``overrides`` (``key.sub=value`` strings); ``doc``'s first line is the ``--help`` title."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0] if doc else None)
    parser.add_argument("--config", type=Path, default=default_config, help="recipe YAML file")
    parser.add_argument("overrides", nargs="*", help="key.sub=value overrides of the YAML")
    return parser.parse_args(argv)
