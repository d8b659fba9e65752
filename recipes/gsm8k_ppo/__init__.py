"""PPO on GSM8K (see README.md)."""
