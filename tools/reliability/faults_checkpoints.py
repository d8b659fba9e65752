"""Fault cases of checkpoints and restarts: a driver killed while saving, a worker killed
mid-training with ``trainer.max_restarts`` on, a damaged latest checkpoint on resume.

Both run the real PPO trainer on a tiny random Llama and the hf-algos tests' toy task
(``packages/hf-algos/tests/toy_task.py``); the first drives
``packages/hf-algos/tests/crash_driver.py`` in a subprocess and SIGKILLs it through
``CheckpointManager``'s ``HF_CHECKPOINT_KILL_AT`` hook.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from faults import FaultCase, FaultResult, first_line, stopwatch, tiny_grpo_task

REPO = Path(__file__).resolve().parents[2]
ALGOS_TESTS = REPO / "packages" / "hf-algos" / "tests"


def _tiny_model(scratch: Path) -> Path:
    from hf_algos.data import build_char_tokenizer
    from hf_engines.testing import build_tiny_model

    directory = build_tiny_model(scratch / "tiny", "llama")
    build_char_tokenizer(directory, chat_template=None)
    return directory


def _drive(model: Path, root: Path, steps: int, kill_at: str | None) -> int:
    from hf_algos.checkpoint import KILL_AT_ENV

    env = {k: v for k, v in os.environ.items() if k != KILL_AT_ENV}
    if kill_at is not None:
        env[KILL_AT_ENV] = kill_at
    command = [sys.executable, str(ALGOS_TESTS / "crash_driver.py"), str(model), str(root)]
    return subprocess.run([*command, str(steps)], env=env, capture_output=True).returncode


def driver_killed_during_save(scratch: Path) -> FaultResult:
    """SIGKILL the driver after step 2's trainer state is written, before the rename; the
    next run must resume from step 1's checkpoint and finish."""
    from hf_algos.checkpoint import CheckpointManager

    model = _tiny_model(scratch)
    code = _drive(model, scratch, 2, "state@2")
    assert code == -signal.SIGKILL, f"the driver was not killed by the hook (exit {code})"
    latest = CheckpointManager(scratch / "ckpt").latest()
    assert latest is not None and latest.name == "global_step_1", f"latest is {latest}"
    with stopwatch() as elapsed:
        code = _drive(model, scratch, 2, None)
        seconds = elapsed()
    assert code == 0, f"the resumed run failed (exit {code})"
    result = json.loads((scratch / "result.json").read_text())
    assert result["resumed_from"] == "global_step_1", result["resumed_from"]
    assert [m["training/global_step"] for m in result["history"]] == [2.0]
    leftovers = [p.name for p in (scratch / "ckpt").iterdir() if p.name.startswith(".tmp-")]
    assert not leftovers, f"unfinished saves were not cleaned up: {leftovers}"
    return FaultResult(
        "recovered",
        seconds,
        "steps since the last checkpoint (1)",
        "next run resumed from global_step_1 (the interrupted save was never visible)",
    )


def _killing_trainer(config: Any, kill_step: int) -> Any:
    """A real PPO trainer that SIGKILLs rank 1 of its training group before the actor
    update of ``kill_step`` (once) and times the recovery to the next completed step."""
    import ray

    from hf_algos.trainers import PPOTrainer

    class KillingTrainer(PPOTrainer):
        killed_at: float | None = None
        recovered_s: float | None = None

        def update(self, batch: Any, metrics: Any, timing: Any) -> None:
            if self.global_step == kill_step and self.killed_at is None:
                group: Any = self.roles.owned[0]
                pid = ray.get(group.workers[1]._hf_process_info.remote())["pid"]
                os.kill(int(pid), signal.SIGKILL)
                self.killed_at = time.monotonic()
            super().update(batch, metrics, timing)

        def train_step(self, batch: Any) -> Any:
            metrics = super().train_step(batch)
            if self.killed_at is not None and self.recovered_s is None:
                self.recovered_s = time.monotonic() - self.killed_at
            return metrics

    return KillingTrainer(config)


def worker_killed_mid_training(scratch: Path) -> FaultResult:
    """SIGKILL one of two workers during step 2 of 3 (checkpoint every step) with
    ``trainer.max_restarts=1``; the run must re-create its groups and finish all steps."""
    import ray
    import torch

    from hf_algos.config import RLConfig, load_config
    from hf_algos.rewards import SCORING_FUNCTIONS, register_scoring_function

    # the toy task and the crash driver's run; the scoring processes import toy_task too
    sys.path.insert(0, str(ALGOS_TESTS))
    from crash_driver import overrides as crash_driver_overrides
    from toy_task import SORT_DIGITS_SOURCE, score_sorted_digits

    torch.set_num_threads(1)
    model = _tiny_model(scratch)
    overrides = [
        *crash_driver_overrides(model, scratch, 3),
        "trainer.backend=ray",
        "trainer.n_workers=2",
        "trainer.max_restarts=1",
    ]
    register_scoring_function(SORT_DIGITS_SOURCE, score_sorted_digits)
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        with _killing_trainer(load_config(RLConfig, overrides=overrides), 2) as trainer:
            history = trainer.fit()
            restarts, recovered_s = trainer.restarts, trainer.recovered_s
    finally:
        SCORING_FUNCTIONS.pop(SORT_DIGITS_SOURCE, None)
        ray.shutdown()
        while str(ALGOS_TESTS) in sys.path:
            sys.path.remove(str(ALGOS_TESTS))
    assert restarts == 1, f"expected one restart, got {restarts}"
    assert [m["training/global_step"] for m in history] == [1.0, 2.0, 3.0]
    assert recovered_s is not None
    return FaultResult(
        "recovered",
        recovered_s,
        "steps since the last checkpoint (1)",
        "groups re-created, resumed from global_step_1, all 3 steps done",
    )


def _hybridflow_run(scratch: Path) -> list[str]:
    """The real ``hybridflow grpo`` command on a tiny model: 3 steps, a checkpoint each."""
    return [
        *(sys.executable, "-m", "hf_algos", "grpo"),
        *tiny_grpo_task(scratch),
        *("data.train_batch_size=4", "rollout.n=2", "rollout.max_new_tokens=4"),
        *("actor.ppo_mini_batch_size=8", "trainer.loggers=[]", "trainer.save_freq=1"),
        *("trainer.backend=local", "trainer.progress_bar=false", "reward.num_workers=1"),
        f"trainer.checkpoint_dir={scratch / 'ckpt'}",
    ]


def damaged_latest_checkpoint(scratch: Path) -> FaultResult:
    """Truncate a shard of the newest of two checkpoints and resume with the real command:
    it must stop in one line (exit 2) naming the damaged file and the good one, and with
    ``trainer.resume_fallback=previous`` resume from that one and finish."""
    command = _hybridflow_run(scratch)
    run = subprocess.run([*command, "trainer.total_training_steps=2"], capture_output=True)
    assert run.returncode == 0, run.stderr.decode()[-2000:]
    shard = scratch / "ckpt" / "global_step_2" / "actor" / "dcp" / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:1000])
    resume = [*command, "trainer.total_training_steps=3"]
    with stopwatch() as elapsed:
        refused = subprocess.run(resume, capture_output=True, text=True)
        seconds = elapsed()
    said = refused.stderr.strip().splitlines()[-1] if refused.stderr.strip() else ""
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-2000:]
    assert "global_step_2' is damaged: actor/dcp/__0_0.distcp has 1000 bytes" in said, said
    assert "trainer.resume_fallback=previous" in said and "global_step_1" in said, said
    taken = subprocess.run(
        [*resume, "trainer.resume_fallback=previous"], capture_output=True, text=True
    )
    assert taken.returncode == 0, taken.stderr[-2000:]
    assert "(resumed at step 1)" in taken.stdout, taken.stdout[-2000:]
    assert (scratch / "ckpt" / "damaged-global_step_2").is_dir(), "the damaged one was deleted"
    return FaultResult(
        "named error",
        seconds,
        "nothing (resume_fallback=previous re-runs 1 step)",
        first_line(said.split("configuration error: ", 1)[-1]),
    )


FAULTS = [
    FaultCase("driver SIGKILL during checkpoint save", driver_killed_during_save),
    FaultCase("worker SIGKILL mid-training, restarts on", worker_killed_mid_training),
    FaultCase("damaged latest checkpoint on resume", damaged_latest_checkpoint),
]
