"""PPO and its critic-free relatives: the trainer and its step (``trainer``), DAPO's dynamic
sampling, the trainer side of multi-turn rollouts and held-out evaluation."""
