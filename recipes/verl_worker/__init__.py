"""A verl user's custom workers (online DPO) on HybridFlow, only the imports changed."""
