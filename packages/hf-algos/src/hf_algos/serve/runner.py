"""One thread per served model: its calls run there one at a time, in the order Tinker
requires (a model's training calls by ``seq_id``, whatever order they arrive in).

The worker-group calls block, so they never run on the server's event loop; each job's
result is a :class:`concurrent.futures.Future` the :class:`~hf_algos.serve.futures.FutureStore`
tracks.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Generic, TypeVar

from hf_algos.serve.errors import BadRequestError

logger = logging.getLogger(__name__)

T = TypeVar("T")


class _Job(Generic[T]):
    def __init__(self, work: Callable[[], T]) -> None:
        self.work = work
        self.future: Future[T] = Future()

    def run(self) -> None:
        if not self.future.set_running_or_notify_cancel():
            return
        try:
            self.future.set_result(self.work())
        except BaseException as error:  # the client is told; the thread lives on
            self.future.set_exception(error)


class OrderedRunner:
    """Runs submitted work on one thread: training calls in ``seq_id`` order (a call whose
    predecessors have not arrived waits for them), other calls in arrival order."""

    def __init__(self, name: str, first_seq: int = 1, gap_timeout_s: float = 120.0) -> None:
        self.name = name
        self.gap_timeout_s = gap_timeout_s
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self._next_seq = first_seq
        self._waiting: dict[int, _Job] = {}
        self._thread = threading.Thread(target=self._loop, name=f"serve-{name}", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while (job := self._queue.get()) is not None:
            job.run()

    def submit(self, work: Callable[[], T]) -> Future[T]:
        """Run ``work`` after everything queued before it."""
        job = _Job(work)
        self._queue.put(job)
        return job.future

    def submit_in_order(self, seq_id: int, work: Callable[[], T]) -> Future[T]:
        """Run ``work`` once the calls numbered from ``first_seq`` up to ``seq_id`` have been
        queued (the SDK numbers a model's training calls 1, 2, ...); a repeated ``seq_id``
        is refused."""
        job = _Job(work)
        with self._lock:
            if seq_id < self._next_seq or seq_id in self._waiting:
                raise BadRequestError(
                    f"seq_id {seq_id} of model {self.name!r} was already used (next expected: "
                    f"{self._next_seq}); each training call needs a new, increasing seq_id"
                )
            self._waiting[seq_id] = job
            self._release()
            if seq_id in self._waiting:  # a predecessor is missing: do not wait forever
                timer = threading.Timer(self.gap_timeout_s, self._give_up_on_gap, (seq_id,))
                timer.daemon = True
                timer.start()
        return job.future

    def _release(self) -> None:
        """Queue the waiting calls that are next in order (under the lock)."""
        while self._next_seq in self._waiting:
            self._queue.put(self._waiting.pop(self._next_seq))
            self._next_seq += 1

    def _give_up_on_gap(self, seq_id: int) -> None:
        """``seq_id`` still waits after ``gap_timeout_s``: its missing predecessors never
        came (a request rejected before it was queued). It fails naming them, and the calls
        after it go on."""
        with self._lock:
            job = self._waiting.get(seq_id)
            if job is None or self._next_seq > seq_id:
                return
            missing = [s for s in range(self._next_seq, seq_id) if s not in self._waiting]
            if not missing or min(self._waiting) != seq_id:
                return
            del self._waiting[seq_id]
            self._next_seq = seq_id + 1
            self._release()
        job.future.set_exception(
            BadRequestError(
                f"seq_id {seq_id} of model {self.name!r} waited {self.gap_timeout_s:.0f} s for "
                f"seq_id {missing} (never received: rejected before it was queued?); it "
                "was not run, and the calls after it go on"
            )
        )

    def close(self) -> None:
        """Stop after the queued work (calls still waiting for a predecessor are cancelled)."""
        with self._lock:
            for job in self._waiting.values():
                job.future.cancel()
            self._waiting.clear()
        self._queue.put(None)
        self._thread.join(timeout=60)
