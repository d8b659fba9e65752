"""Rollout backends: ``native`` (pure torch over transformers), ``vllm``, ``sglang``.

Import a backend module directly, or build one by name with ``hf_rollout.build_rollout``;
the optional ones import their engine library only when used.
"""

__all__: list[str] = []
