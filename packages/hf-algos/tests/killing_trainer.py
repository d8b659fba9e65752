"""Real PPO trainers that break their own rollout on purpose, for the elastic rollout
pool's checks: ``test_rollout_replacement.py`` and the fault table's
``tools/reliability/faults_rollout.py`` (which imports this file by path, so it has no
relative imports).

Before each step listed in :attr:`KillingTrainer.kill_at` trains (in an async mode, while
the next batch is generated), the driver sends the rollout group's rank 0 a signal:
SIGKILL (it dies) or SIGSTOP (it lives but never answers; the group's calls then get a
deadline of :attr:`KillingTrainer.stuck_deadline_s`). It records the prompts of every
step it trains on and the time from the first signal to the end of the first step after a
replacement. :class:`CorruptingTrainer` instead corrupts the actor's next weight push, with
every process alive.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import ray

from hf_algos.trainers import PPOTrainer
from hf_protocol import DataProto, fields


class KillingTrainer(PPOTrainer):
    """:class:`PPOTrainer` that signals its rollout worker before the steps ``kill_at``."""

    kill_at: tuple[int, ...] = ()
    signal_number: int = signal.SIGKILL
    stuck_deadline_s: float = 10.0
    """The rollout group's call deadline once its worker was stopped (SIGSTOP)."""
    prompts: list[str]
    """The raw prompt of every sample trained on, in order (set to ``[]`` before ``fit``)."""
    killed_at: float | None = None
    """``time.monotonic()`` of the first signal."""
    recovered_s: float | None = None
    """Seconds from the first signal to the end of the first step after a replacement."""

    def train_step(self, batch: DataProto) -> dict[str, float]:
        """Signal the rollout worker when this step is listed, then train the step."""
        if self.global_step in self.kill_at:
            self._signal_rollout()
        metrics = super().train_step(batch)
        replaced = self.replacement.total > 0
        if replaced and self.recovered_s is None and self.killed_at is not None:
            self.recovered_s = time.monotonic() - self.killed_at
        return metrics

    def update(self, batch: DataProto, metrics: Any, timing: Any) -> None:
        """Record the step's prompts, then update as usual."""
        self.prompts += [str(p) for p in batch.non_tensor_batch[fields.RAW_PROMPT]]
        super().update(batch, metrics, timing)

    def _signal_rollout(self) -> None:
        rollout: Any = self.roles.live_rollout  # the group itself: its deadline is set below
        pid = ray.get(rollout.workers[0]._hf_process_info.remote())["pid"]
        if self.signal_number == signal.SIGSTOP:  # a deadline on this group's calls only
            rollout.call_timeout_s = self.stuck_deadline_s
        os.kill(int(pid), self.signal_number)
        if self.killed_at is None:
            self.killed_at = time.monotonic()


class CorruptingTrainer(KillingTrainer):
    """Records its prompts as :class:`KillingTrainer` does (it signals nothing here). Before
    the steps ``corrupt_at`` train, the actor's next weight push is set to flip a
    byte of its first bucket (the channel's own fault injection): the push fails on every
    rank with a checksum mismatch while every process lives."""

    corrupt_at: tuple[int, ...] = ()

    def train_step(self, batch: DataProto) -> dict[str, float]:
        """Corrupt the next push when this step is listed, then train the step."""
        if self.global_step in self.corrupt_at:

            def corrupt_next_push(worker: Any) -> None:
                from hf_rollout.weight_sync import WeightFaults

                roles = getattr(worker, "workers", {})  # a colocated worker's roles
                for member in [worker, *roles.values()]:
                    sender = getattr(member, "_weight_sender", None)
                    channel = None if sender is None else sender.channel
                    if channel is not None:  # rank 0: the sender
                        channel.faults = WeightFaults(push=channel.pushes + 1, corrupt_bucket=0)

            self.roles.actor.execute_all_sync("execute_with_func", corrupt_next_push)
        return super().train_step(batch)
