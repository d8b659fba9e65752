"""The Megatron-core engine (needs the ``megatron`` extra: ``pip install hf-engines[megatron]``)."""

from hf_engines.megatron.engine import MegatronEngine

__all__ = ["MegatronEngine"]
