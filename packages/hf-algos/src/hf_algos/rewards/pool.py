"""The scoring processes: a process pool that reports a dead worker's cause and is reaped.

``concurrent.futures.ProcessPoolExecutor`` rather than ``multiprocessing.Pool``: when a
worker dies the executor is broken at once (``Pool`` silently replaces the worker and loses
its task, so the driver learns only at a deadline). The processes are kept to read their
exit codes, to kill a pool stuck in C code, and so that closing the last pool also stops the
forkserver and resource tracker it started (nothing is left behind a finished run).
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import os
import signal
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.process import BaseProcess
from typing import Any

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


class ScoringPool:
    """``num_workers`` scoring processes (address space capped at ``max_memory_mb``)."""

    def __init__(self, start_method: str | None, num_workers: int, max_memory_mb: int | None):
        global _open_pools
        context = multiprocessing.get_context(start_method)
        with _helpers_lock:
            helpers_before = _running_helpers()
            if start_method == "forkserver":
                # Import the scoring code once in the server, not in every worker.
                context.set_forkserver_preload(["hf_algos.rewards.scoring_worker"])
            self._executor = ProcessPoolExecutor(
                num_workers,
                mp_context=context,
                initializer=init_scoring_process,
                initargs=(max_memory_mb, os.getpid()),
            )
            _open_pools += 1
            self._helpers_before = helpers_before
        self._num_workers = num_workers
        self._processes: dict[int, BaseProcess] = {}
        self._closed = False

    def submit(self, task: ScoringTask) -> Future[list[ScoringOutcome]]:
        """Run ``task`` in a worker."""
        future = self._executor.submit(run_scoring_task, task)
        self._remember_processes()
        with _helpers_lock:
            _started_helpers.update(_running_helpers() - self._helpers_before)
        return future

    def start_processes(self) -> None:
        """Start every worker process now and wait until each has run its initializer
        (otherwise they start at the first :meth:`submit`). Raises ``BrokenProcessPool``
        when one cannot start."""
        futures = [self._executor.submit(os.getpid) for _ in range(self._num_workers)]
        self._remember_processes()
        with _helpers_lock:
            _started_helpers.update(_running_helpers() - self._helpers_before)
        for future in futures:
            future.result()

    def dead_processes(self, wait_s: float = 2.0) -> list[str]:
        """``"pid N <cause>"`` for each worker that died on its own (not those the broken
        executor ended afterwards, unless nothing else is known)."""
        self._remember_processes()
        # The broken executor's manager thread terminates and joins every worker. Reading an
        # exit code polls the process, and two threads polling one forkserver child race for
        # the status the forkserver writes once: the loser records 255 in place of the real
        # cause (a SIGKILL was once reported as "exited with code 255"). So let that thread
        # finish first, then read the codes alone.
        manager: threading.Thread | None = getattr(self._executor, "_executor_manager_thread", None)
        if manager is not None and manager is not threading.current_thread():
            manager.join(wait_s + 3.0)
        for process in self._processes.values():
            process.join(wait_s)
        ended = [(p.pid, p.exitcode) for p in self._processes.values() if p.exitcode]
        # Once the executor is broken, the others are terminated (SIGTERM), or report 255 when
        # their status cannot be read: list the cause that broke it (a signal, then a code).
        signalled = [(pid, code) for pid, code in ended if code < 0 and code != -signal.SIGTERM]
        exited = [(pid, code) for pid, code in ended if code > 0 and code != 255]
        chosen = signalled or exited or ended
        return [f"pid {pid} {exit_cause(code)}" for pid, code in chosen]

    def close(self, kill: bool = False) -> None:
        """Stop the workers (``kill``: at once, even mid-task) and, with the last pool, the
        forkserver and resource tracker the pools started."""
        global _open_pools
        if self._closed:
            return
        self._closed = True
        self._remember_processes()
        if kill:
            for process in self._processes.values():
                if process.exitcode is None:
                    process.kill()
        self._executor.shutdown(wait=True, cancel_futures=True)
        for process in self._processes.values():
            process.join(5)
        with _helpers_lock:
            _open_pools -= 1
            if _open_pools == 0:
                _stop_helpers(_started_helpers)
                _started_helpers.clear()

    def _remember_processes(self) -> None:
        # The executor's own table (stable since 3.8; no public accessor before 3.14).
        table: dict[int, Any] = getattr(self._executor, "_processes", None) or {}
        self._processes.update(table)


def gather_outcomes(
    pool: ScoringPool,
    futures: Mapping[Future[list[ScoringOutcome]], tuple[list[int], ScoringTask]],
    deadline: float,
    outcomes: list[ScoringOutcome],
) -> None:
    """Put each task's outcomes at its samples' indices; a chunk not back by ``deadline``
    scores ``timeout``. A dead worker raises :class:`RewardError` at once, with its cause."""
    pending = set(futures)
    while pending:
        done, pending = concurrent.futures.wait(
            pending,
            timeout=max(0.0, deadline - time.monotonic()),
            return_when=concurrent.futures.FIRST_EXCEPTION,
        )
        if not done:
            break
        for future in done:
            chunk = futures[future][0]
            try:
                results = future.result()
            except BrokenProcessPool as error:
                raise _worker_died(pool, futures) from error
            for index, outcome in zip(chunk, results, strict=True):
                outcomes[index] = outcome
    for future in pending:
        for index in futures[future][0]:
            outcomes[index] = ScoringOutcome(
                status="timeout",
                error="hard deadline passed: the scoring process ignored the alarm (stuck in C "
                "code or blocking SIGALRM); the pool was replaced",
            )


def _worker_died(
    pool: ScoringPool,
    futures: Mapping[Future[list[ScoringOutcome]], tuple[list[int], ScoringTask]],
) -> RewardError:
    causes = "; ".join(pool.dead_processes()) or "exit cause unknown"
    lost = [f for f in futures if not f.done() or f.exception() is not None]
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
    # Private but long-stable stop methods (CPython uses them in its own tests); without
    # them the helpers outlive every pool until the driver exits.
    if "forkserver" in names:
        stop = getattr(multiprocessing.forkserver._forkserver, "_stop", None)
        if stop is not None:
            stop()
    if "resource_tracker" in names:
        stop = getattr(multiprocessing.resource_tracker._resource_tracker, "_stop", None)
        if stop is not None:
            stop()
