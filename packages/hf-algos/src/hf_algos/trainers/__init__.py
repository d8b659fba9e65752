"""Trainers (drivers): PPO and its critic-free relatives, DPO (offline and online), SFT.

Public names are imported on first use (``__init__.pyi`` lists them, for type checkers and
``lazy_loader``): the ``hybridflow`` command reads :mod:`hf_algos.trainers.roles.placement`
(torch-free) to start the worker processes before it imports the trainers.
"""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
