"""Run a batch of environment calls concurrently, each under its own timeout.

The agent loop's ``env.reset`` / ``env.step`` calls of one turn go through
:func:`call_concurrently`: ``concurrency`` daemon threads take calls in order, so one slow
tool does not serialise the batch. A call still running ``timeout_s`` after it *started*
(time queued does not count) is abandoned: a Python thread cannot be killed, so it is left
to finish on its own (a daemon thread, so it never holds up the interpreter's exit; its
result is dropped) and a fresh thread takes its place, keeping ``concurrency`` threads at
work and the batch moving.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["CallOutcome", "call_concurrently"]


@dataclass
class CallOutcome:
    """How one call ended: its ``value``, the ``error`` it raised, or ``timed_out``."""

    value: Any = None
    error: BaseException | None = None
    timed_out: bool = False
    started: float | None = None
    finished: bool = False


def call_concurrently(
    calls: Sequence[Callable[[], Any]], concurrency: int, timeout_s: float
) -> list[CallOutcome]:
    """Run ``calls`` on up to ``concurrency`` threads; their outcomes, in order.

    Returns when every call has finished or timed out (``timeout_s`` after its start), so at
    most about ``ceil(len(calls) / concurrency) * timeout_s`` even if every call hangs.
    """
    outcomes = [CallOutcome() for _ in calls]
    todo: queue.SimpleQueue[int] = queue.SimpleQueue()
    for index in range(len(calls)):
        todo.put(index)
    condition = threading.Condition()

    def work() -> None:
        while True:
            try:
                index = todo.get_nowait()
            except queue.Empty:
                return
            outcome = outcomes[index]
            with condition:
                outcome.started = time.monotonic()
                condition.notify_all()
            value, error = None, None
            try:
                value = calls[index]()
            except BaseException as raised:  # SystemExit too: the caller reports it
                error = raised
            with condition:
                if outcome.timed_out:
                    return  # abandoned: a replacement thread has taken this one's place
                outcome.value, outcome.error, outcome.finished = value, error, True
                condition.notify_all()

    def start_thread() -> None:
        threading.Thread(target=work, name="hf-env-step", daemon=True).start()

    for _ in range(min(concurrency, len(calls))):
        start_thread()
    with condition:
        while True:
            now = time.monotonic()
            running = [(o, o.started) for o in outcomes if not (o.finished or o.timed_out)]
            for outcome, started in running:
                if started is not None and now - started >= timeout_s:
                    outcome.timed_out = True
                    start_thread()
            if all(o.finished or o.timed_out for o in outcomes):
                break
            deadlines = [s + timeout_s for o, s in running if s is not None and not o.timed_out]
            # No deadline yet: the calls left are queued, and a start notifies.
            condition.wait(timeout=min(deadlines) - now if deadlines else None)
    return outcomes
