"""Parallel map-reduce over a directory of text files, with hf-controller alone.

Run it from the repository root: ``python -m recipes.parallel_map.main``.
"""
