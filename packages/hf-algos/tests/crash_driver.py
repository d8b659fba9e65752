"""A real driver process for the crash tests: a tiny PPO run with a checkpoint every step.

Run as a script (``python crash_driver.py MODEL_DIR ROOT STEPS``): it trains the toy task
with the workers inside this process (``trainer.backend=local``), saving into
``ROOT/ckpt`` every step and resuming from the latest checkpoint there. With
``HF_CHECKPOINT_KILL_AT=<point>@<step>`` set, :class:`~hf_algos.checkpoint.CheckpointManager`
SIGKILLs this process at that point of that step's save. On a clean finish it writes
``ROOT/result.json``: the step it resumed from and the metrics of the steps it ran
(``ROOT/started.json``, the checkpoint it resumes from, is written before training).
Used by ``test_checkpoint.py`` and by ``tools/reliability/faults_checkpoints.py``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # toy_task, run as a script

import torch
from toy_task import SORT_DIGITS_SOURCE, make_sort_digits_rows, score_sorted_digits

from hf_algos.config import RLConfig, load_config
from hf_algos.data import write_rows
from hf_algos.rewards import register_scoring_function
from hf_algos.trainers import PPOTrainer


def overrides(model: Path, root: Path, steps: int) -> list[str]:
    """The run: 4 prompts x 2 samples, 4 new tokens, GRPO, a checkpoint every step."""
    train = root / "train.jsonl"
    if not train.is_file():
        write_rows(make_sort_digits_rows(16, length=3, seed=0), train)
    return [
        f"actor.engine.model.path={model}",
        f"data.train_files=[{train}]",
        "data.train_batch_size=4",
        "rollout.n=2",
        "rollout.max_new_tokens=4",
        "actor.ppo_mini_batch_size=4",
        "actor.engine.micro_batch.micro_batch_size=4",
        "actor.engine.optim.lr=1e-3",
        "actor.use_rollout_log_probs=true",
        f"trainer.total_training_steps={steps}",
        "trainer.loggers=[]",
        "trainer.progress_bar=false",
        "trainer.backend=local",
        "trainer.save_freq=1",
        f"trainer.checkpoint_dir={root / 'ckpt'}",
        "trainer.resume_mode=auto",
        "reward.num_workers=1",
    ]


def main(model: Path, root: Path, steps: int) -> None:
    """Train (resuming if a checkpoint exists) and write ``result.json``."""
    torch.set_num_threads(1)
    register_scoring_function(SORT_DIGITS_SOURCE, score_sorted_digits)
    config = load_config(RLConfig, overrides=overrides(model, root, steps))
    with PPOTrainer(config) as trainer:
        resumed = trainer.checkpoints.latest()
        (root / "started.json").write_text(json.dumps(resumed.name if resumed else None))
        history = trainer.fit()
    result = {"resumed_from": resumed.name if resumed else None, "history": history}
    (root / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]))
