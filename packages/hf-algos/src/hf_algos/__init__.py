"""hf-algos: RL algorithm math (advantages, losses, KL, DPO), rewards and data for HybridFlow."""

__version__ = "0.1.0"

__all__: list[str] = []
