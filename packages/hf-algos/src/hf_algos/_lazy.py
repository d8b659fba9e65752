"""Lazy package exports (PEP 562): a package's public names are imported on first use.

The reward's scoring processes and the data files only need small torch-free modules of
hf-algos, but a package ``__init__`` that imports its submodules eagerly pulls in torch,
tensordict and transformers (4-5 s per process on 2 cores). A package lists where each
public name lives; the submodule is imported when the name is first read.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, where: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package`` whose names live in submodules.

    ``where`` maps each public name to its module's name relative to ``package`` (``".pool"``)
    or absolute. The value is cached in the package's namespace on first access.
    """
    namespace = importlib.import_module(package).__dict__

    def getattr_(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where[name], package), name)
        namespace[name] = value
        return value

    def dir_() -> list[str]:
        return sorted(set(namespace) | set(where))

    return getattr_, dir_
