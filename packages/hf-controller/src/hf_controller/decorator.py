"""``@register``: how a worker method is split across, run on, and gathered from a group.

The decorator only attaches metadata (dispatch mode, execute mode, blocking) to
the method; the worker group reads it when it binds the method (see
``worker_group.py``). Inside the worker the wrapper resolves future arguments
(``DataProtoFuture`` and friends) so data produced by another group is fetched
by the worker that needs it, never by the driver.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeVar

from hf_controller.futures import materialize

F = TypeVar("F", bound=Callable[..., Any])

MAGIC_ATTR = "__hf_controller_register__"


class Dispatch(Enum):
    """How the driver's arguments are split over the workers, and results gathered.

    ``RANK_ZERO``: only rank 0 gets the call's arguments and its result is returned.
    ``ONE_TO_ALL``: every worker gets the same arguments; a list of results comes back.
    ``ALL_TO_ALL``: arguments are already per-worker lists; results come back as a list.
    ``DP_COMPUTE``: like ALL_TO_ALL, and the argument lists must have world-size entries.
    ``DP_COMPUTE_PROTO``: shardable arguments (``chunk(n)``) are split in balanced parts;
    results are concatenated back in rank order.
    ``DP_COMPUTE_PROTO_WITH_FUNC``: the first argument is a function sent to every worker,
    the rest is split as in DP_COMPUTE_PROTO.
    ``DP_COMPUTE_METRIC``: split as DP_COMPUTE_PROTO, results come back as a list.
    """

    RANK_ZERO = "rank_zero"
    ONE_TO_ALL = "one_to_all"
    ALL_TO_ALL = "all_to_all"
    DP_COMPUTE = "dp_compute"
    DP_COMPUTE_PROTO = "dp_compute_proto"
    DP_COMPUTE_PROTO_WITH_FUNC = "dp_compute_proto_with_func"
    DP_COMPUTE_METRIC = "dp_compute_metric"


class Execute(Enum):
    """Which workers run the call: every rank, or rank 0 alone."""

    ALL = "all"
    RANK_ZERO = "rank_zero"


@dataclass(frozen=True)
class MethodSpec:
    """What ``@register`` recorded about a method."""

    dispatch_mode: Dispatch | str | dict[str, Callable[..., Any]]
    execute_mode: Execute
    blocking: bool
    materialize_futures: bool
    pad_to_equal: bool
    timeout_s: float | None = None
    """Deadline of a blocking call of this method, overriding the group's ``call_timeout_s``."""


def register(
    dispatch_mode: Dispatch | str | dict[str, Callable[..., Any]] = Dispatch.ALL_TO_ALL,
    execute_mode: Execute = Execute.ALL,
    blocking: bool = True,
    materialize_futures: bool = True,
    pad_to_equal: bool = False,
    timeout_s: float | None = None,
) -> Callable[[F], F]:
    """Mark a worker method as callable on the whole group.

    Args:
        dispatch_mode: a :class:`Dispatch`, the name of a mode added with
            :func:`register_dispatch_mode`, or a ``{"dispatch_fn", "collect_fn"}`` dict.
        execute_mode: run on every rank, or on rank 0 only.
        blocking: wait for the results (``False`` returns futures / object refs).
        materialize_futures: resolve future arguments inside the worker before the call.
        pad_to_equal: for DP modes, give every worker the same number of rows by
            repeating leading rows; the padding is dropped from the gathered result.
        timeout_s: deadline in seconds of a blocking call of this method (``None``: the
            group's ``call_timeout_s``). When it passes, the group raises
            :class:`~hf_controller.errors.WorkerTimeoutError` naming the ranks that have not
            answered and each one's current Python stack.
    """
    if timeout_s is not None and not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0 seconds or None (no deadline), got {timeout_s!r}")
    if isinstance(dispatch_mode, dict):
        missing = {"dispatch_fn", "collect_fn"} - set(dispatch_mode)
        if missing:
            raise ValueError(
                f"a custom dispatch mode dict needs 'dispatch_fn' and 'collect_fn'; missing "
                f"{sorted(missing)}"
            )
    elif not isinstance(dispatch_mode, (Dispatch, str)):
        raise TypeError(
            f"dispatch_mode must be a Dispatch, a registered mode name or a dict, got "
            f"{dispatch_mode!r}"
        )
    if not isinstance(execute_mode, Execute):
        raise TypeError(f"execute_mode must be an Execute member, got {execute_mode!r}")
    spec = MethodSpec(
        dispatch_mode, execute_mode, blocking, materialize_futures, pad_to_equal, timeout_s
    )

    def decorator(func: F) -> F:
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_inner(self: Any, *args: Any, **kwargs: Any) -> Any:
                if materialize_futures:
                    args, kwargs = materialize(args, kwargs)
                return await func(self, *args, **kwargs)

            setattr(async_inner, MAGIC_ATTR, spec)
            return async_inner  # type: ignore[return-value]

        @functools.wraps(func)
        def inner(self: Any, *args: Any, **kwargs: Any) -> Any:
            # ``self`` is the worker: never mistaken for a future.
            if materialize_futures:
                args, kwargs = materialize(args, kwargs)
            return func(self, *args, **kwargs)

        setattr(inner, MAGIC_ATTR, spec)
        return inner  # type: ignore[return-value]

    return decorator


def method_spec(method: Any) -> MethodSpec | None:
    """The :class:`MethodSpec` that ``@register`` attached to ``method``, if any."""
    spec = getattr(method, MAGIC_ATTR, None)
    return spec if isinstance(spec, MethodSpec) else None
