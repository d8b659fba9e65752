"""What every trainer shares: the run's lifecycle (start, step loop, validation and checkpoint
cadence, resume, restarts, shut-down) and the state its checkpoints keep."""
