"""Compatibility modules: other frameworks' names and semantics over hf-controller."""
