"""GSM8K data for the gsm8k_grpo and gsm8k_ppo recipes: preparation and a tiny synthetic copy."""
