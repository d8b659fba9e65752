"""An elastic rollout pool: a SIGKILLed rollout worker is replaced and the run goes on.

Real runs on Ray, separate placement: the driver SIGKILLs the rollout group's worker at a
chosen step. The group is replaced (new process, model, weight channel, current weights),
the prompts it held are generated again, and every prompt of the epoch (16 rows, 4 steps
of 4) is trained on exactly once. A stopped worker (SIGSTOP) is replaced once its call's
deadline passes. A weight push that fails with every process alive (a corrupted bucket) is
pushed again over a reopened channel. Past ``rollout.max_replacements`` the worker's own
error ends the run.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from hf_algos.config import RLConfig, load_config
from hf_controller import WorkerDiedError, WorkerGroupError
from hf_protocol import DataProto
from hf_rollout import WeightIntegrityError

from .killing_trainer import CorruptingTrainer, KillingTrainer
from .trainer_helpers import common_overrides, task_files

ROWS = 16
SAMPLES = 2
ONE_STEP_OFF = ("trainer.async_mode=one_step_off", "algorithm.rollout_correction.mode=tis")


def _run(
    overrides: list[str], kill_at: tuple[int, ...], signal_number: int = signal.SIGKILL
) -> tuple[KillingTrainer, list[Any]]:
    torch.set_num_threads(1)
    trainer = KillingTrainer(load_config(RLConfig, overrides=overrides))
    trainer.kill_at, trainer.prompts = kill_at, []
    trainer.signal_number = signal_number
    with trainer:
        history = trainer.fit()
    return trainer, history


def _overrides(model: Path, root: Path, *extra: str) -> list[str]:
    train, _ = task_files(root)
    return [
        *common_overrides(model, root, train, steps=ROWS // 4),
        "trainer.placement=separate",
        "trainer.resume_mode=disable",
        *extra,
    ]


def _assert_exactly_once(prompts: list[str], root: Path) -> None:
    rows = [line for line in (root / "train.jsonl").read_text().splitlines() if line]
    counts = Counter(prompts)
    assert len(counts) == ROWS == len(rows), counts
    assert set(counts.values()) == {SAMPLES}, counts  # every prompt once, n samples each


def test_one_step_off_replaces_a_killed_rollout_and_trains_every_prompt_once(
    ray_session: Any, toy_task_scored: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    overrides = _overrides(tiny_model_dir, tmp_path, *ONE_STEP_OFF)
    trainer, history = _run(overrides, kill_at=(2,))
    assert len(history) == ROWS // 4
    assert trainer.replacement.total == 1
    assert [m["rollout/replaced"] for m in history].count(1.0) == 1
    assert history[-1]["rollout/replaced_total"] == 1.0
    _assert_exactly_once(trainer.prompts, tmp_path)


class DeadAtCheckpoint(KillingTrainer):
    """Kills the rollout before step 2 trains and puts step 3's generation on the dead
    worker (issued again once Ray knows it is dead), so the generation is still in flight,
    deterministically, when step 2's checkpoint records what is in flight."""

    def train_step(self, batch: DataProto) -> dict[str, float]:
        if self.global_step in self.kill_at:
            self._signal_rollout()
            name = str(self.roles.rollout.name)
            deadline = time.monotonic() + 60
            while not any(w.startswith(name) for w in self.roles.dead_workers(timeout_s=5)):
                assert time.monotonic() < deadline, "Ray never reported the killed rollout"
                time.sleep(0.2)
            pipeline = self.pipeline
            assert pipeline is not None
            for job in pipeline.queue:  # what was generating when the worker died
                job.handles, job.output = None, None
                pipeline._issue(job)
            self.kill_at = ()
        return super().train_step(batch)


def test_a_rollout_dead_at_a_checkpoint_is_replaced_not_restarted(
    ray_session: Any, toy_task_scored: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The checkpoint after step 2 meets the dead worker first (its record of the
    generations in flight): that replaces the rollout, as any other rollout call does (the
    chaos soak once saw a restart there instead)."""
    overrides = _overrides(
        tiny_model_dir,
        tmp_path,
        *ONE_STEP_OFF,
        "trainer.save_freq=2",
        f"trainer.checkpoint_dir={tmp_path / 'ckpt'}",
        "trainer.max_restarts=0",  # a restart would end the run with the worker's error
    )
    torch.set_num_threads(1)
    trainer = DeadAtCheckpoint(load_config(RLConfig, overrides=overrides))
    trainer.kill_at, trainer.prompts = (2,), []
    with trainer:
        history = trainer.fit()
    assert (trainer.replacement.total, trainer.restarts) == (1, 0)
    assert [m["rollout/replaced"] for m in history] == [0.0, 0.0, 1.0, 0.0]
    assert (tmp_path / "ckpt" / "global_step_2").is_dir()
    _assert_exactly_once(trainer.prompts, tmp_path)


def test_sync_separate_replaces_then_stops_at_the_bound(
    ray_session: Any, toy_task_scored: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    overrides = _overrides(tiny_model_dir, tmp_path / "a", "rollout.max_replacements=1")
    trainer, history = _run(overrides, kill_at=(2,))
    assert trainer.replacement.total == 1
    assert [m["rollout/replaced"] for m in history] == [0.0, 1.0, 0.0, 0.0]
    _assert_exactly_once(trainer.prompts, tmp_path / "a")

    # a second death with the bound used up: the worker's own error, with a note
    overrides = _overrides(tiny_model_dir, tmp_path / "b", "rollout.max_replacements=1")
    with pytest.raises(WorkerDiedError, match="rollout") as caught:
        _run(overrides, kill_at=(2, 3))
    assert "rollout.max_replacements=1" in "".join(getattr(caught.value, "__notes__", []))


def test_a_stuck_rollout_is_replaced_after_its_deadline(
    ray_session: Any, toy_task_scored: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """SIGSTOP: the worker lives but never answers; its call's deadline names it, and the
    replacement ends it."""
    overrides = _overrides(tiny_model_dir, tmp_path)
    trainer, history = _run(overrides, kill_at=(2,), signal_number=signal.SIGSTOP)
    assert trainer.replacement.total == 1
    assert [m["rollout/replaced"] for m in history] == [0.0, 1.0, 0.0, 0.0]
    _assert_exactly_once(trainer.prompts, tmp_path)


def _corrupting_run(overrides: list[str], corrupt_at: tuple[int, ...]) -> tuple[Any, list[Any]]:
    torch.set_num_threads(1)
    trainer = CorruptingTrainer(load_config(RLConfig, overrides=overrides))
    trainer.corrupt_at, trainer.prompts = corrupt_at, []
    with trainer:
        history = trainer.fit()
    return trainer, history


def test_a_failed_push_with_every_process_alive_is_pushed_again_not_replaced(
    ray_session: Any, toy_task_scored: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """one_step_off: the push started at step 2 fails (a corrupted bucket, found when step
    3 waits for it); the channel is reopened and the push made again, the rollout group
    kept, and every prompt trained once."""
    overrides = _overrides(tiny_model_dir, tmp_path, *ONE_STEP_OFF)
    trainer, history = _corrupting_run(overrides, corrupt_at=(1,))
    assert (trainer.replacement.repushes, trainer.replacement.total) == (1, 0)
    assert [m["rollout/repushed"] for m in history].count(1.0) == 1
    assert history[-1]["rollout/repushed_total"] == 1.0
    assert history[-1]["rollout/replaced_total"] == 0.0
    _assert_exactly_once(trainer.prompts, tmp_path)


def test_a_failed_push_past_the_bound_ends_the_run_with_its_own_error(
    ray_session: Any, toy_task_scored: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Sync separate placement, ``rollout.max_replacements=0``: the push's own error, the
    checksum mismatch named, with a note naming the bound."""
    overrides = _overrides(tiny_model_dir, tmp_path, "rollout.max_replacements=0")
    with pytest.raises(WorkerGroupError, match="checksum mismatch") as caught:
        _corrupting_run(overrides, corrupt_at=(2,))
    assert isinstance(caught.value.__cause__, WeightIntegrityError)
    assert "rollout.max_replacements=0" in "".join(getattr(caught.value, "__notes__", []))
