"""GRPO on GSM8K (see README.md)."""
