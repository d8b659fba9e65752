"""How the ``hybridflow`` command stops on a signal: SIGTERM as Ctrl-C, one line, 128 + signal.

:func:`stop_on_signals` makes SIGINT (Ctrl-C) and SIGTERM (``kill``, a scheduler's
preemption, ``docker stop``) raise :class:`RunInterrupted`, a ``KeyboardInterrupt``, in the
main thread. Both unwind the same way: the trainer ends its worker processes
(``Trainer.start``/``shutdown``), the command prints one line (:func:`interruption_message`)
and returns ``128 + signal``: 130 for SIGINT, 143 for SIGTERM, as a shell reports a process
a signal ended. Ray's own processes end with the driver's normal exit (``ray.shutdown`` at
exit). Ray replaces a SIGTERM handler when it starts; :func:`hf_controller.ensure_ray` puts
this one back.

A library may catch the interrupt and raise an error of its own instead (torch's
distributed checkpoint writer does, when a local-backend worker saves in the driver's
thread): the signal is remembered, so such an error still counts as the stop it is.
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
    from hf_algos.trainers.lifecycle.trainer import Trainer

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_received: int | None = None  # the first stop signal this process got


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


def stop_on_signals() -> dict[int, Any]:
    """Make SIGINT and SIGTERM raise :class:`RunInterrupted` in the main thread; return the
    handlers replaced (to put back with :func:`restore_handlers`). Outside the main thread,
    where Python refuses signal handlers, nothing changes.

    A second SIGTERM while the run shuts down is ignored, so the shutdown is not cut short
    (SIGKILL still ends the process at once); a second Ctrl-C interrupts the shutdown too.
    """
    if threading.current_thread() is not threading.main_thread():
        return {}

    def on_signal(signum: int, frame: FrameType | None) -> None:
        global _received
        if signum == signal.SIGTERM:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one stop; the shutdown then runs
        _received = _received or signum
        raise RunInterrupted(signum)

    return {signum: signal.signal(signum, on_signal) for signum in _STOP_SIGNALS}


def restore_handlers(previous: dict[int, Any]) -> None:
    """Put back the handlers :func:`stop_on_signals` replaced."""
    for signum, handler in previous.items():
        signal.signal(signum, handler)


def stop_signal(error: BaseException) -> int | None:
    """The signal that stopped the run, if ``error`` is (or came of) a stop; else ``None``."""
    if isinstance(error, RunInterrupted):
        return error.signum
    if isinstance(error, KeyboardInterrupt):
        return _received or signal.SIGINT
    return _received


@contextmanager
def where_stopped(trainer: Trainer) -> Iterator[None]:
    """Inside it, a stop (:func:`stop_signal`) leaves as a :class:`RunInterrupted` that
    says the step ``trainer`` was at and its last checkpoint (no step for an evaluation)."""
    try:
        yield
    except BaseException as error:
        signum = stop_signal(error)
        if signum is None:
            raise
        step = None if trainer.trainer_config.val_only else trainer.global_step
        raise RunInterrupted(signum, step, trainer.run_state.resume_point) from None


def exit_code(signum: int) -> int:
    """``128 + signum``: 130 for SIGINT (Ctrl-C), 143 for SIGTERM."""
    return 128 + signum


def interruption_message(command: str, signum: int, error: BaseException) -> str:
    """The one line the command prints when signal ``signum`` stopped it, e.g.
    ``hybridflow grpo: terminated (SIGTERM) at step 3; workers stopped; last checkpoint
    ckpt/global_step_2 (resume: trainer.resume_mode=path trainer.resume_from=...)``; the
    step and checkpoint come from ``error`` when :func:`where_stopped` raised it."""
    info = error if isinstance(error, RunInterrupted) else RunInterrupted(signum)
    what = "terminated (SIGTERM)" if signum == signal.SIGTERM else "interrupted (Ctrl-C)"
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
