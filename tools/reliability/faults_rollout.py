"""Fault cases of the elastic rollout pool: a rollout worker SIGKILLed in a real run.

The real PPO trainer (GRPO, separate placement, one_step_off) trains a tiny random Llama
on the hf-algos tests' toy task: 16 prompts, 4 steps of 4 prompts x 2 samples, one epoch.
Before step 2 trains, the driver SIGKILLs the rollout worker (step 3's batch was just
queued on it; it fails there, or at the next call or weight push when already finished).

* With replacements left (the default ``rollout.max_replacements=2``) the rollout group is
  replaced and the run finishes; every prompt of the epoch must be trained on exactly once.
  The time is from the kill to the end of the first step after the replacement (the
  replacement and the batches generated again included).
* With ``rollout.max_replacements=0`` the worker's own named error ends the run.

One case breaks the weight push instead, with every process alive: before step 1 trains,
the actor's next push is set to flip a byte of its first bucket (the channel's own fault
injection). The push fails with a checksum mismatch; the channel is reopened and the push
made again, the rollout group kept.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from faults import FaultCase, FaultResult
from faults_checkpoints import ALGOS_TESTS, _tiny_model

STEPS = 4
KILL_STEP = 2
CORRUPT_STEP = 1


def _run(
    scratch: Path, max_replacements: int, corrupt: bool = False
) -> tuple[Any, list[Any] | BaseException]:
    """Train with the kill (or, with ``corrupt``, a corrupted weight push); the trainer and
    its history, or the error that ended it."""
    import ray
    import torch

    from hf_algos.config import RLConfig, load_config
    from hf_algos.data import write_rows
    from hf_algos.rewards import SCORING_FUNCTIONS, register_scoring_function

    sys.path.insert(0, str(ALGOS_TESTS))
    from crash_driver import overrides as crash_driver_overrides
    from killing_trainer import CorruptingTrainer, KillingTrainer
    from toy_task import SORT_DIGITS_SOURCE, make_sort_digits_rows, score_sorted_digits

    torch.set_num_threads(1)
    model = _tiny_model(scratch)
    write_rows(make_sort_digits_rows(16, length=3, seed=0), scratch / "train.jsonl")
    overrides = [
        *crash_driver_overrides(model, scratch, STEPS),
        "trainer.backend=ray",
        "trainer.save_freq=0",
        "trainer.resume_mode=disable",
        "trainer.placement=separate",
        "trainer.async_mode=one_step_off",
        "actor.use_rollout_log_probs=false",
        "algorithm.rollout_correction.mode=tis",
        f"rollout.max_replacements={max_replacements}",
    ]
    register_scoring_function(SORT_DIGITS_SOURCE, score_sorted_digits)
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    trainer = None
    try:
        config = load_config(RLConfig, overrides=overrides)
        if corrupt:
            trainer = CorruptingTrainer(config)
            trainer.corrupt_at = (CORRUPT_STEP,)
        else:
            trainer = KillingTrainer(config)
            trainer.kill_at = (KILL_STEP,)
        trainer.prompts = []
        with trainer:
            return trainer, trainer.fit()
    except Exception as error:  # the bounded case ends here, as the user would see
        return trainer, error
    finally:
        SCORING_FUNCTIONS.pop(SORT_DIGITS_SOURCE, None)
        ray.shutdown()
        while str(ALGOS_TESTS) in sys.path:
            sys.path.remove(str(ALGOS_TESTS))


def _every_step_and_prompt_once(trainer: Any, history: list[Any] | BaseException) -> list[Any]:
    """The run's history, once checked that it ended without an error, took all its steps
    and trained on each of the 16 prompts exactly once (its 2 samples)."""
    if isinstance(history, BaseException):
        raise history
    assert [m["training/global_step"] for m in history] == [1.0, 2.0, 3.0, 4.0]
    counts = Counter(trainer.prompts)
    assert len(counts) == 16 and set(counts.values()) == {2}, counts
    return history


def rollout_killed_replaced(scratch: Path) -> FaultResult:
    """The killed rollout is replaced; all steps done, every prompt trained once."""
    trainer, outcome = _run(scratch, max_replacements=2)
    history = _every_step_and_prompt_once(trainer, outcome)
    assert history[-1]["rollout/replaced_total"] == 1.0
    return FaultResult(
        "recovered",
        trainer.recovered_s,
        "nothing (the prompts it held generated again)",
        f"rollout group replaced in {trainer.replacement.seconds:.1f} s "
        f"(rollout/replaced=1); 4 steps done, 16 prompts trained once each",
    )


def rollout_killed_no_replacements(scratch: Path) -> FaultResult:
    """``rollout.max_replacements=0``: the rollout worker's named error ends the run."""
    from hf_controller import WorkerDiedError

    trainer, error = _run(scratch, max_replacements=0)
    assert isinstance(error, WorkerDiedError), f"expected WorkerDiedError, got {error!r}"
    assert trainer is not None and trainer.killed_at is not None
    return FaultResult(
        "named error",
        time.monotonic() - trainer.killed_at,
        "nothing (before the step's update)",
        str(error).splitlines()[0],
    )


def weight_push_corrupted_pushed_again(scratch: Path) -> FaultResult:
    """A push that fails with every process alive is made again; nothing is replaced."""
    trainer, outcome = _run(scratch, max_replacements=2, corrupt=True)
    history = _every_step_and_prompt_once(trainer, outcome)
    assert history[-1]["rollout/repushed_total"] == 1.0, history[-1]
    assert history[-1]["rollout/replaced_total"] == 0.0, history[-1]
    return FaultResult(
        "recovered",
        trainer.replacement.seconds,
        "nothing (the rollout kept its weights until the push arrived whole)",
        f"channel reopened and the push made again in {trainer.replacement.seconds:.2f} s "
        "(rollout/repushed=1, rollout group kept); 4 steps done, 16 prompts trained once each",
    )


FAULTS = [
    FaultCase("rollout worker SIGKILL (one_step_off), replaced", rollout_killed_replaced),
    FaultCase("rollout worker SIGKILL, rollout.max_replacements=0", rollout_killed_no_replacements),
    FaultCase(
        "weight push corrupted, every process alive (one_step_off): pushed again",
        weight_push_corrupted_pushed_again,
    ),
]
