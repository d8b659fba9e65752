"""Runnable recipes: each folder composes the HybridFlow packages into one job.

Recipes are entry points, not library code: nothing under ``packages/`` imports
them. The package marker lets ``python -m recipes.<name>.main`` run from the
repository root and lets Ray workers import a recipe's worker classes.
"""
