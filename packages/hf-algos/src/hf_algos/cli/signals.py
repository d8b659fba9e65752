"""How the ``hybridflow`` command stops on a signal: SIGTERM as Ctrl-C, one line, 128 + signal.

Ctrl-C (SIGINT) raises ``KeyboardInterrupt`` in the main thread; :func:`stop_on_sigterm`
makes SIGTERM (``kill``, a scheduler's preemption, ``docker stop``) raise
:class:`RunInterrupted`, a ``KeyboardInterrupt``, there too. Both then unwind the same
way: the trainer ends its worker processes (``Trainer.start``/``shutdown``), the command
prints one line (:func:`interruption_message`) and returns ``128 + signal``: 130 for
SIGINT, 143 for SIGTERM, as a shell reports a process a signal ended. Ray's own processes
end with the driver's normal exit (``ray.shutdown`` at exit). Ray replaces a SIGTERM
handler when it starts; :func:`hf_controller.ensure_ray` puts this one back.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hf_algos.trainers.base import Trainer


class RunInterrupted(KeyboardInterrupt):
    """The command was stopped by a signal; says which, and where the run was."""

    def __init__(
        self, signum: int = signal.SIGINT, step: int | None = None, checkpoint: Path | None = None
    ) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)
        """The signal: ``SIGINT`` (Ctrl-C) or ``SIGTERM``."""
        self.step = step
        """The step the run was at (``None``: before training started, or not a training)."""
        self.checkpoint = checkpoint
        """The run's last checkpoint, saved or resumed from (``None``: none)."""


def stop_on_sigterm() -> Any:
    """Make SIGTERM raise :class:`RunInterrupted` in the main thread; return the handler
    it replaced (to put back). Outside the main thread, where Python refuses signal
    handlers, nothing changes.

    The first SIGTERM stops the run; one that comes while it shuts down is ignored, so the
    shutdown is not cut short (SIGKILL still ends the process at once).
    """

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one stop; the shutdown then runs
        raise RunInterrupted(signum)

    if threading.current_thread() is not threading.main_thread():
        return signal.getsignal(signal.SIGTERM)
    return signal.signal(signal.SIGTERM, on_sigterm)


@contextmanager
def where_stopped(trainer: Trainer) -> Iterator[None]:
    """Inside it, Ctrl-C's ``KeyboardInterrupt`` or SIGTERM's :class:`RunInterrupted`
    leaves as a :class:`RunInterrupted` that says the step ``trainer`` was at and its last
    checkpoint (the step is left out for an evaluation)."""
    try:
        yield
    except KeyboardInterrupt as stop:
        signum = stop.signum if isinstance(stop, RunInterrupted) else signal.SIGINT
        step = None if trainer.trainer_config.val_only else trainer.global_step
        raise RunInterrupted(signum, step, trainer.run_state.resume_point) from None


def exit_code(stop: KeyboardInterrupt) -> int:
    """``128 + signal``: 130 for SIGINT (Ctrl-C), 143 for SIGTERM."""
    return 128 + (stop.signum if isinstance(stop, RunInterrupted) else signal.SIGINT)


def interruption_message(command: str, stop: KeyboardInterrupt) -> str:
    """The one line the command prints when a signal stopped it, e.g. ``hybridflow grpo:
    terminated (SIGTERM) at step 3; workers stopped; last checkpoint ckpt/global_step_2
    (resume: trainer.resume_mode=path trainer.resume_from=ckpt/global_step_2)``."""
    info = stop if isinstance(stop, RunInterrupted) else RunInterrupted()
    what = "terminated (SIGTERM)" if info.signum == signal.SIGTERM else "interrupted (Ctrl-C)"
    where = f" at step {info.step}" if info.step is not None else ""
    line = f"hybridflow {command}: {what}{where}; workers stopped"
    if info.checkpoint is not None:
        return (
            f"{line}; last checkpoint {info.checkpoint} (resume: trainer.resume_mode=path "
            f"trainer.resume_from={info.checkpoint})"
        )
    if info.step:
        return f"{line}; no checkpoint saved yet (trainer.save_freq)"
    return line
