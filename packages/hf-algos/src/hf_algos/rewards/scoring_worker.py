"""What runs inside a scoring process: calls of a scoring function, each under an alarm.

The alarm (``SIGALRM``) interrupts a function that sleeps or loops in Python, so a slow
sample costs its own timeout and the worker stays usable. A function stuck where signals
are not handled (inside C code, or one that blocks the alarm) is caught by the manager's
task deadline instead, which replaces that process; one that burns CPU there is killed by
the CPU-time limit (``SIGXCPU``) and reported as a dead process. The address-space cap makes
a runaway allocation a ``MemoryError`` of that sample. The limits are
:mod:`hf_controller.sandbox`'s, shared with the python tool's child process.
"""

from __future__ import annotations

import inspect
import math
import os
import pickle
import select
import signal
import threading
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hf_algos.rewards.outcome import ScoringOutcome
from hf_algos.rewards.signature import ScoringCall
from hf_algos.rewards.weighted import (
    AnyScoringCall,
    WeightedCall,
    calls_per_sample,
    combine_outcomes,
)
from hf_controller import sandbox

_MAX_CACHED_FUNCTIONS = 64
_loaded: dict[bytes, AnyScoringCall] = {}
"""Functions already unpickled in this process, by their pickled bytes."""
_memory_cap_mb: int | None = None


@dataclass
class ScoringTask:
    """One round trip to a scoring process: samples of one scoring function."""

    function: bytes
    """The :class:`~hf_algos.rewards.signature.ScoringCall` (or a weighted list's
    :class:`~hf_algos.rewards.weighted.WeightedCall`), cloudpickled in the driver."""
    samples: list[dict[str, Any]]
    """Per sample, field -> value (``solution``, ``ground_truth``, ``data_source``, ...)."""
    timeout_s: float
    """Seconds per sample (a batched call gets ``timeout_s x len(samples)``)."""
    cpu_limit_per_sample_s: float | None
    """CPU seconds per sample before the kernel kills the process (``None``: no limit)."""
    max_consecutive_timeouts: int = 0
    """After this many samples in a row time out, the task's other samples are not scored
    (status ``skipped``): the function hangs (``reward.max_consecutive_timeouts``; 0: off)."""


class ScoringTimeoutError(Exception):
    """Raised inside the scoring function by the alarm."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise ScoringTimeoutError


def init_scoring_process(max_memory_mb: int | None, driver_pid: int | None = None) -> None:
    """Pool initializer: cap the address space, end with the driver, leave Ctrl-C to it."""
    global _memory_cap_mb
    # dies with its parent (the forkserver, or the driver), which handles Ctrl-C and reaps it
    sandbox.confine(max_memory_mb)
    # Stopping a worker (a task past its deadline, a closing pool) is a SIGTERM: end at once,
    # even inside C code, rather than in pebble's Python handler.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if driver_pid is not None and driver_pid != os.getppid():
        # A forkserver outlives a killed driver as long as its children hold its "alive"
        # pipe, so a worker must notice the driver's end itself (then the forkserver and the
        # resource tracker see their pipes close and exit too: nothing is orphaned).
        threading.Thread(
            target=_exit_with, args=(driver_pid,), name="driver-watch", daemon=True
        ).start()
    _memory_cap_mb = max_memory_mb


def _exit_with(pid: int) -> None:
    """Block until process ``pid`` ends, then end this process."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfd (old kernel): poll
        while True:
            time.sleep(1.0)
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                os._exit(1)
            except PermissionError:
                continue
    select.select([fd], [], [])
    os._exit(1)


def parse_score(result: Any) -> tuple[float, dict[str, float]]:
    """``(score, extras)`` from a number or a ``{"score": ..., **extras}`` mapping."""
    if isinstance(result, Mapping):
        if "score" not in result:
            raise ValueError(f"scoring function returned {result!r:.120} without a 'score' key")
        extras = {str(k): float(v) for k, v in result.items() if k != "score"}
        score = float(result["score"])
    elif result is None or isinstance(result, str):
        raise TypeError(f"scoring function returned {result!r:.80}, not a number")
    else:
        score, extras = float(result), {}
    if not math.isfinite(score):
        raise ValueError(f"scoring function returned a non-finite score {score!r}")
    return score, extras


def run_scoring_task(task: ScoringTask) -> list[ScoringOutcome]:
    """Score ``task``'s samples; never raises for the function's faults (a function that
    cannot be loaded or called gives ``"fatal"`` outcomes naming the cause)."""
    try:
        call = _load(task.function)
    except BaseException as error:
        fatal = f"cannot be loaded in the scoring process: {_format(error, 1)}"
        if _memory_cap_mb and _caused_by(error, MemoryError):
            fatal += (
                f" (importing it needs more address space than reward.max_memory_mb="
                f"{_memory_cap_mb} MiB; a module importing torch needs about 1 GiB: raise "
                "reward.max_memory_mb)"
            )
        return [ScoringOutcome(status="fatal", error=fatal) for _ in task.samples]
    _limit_cpu(task.cpu_limit_per_sample_s, len(task.samples) * calls_per_sample(call))
    if isinstance(call, WeightedCall):
        return _run_weighted(call, task)
    if call.batched:
        return _run_batched(call, task)
    return _run_each(call, task)


def _run_weighted(call: WeightedCall, task: ScoringTask) -> list[ScoringOutcome]:
    """Score ``task``'s samples with each function of a weighted list (one call per sample
    and function, a batched one per chunk), then sum them (``None`` results left out)."""
    per_function = []
    for component in call.calls:
        if component.batched:
            per_function.append(_run_batched(component, task, allow_none=True))
        else:
            per_function.append(_run_each(component, task, allow_none=True))
    return combine_outcomes(call, per_function)


def _run_each(
    call: ScoringCall, task: ScoringTask, allow_none: bool = False
) -> list[ScoringOutcome]:
    """Score ``task``'s samples one call each; after ``task.max_consecutive_timeouts``
    timeouts in a row the rest are ``skipped`` (the manager then stops the batch)."""
    checked: dict[frozenset[str], ScoringOutcome | None] = {}
    limit, streak = task.max_consecutive_timeouts, 0
    outcomes = []
    for sample in task.samples:
        if limit and streak >= limit:
            error = f"not scored: the {streak} samples before it timed out in a row"
            outcomes.append(ScoringOutcome(status="skipped", error=error))
            continue
        outcome = _run_one(call, sample, task.timeout_s, checked, allow_none)
        streak = streak + 1 if outcome.status == "timeout" else 0
        outcomes.append(outcome)
    return outcomes


def _load(blob: bytes) -> AnyScoringCall:
    call = _loaded.get(blob)
    if call is None:
        call = pickle.loads(blob)
        if len(_loaded) >= _MAX_CACHED_FUNCTIONS:
            _loaded.clear()
        _loaded[blob] = call
    return call


def _caused_by(error: BaseException, kind: type[BaseException]) -> bool:
    """Whether ``error`` or an exception it was raised from (or during) is a ``kind``."""
    seen: BaseException | None = error
    for _ in range(16):  # a bounded walk: chains can be cyclic
        if seen is None:
            return False
        if isinstance(seen, kind):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _limit_cpu(per_sample_s: float | None, count: int) -> None:
    """Let this task use ``per_sample_s x count`` more CPU seconds (the limit is per process
    lifetime, so it is moved on before each task)."""
    if per_sample_s is not None:
        sandbox.allow_cpu_seconds(per_sample_s * count + 1)  # a second of slack: whole seconds


def _run_one(
    call: ScoringCall,
    sample: Mapping[str, Any],
    timeout_s: float,
    checked: dict[frozenset[str], ScoringOutcome | None],
    allow_none: bool = False,
) -> ScoringOutcome:
    """Score one sample. ``checked`` caches the binding check by the set of field names
    (the same for every sample of a task, in practice): ``inspect.signature`` per sample
    cost 30 us, most of a cheap rule-based score's time (4.7 ms for 128 samples).
    ``allow_none``: a ``None`` result is a ``nan`` score (a weighted list's "does not
    apply"), not an error."""
    kwargs = call.kwargs(sample)
    names = frozenset(kwargs)
    if names not in checked:
        checked[names] = _check_binding(call, kwargs)
    unbound = checked[names]
    if unbound is not None:
        return unbound
    result = _under_alarm(call, kwargs, timeout_s)
    if isinstance(result, ScoringOutcome):
        return result
    if allow_none and result is None:
        return ScoringOutcome(score=math.nan)
    try:
        score, extras = parse_score(result)
    except Exception as error:
        return ScoringOutcome(status="error", error=_format(error, 1))
    return ScoringOutcome(score=score, extras=extras)


def _run_batched(
    call: ScoringCall, task: ScoringTask, allow_none: bool = False
) -> list[ScoringOutcome]:
    """Score ``task``'s samples in one call of a batched (TRL) function; ``allow_none``: a
    ``None`` in its list is a ``nan`` score, as in :func:`_run_one`."""
    count = len(task.samples)
    samples = task.samples
    columns: dict[str, Any] = {name: [s.get(name) for s in samples] for name in samples[0]}
    # the dataset columns, as TRL passes them: one list per column name
    names = dict.fromkeys(name for s in samples for name in s.get("columns") or {})
    columns["columns"] = {n: [(s.get("columns") or {}).get(n) for s in samples] for n in names}
    kwargs = call.kwargs(columns)
    unbound = _check_binding(call, kwargs)
    result = unbound or _under_alarm(call, kwargs, task.timeout_s * count)
    if isinstance(result, ScoringOutcome):
        return [ScoringOutcome(status=result.status, error=result.error) for _ in range(count)]
    if isinstance(result, str | bytes | Mapping) or not hasattr(result, "__len__"):
        error = f"batched scoring function returned {result!r:.80}, not a list of {count} scores"
        return [ScoringOutcome(status="error", error=error) for _ in range(count)]
    if len(result) != count:
        error = f"batched scoring function returned {len(result)} scores for {count} samples"
        return [ScoringOutcome(status="error", error=error) for _ in range(count)]
    outcomes = []
    for value in result:
        if allow_none and value is None:
            outcomes.append(ScoringOutcome(score=math.nan))
            continue
        try:
            score, extras = parse_score(value)
            outcomes.append(ScoringOutcome(score=score, extras=extras))
        except Exception as error:
            outcomes.append(ScoringOutcome(status="error", error=_format(error, 1)))
    return outcomes


def _check_binding(call: ScoringCall, kwargs: dict[str, Any]) -> ScoringOutcome | None:
    try:
        inspect.signature(call.fn).bind(**kwargs)
    except TypeError as error:
        fields = sorted(kwargs)
        return ScoringOutcome(
            status="fatal", error=f"cannot be called with the fields {fields}: {error}"
        )
    return None


def _under_alarm(call: ScoringCall, kwargs: dict[str, Any], timeout_s: float) -> Any:
    """``call.fn(**kwargs)``, or a failed :class:`ScoringOutcome`."""
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        return call.fn(**kwargs)
    except ScoringTimeoutError:
        return ScoringOutcome(status="timeout", error=f"no result within {timeout_s:g} s")
    except MemoryError as error:
        cap = f" (over reward.max_memory_mb={_memory_cap_mb})" if _memory_cap_mb else ""
        return ScoringOutcome(status="error", error=f"MemoryError{cap}: {error}")
    except (Exception, SystemExit) as error:
        return ScoringOutcome(status="error", error=_format(error, 3, skip_own_frame=True))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _format(error: BaseException, lines: int, skip_own_frame: bool = False) -> str:
    """The last ``lines`` lines of ``error``'s traceback (without this module's frame, so
    the user's own code shows)."""
    tb = error.__traceback__
    if skip_own_frame and tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(error), error, tb)[-lines:]).strip()
