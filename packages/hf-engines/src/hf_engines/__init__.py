"""hf-engines: training engines behind one small interface (FSDP2 and Megatron-core).

Public names are imported on first use, so the light modules (``hf_engines.config``,
``hf_engines.hub``) do not import torch or transformers: a config can be read, checked and
composed before the heavy imports (the ``hybridflow`` command starts Ray meanwhile).
``MegatronEngine`` stays behind its optional extra (megatron-core) the same way.
``__init__.pyi`` is the one list of the public names: type checkers read it, and
``lazy_loader`` reads its imports to know where each name lives.
"""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _distribution_version

import lazy_loader

try:  # the installed distribution's version, so it cannot drift from pyproject.toml
    __version__ = _distribution_version("hf-engines")
except PackageNotFoundError:  # a source tree on sys.path that was never installed
    __version__ = "0+unknown"

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
