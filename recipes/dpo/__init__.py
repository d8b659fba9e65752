"""Offline DPO from a local preference dataset (see README.md)."""
