"""Rewards: rule-based scoring by ``data_source`` in worker processes, and reward models.

Public names are imported on first use, so importing one light submodule does not import
torch. ``__init__.pyi`` is their one list (read by type checkers and ``lazy_loader``)."""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
