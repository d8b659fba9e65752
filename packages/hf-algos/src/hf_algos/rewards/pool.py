"""The scoring processes: a ``pebble`` process pool whose tasks have deadlines and whose dead
workers are named and replaced.

``pebble.ProcessPool`` rather than ``concurrent.futures.ProcessPoolExecutor``: a task past
its deadline has its process killed and replaced (the other tasks go on), and a task whose
process died fails with ``pebble.ProcessExpired`` carrying that process's pid and exit code,
read by the pool's own thread (two threads polling one forkserver child race for its status,
and the loser reads 255). A worker that dies is replaced by the pool; the manager still
raises at once, naming the cause. Closing the last pool also stops the forkserver and
resource tracker the pools started, so nothing is left behind a finished run.
"""

from __future__ import annotations

import collections
import concurrent.futures
import multiprocessing
import multiprocessing.connection
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from typing import Any

import pebble

from hf_algos.rewards.scoring_worker import (
    ScoringOutcome,
    ScoringTask,
    init_scoring_process,
    run_scoring_task,
)


class RewardError(RuntimeError):
    """Scoring cannot go on: a function that cannot be loaded or called, a scoring process
    that died, or more failed samples than ``max_error_fraction`` allows."""


_CAUSES = {
    signal.SIGKILL: "killed by SIGKILL (the out-of-memory killer, or kill -9)",
    signal.SIGXCPU: "killed by SIGXCPU (over its CPU-time limit, reward.cpu_time_limit_s)",
    signal.SIGSEGV: "crashed with SIGSEGV (a segmentation fault in native code)",
    signal.SIGABRT: "aborted with SIGABRT",
    signal.SIGTERM: "terminated by SIGTERM",
    signal.SIGBUS: "crashed with SIGBUS",
}

_RECORDED_PROCESSES = 64
"""Worker processes a pool remembers (the newest), to name a start-up failure's cause."""

_helpers_lock = threading.Lock()
_open_pools = 0
_started_helpers: set[str] = set()
"""``forkserver`` / ``resource_tracker``: started by a scoring pool, stopped with the last."""


def exit_cause(exitcode: int | None) -> str:
    """Words for a process's ``exitcode`` (negative: the signal that ended it)."""
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            number = signal.Signals(-exitcode)
        except ValueError:
            return f"killed by signal {-exitcode}"
        return _CAUSES.get(number, f"killed by {number.name}")
    if exitcode == 1:
        # What a worker does when the driver's script fails to import in it (multiprocessing
        # re-imports ``__main__``): the script's own traceback is above in the log.
        return (
            "exited with code 1 (an uncaught exception; if it happened at start-up, the "
            "driver script probably runs code outside `if __name__ == '__main__':`)"
        )
    return f"exited with code {exitcode}"


class _RecordingContext:
    """A multiprocessing context (the part pebble uses) that remembers the processes it
    starts, so the exit codes of workers that died before taking a task can be named."""

    def __init__(self, context: BaseContext) -> None:
        self._context = context
        self.processes: collections.deque[BaseProcess] = collections.deque(
            maxlen=_RECORDED_PROCESSES
        )

    def Process(self, *args: Any, **kwargs: Any) -> BaseProcess:  # noqa: N802 (the context API)
        """A new (not yet started) process of the wrapped context, remembered."""
        process: BaseProcess = self._context.Process(*args, **kwargs)  # type: ignore[attr-defined]
        self.processes.append(process)
        return process

    def Pipe(  # noqa: N802 (the context API)
        self, duplex: bool = True
    ) -> tuple[multiprocessing.connection.Connection, multiprocessing.connection.Connection]:
        """The wrapped context's ``Pipe``."""
        return self._context.Pipe(duplex)

    def RLock(self) -> Any:  # noqa: N802 (the context API)
        """The wrapped context's ``RLock``."""
        return self._context.RLock()

    def get_start_method(self) -> str:
        """The wrapped context's start method."""
        return self._context.get_start_method()


class ScoringPool:
    """``num_workers`` scoring processes (address space capped at ``max_memory_mb``)."""

    def __init__(self, start_method: str | None, num_workers: int, max_memory_mb: int | None):
        global _open_pools
        context = multiprocessing.get_context(start_method)
        self._context = _RecordingContext(context)
        with _helpers_lock:
            self._helpers_before = _running_helpers()
            if start_method == "forkserver":
                # Import the scoring code once in the server, not in every worker.
                context.set_forkserver_preload(["pebble", "hf_algos.rewards.scoring_worker"])
            self._pool = pebble.ProcessPool(
                num_workers,
                initializer=init_scoring_process,
                initargs=(max_memory_mb, os.getpid()),
                context=self._context,
            )
            _open_pools += 1
        self._num_workers = num_workers
        self._started = False  # asking pebble whether the pool is active starts it
        self._closed = False

    @property
    def broken(self) -> bool:
        """Whether the pool can take no more tasks (every worker died with none running)."""
        return self._started and not self._closed and not self._pool.active

    def submit(self, task: ScoringTask, timeout_s: float) -> Future[list[ScoringOutcome]]:
        """Run ``task`` in a worker; past ``timeout_s`` seconds of running, its process is
        killed and replaced, and the future raises ``TimeoutError``."""
        return self._schedule(run_scoring_task, (task,), timeout_s)

    def start_processes(self) -> None:
        """Start the worker processes now and wait until they have run their initializer
        (otherwise they start at the first :meth:`submit`). Raises ``BrokenProcessPool``
        when none can start."""
        futures = [self._schedule(os.getpid, (), None) for _ in range(self._num_workers)]
        for future in futures:
            future.result()

    def _schedule(
        self, function: Callable[..., Any], args: tuple[Any, ...], timeout_s: float | None
    ) -> Future[Any]:
        future: Future[Any] = self._pool.schedule(function, args=args, timeout=timeout_s)
        self._started = True
        # The first task starts the pool, and with it multiprocessing's helper processes.
        with _helpers_lock:
            _started_helpers.update(_running_helpers() - self._helpers_before)
        return future

    def dead_processes(self) -> list[str]:
        """``"pid N <cause>"`` for each worker that died, once the pool is broken or closed
        (while it runs, only its own thread may read exit codes)."""
        if not self._started or self._pool.active:
            return []
        ended = [(p.pid, p.exitcode) for p in self._context.processes if p.exitcode]
        # Stopped by the pool (SIGTERM), or unreadable (255): listed only when nothing else is.
        chosen = [(pid, code) for pid, code in ended if code not in (-signal.SIGTERM, 255)]
        return [f"pid {pid} {exit_cause(code)}" for pid, code in chosen or ended]

    def close(self, kill: bool = False) -> None:
        """Stop the workers (``kill``: at once, even mid-task; else after the tasks given)
        and, with the last pool, the forkserver and resource tracker the pools started."""
        global _open_pools
        if self._closed:
            return
        self._closed = True
        if kill:
            self._pool.stop()  # a worker ends at SIGTERM (init_scoring_process: no handler)
        else:
            self._pool.close()
        self._pool.join()
        with _helpers_lock:
            _open_pools -= 1
            if _open_pools == 0:
                _stop_helpers(_started_helpers)
                _started_helpers.clear()


def gather_outcomes(
    pool: ScoringPool,
    futures: Mapping[Future[list[ScoringOutcome]], tuple[list[int], ScoringTask]],
    deadline: float,
    outcomes: list[ScoringOutcome],
    on_done: Callable[[list[int]], None] | None = None,
) -> bool:
    """Put each task's outcomes at its samples' indices. A task past its own deadline (its
    process was replaced) scores ``timeout``; so does one not back by the batch's
    ``deadline``, and then ``True`` is returned: the pool is stuck, replace it. A dead worker
    raises :class:`RewardError` at once, with its cause. ``on_done`` gets each finished
    task's indices once its outcomes are in (what it raises ends the wait at once)."""
    pending = set(futures)
    while pending:
        done, pending = concurrent.futures.wait(
            pending,
            timeout=max(0.0, deadline - time.monotonic()),
            # each finished task, when on_done reads them; else at a failure or the end
            return_when=concurrent.futures.FIRST_COMPLETED
            if on_done is not None
            else concurrent.futures.FIRST_EXCEPTION,
        )
        if not done:
            break
        causes = [cause for cause in map(_death, done) if cause]
        if causes:
            raise _worker_died(futures, "; ".join(causes))
        if any(isinstance(_error(f), BrokenProcessPool) for f in done):
            raise _worker_died(futures, "; ".join(pool.dead_processes()) or "exit cause unknown")
        for future in done:
            chunk = futures[future][0]
            if isinstance(_error(future), TimeoutError):
                _fill(outcomes, chunk, _late(future, "its process was replaced"))
            else:
                for index, outcome in zip(chunk, future.result(), strict=True):
                    outcomes[index] = outcome
            if on_done is not None:
                on_done(chunk)
    for future in pending:
        _fill(outcomes, futures[future][0], _late(None, "the pool was replaced"))
    return bool(pending)


def _error(future: Future[Any]) -> BaseException | None:
    return None if future.cancelled() else future.exception()


def _death(future: Future[Any]) -> str:
    """``"pid N <cause>"`` of the worker that died running ``future``'s task, else ``""``."""
    error = _error(future)
    if isinstance(error, pebble.ProcessExpired):
        return f"pid {error.pid} {exit_cause(error.exitcode)}"
    return ""


def _late(future: Future[Any] | None, what_then: str) -> ScoringOutcome:
    limit = ""
    error = _error(future) if future is not None else None
    if isinstance(error, TimeoutError) and len(error.args) > 1:
        limit = f" of {error.args[1]:g} s"  # pebble's TimeoutError("Task timeout", timeout)
    return ScoringOutcome(
        status="timeout",
        error=f"hard deadline{limit} passed: the scoring process ignored the alarm (stuck in "
        f"C code or blocking SIGALRM); {what_then}",
    )


def _fill(outcomes: list[ScoringOutcome], chunk: list[int], outcome: ScoringOutcome) -> None:
    for index in chunk:
        outcomes[index] = ScoringOutcome(status=outcome.status, error=outcome.error)


def _worker_died(
    futures: Mapping[Future[list[ScoringOutcome]], tuple[list[int], ScoringTask]],
    causes: str,
) -> RewardError:
    lost = [f for f in futures if not f.done() or _error(f) is not None]
    sources = sorted({s["data_source"] for f in lost for s in futures[f][1].samples})
    return RewardError(
        f"a scoring process died while scoring data_source(s) {sources}: {causes}. "
        f"{sum(len(futures[f][0]) for f in lost)} sample(s) were lost; the pool was replaced. "
        f"A scoring function that crashes its process (native code, os._exit, over its "
        f"CPU-time limit) must be fixed"
    )


def _running_helpers() -> set[str]:
    running = set()
    if getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None) is not None:
        running.add("forkserver")
    if getattr(multiprocessing.resource_tracker._resource_tracker, "_pid", None) is not None:
        running.add("resource_tracker")
    return running


def _stop_helpers(names: set[str]) -> None:
    """Stop helper processes a pool started; each restarts by itself when next needed.

    Not while other processes this one started are alive (a vLLM engine in the local
    backend's driver): they hold copies of the helpers' pipes, so a helper would never see
    its pipe close and the stop would wait for it forever. The helpers then live on until
    the driver exits.
    """
    if multiprocessing.active_children():
        return
    # Private but long-stable stop methods (CPython uses them in its own tests; it has no
    # public way to stop either helper); without them the helpers outlive every pool until
    # the driver exits.
    if "forkserver" in names:
        stop = getattr(multiprocessing.forkserver._forkserver, "_stop", None)
        if stop is not None:
            stop()
    if "resource_tracker" in names:
        stop = getattr(multiprocessing.resource_tracker._resource_tracker, "_stop", None)
        if stop is not None:
            stop()
