"""hf-algos: RL algorithm math (advantages, losses, KL, DPO), rewards and data for HybridFlow.

Public names are imported on first use, so importing one light submodule does not import
torch. ``__init__.pyi`` is their one list: type checkers read it, and ``lazy_loader`` reads
its imports to know where each name lives."""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _distribution_version

import lazy_loader

try:  # the installed distribution's version, so it cannot drift from pyproject.toml
    __version__ = _distribution_version("hf-algos")
except PackageNotFoundError:  # a source tree on sys.path that was never installed
    __version__ = "0+unknown"

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
