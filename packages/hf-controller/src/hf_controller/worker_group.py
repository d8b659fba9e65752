"""``WorkerGroup``: one object in the driver that stands for N workers.

Every ``@register``-ed method of the worker class becomes a method of the group.
Calling it runs *dispatch* (split the arguments per worker), *execute* (call
each worker; wait when blocking) and *collect* (gather the results). Backends
(Ray, local) only say how to call one worker and how to wait; everything else
lives here.

Group methods are looked up like ordinary methods (``__getattr__`` binds them on access)
rather than stored bound on the instance, so a group is no reference cycle: it is freed
(and, on Ray, its actors and reservations released) as soon as the last reference to it
or to one of its bound methods is dropped, without waiting for the garbage collector.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import operator
import os
import types
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from hf_controller.decorator import Dispatch, Execute, MethodSpec
from hf_controller.dispatch import PADDABLE_MODES, resolve_dispatch_mode
from hf_controller.sharding import Padding, is_shardable, pad_to_multiple, unpad
from hf_controller.tracing import CallTimer, CallTiming, export_chrome_trace
from hf_controller.worker_class import ClassWithInitArgs, registered_methods, role_classes


class ResourcePool:
    """How many worker processes go on each node.

    ``process_on_nodes=[4, 4]`` means two nodes with four processes each; ranks are
    numbered node by node.
    """

    def __init__(
        self, process_on_nodes: Sequence[int] | None = None, max_colocate_count: int = 10
    ) -> None:
        nodes = list(process_on_nodes) if process_on_nodes is not None else [1]
        if not nodes or any(not isinstance(n, int) or n < 1 for n in nodes):
            raise ValueError(
                f"process_on_nodes must be a non-empty list of positive process counts, got {nodes}"
            )
        if max_colocate_count < 1:
            raise ValueError(f"max_colocate_count must be >= 1, got {max_colocate_count}")
        self._store = nodes
        self.max_colocate_count = max_colocate_count

    @property
    def store(self) -> list[int]:
        """Processes per node."""
        return list(self._store)

    @property
    def world_size(self) -> int:
        """Total number of processes."""
        return sum(self._store)

    def local_world_size_list(self) -> list[int]:
        """For each rank, how many processes share its node."""
        return [n for n in self._store for _ in range(n)]

    def local_rank_list(self) -> list[int]:
        """For each rank, its index among the processes of its node."""
        return [i for n in self._store for i in range(n)]


WORKER_SHUTDOWN_S = 30.0
"""Longest wait for a worker class's own ``shutdown`` when the group shuts down."""

CALL_TIMEOUT_ENV = "HF_CONTROLLER_CALL_TIMEOUT_S"
"""Default deadline (seconds) of blocking group calls when a group is given none."""


def default_call_timeout(call_timeout_s: float | None) -> float | None:
    """``call_timeout_s``, else :data:`CALL_TIMEOUT_ENV` from the environment, else ``None``
    (no deadline); a value that is not a positive number is refused, naming it."""
    source = "call_timeout_s"
    if call_timeout_s is None:
        text = os.environ.get(CALL_TIMEOUT_ENV, "").strip()
        if not text:
            return None
        source = CALL_TIMEOUT_ENV
        try:
            call_timeout_s = float(text)
        except ValueError:
            call_timeout_s = -1.0
    if not call_timeout_s > 0:
        raise ValueError(
            f"{source} must be a positive number of seconds (or unset: no deadline), "
            f"got {call_timeout_s!r}"
        )
    return float(call_timeout_s)


class WorkerGroup:
    """Backend-independent part of a worker group. Subclasses implement
    :meth:`_execute` (start one call per rank), :meth:`_wait` (results in order) and
    :meth:`shutdown`.

    ``call_timeout_s`` is the deadline of every blocking call (``None``: the
    :data:`CALL_TIMEOUT_ENV` environment variable, else none); ``@register(timeout_s=...)``
    overrides it per method.
    """

    cls_with_init: ClassWithInitArgs

    def __init__(self, name: str, world_size: int, call_timeout_s: float | None = None) -> None:
        self.name = name
        self._world_size = world_size
        self.call_timeout_s = default_call_timeout(call_timeout_s)
        self.timer = CallTimer(name)
        self._dp_layout_cache: dict[str, tuple[list[int], list[bool]]] = {}
        self._bound: dict[str, tuple[str, MethodSpec]] = {}
        self._group_methods: dict[str, Callable[..., Any]] = {}
        self._is_view = False  # a spawn() view: shares another group's workers
        self._role_shut = False  # a view whose role's own shutdown has run

    if not TYPE_CHECKING:  # to the type checker, groups keep only their declared attributes

        def __getattr__(self, name: str) -> Any:
            methods = self.__dict__.get("_group_methods")
            if methods is None or name not in methods:
                raise AttributeError(
                    f"{type(self).__name__} {self.__dict__.get('name')!r} "
                    f"has no attribute or worker method {name!r}"
                )
            return types.MethodType(methods[name], self)

        def __dir__(self) -> list[str]:
            return sorted({*super().__dir__(), *self.__dict__.get("_group_methods", {})})

    @property
    def world_size(self) -> int:
        """Number of workers in the group."""
        return self._world_size

    # ------------------------------------------------------------------ backend hooks

    def _execute(
        self, method: str, calls: list[tuple[tuple[Any, ...], dict[str, Any]]], ranks: list[int]
    ) -> list[Any]:
        """Start ``method`` on each of ``ranks`` with its ``(args, kwargs)``; return handles."""
        raise NotImplementedError

    def _wait(
        self, method: str, handles: list[Any], ranks: list[int], timeout_s: float | None = None
    ) -> list[Any]:
        """Turn handles into results, in order, raising :class:`WorkerGroupError` on failure
        and :class:`WorkerTimeoutError` when ``timeout_s`` passes first."""
        raise NotImplementedError

    def _call(
        self,
        method: str,
        remote_name: str,
        calls: list[tuple[tuple[Any, ...], dict[str, Any]]],
        ranks: list[int],
        timeout_s: float | None,
        data: bool,
    ) -> list[Any]:
        """Run a blocking call of ``remote_name`` (group method ``method``) on ``ranks``;
        results in order. ``data``: the results are data to be joined (a backend may then
        fetch them itself). By default :meth:`_execute` then :meth:`_wait`; a backend may
        route it otherwise (Ray: through relays, for large groups)."""
        return self._wait(method, self._execute(remote_name, calls, ranks), ranks, timeout_s)

    def _keep_workers_for(self, handles: list[Any]) -> None:
        """Keep the workers alive until the non-blocking call behind ``handles`` is done,
        even when the group itself is dropped first (backend hook; a no-op by default)."""

    def _workers_alive(self) -> bool:
        """Whether :meth:`_end_workers` has not run yet."""
        raise NotImplementedError

    def _end_workers(self) -> None:
        """End the worker processes and give back what they reserved (backend hook)."""
        raise NotImplementedError

    def shutdown(self) -> None:
        """End the group: its workers stop and what it reserved is given back; idempotent.
        The group cannot be called afterwards.

        A worker class that registers its own ``shutdown`` (e.g. to release an engine or
        leave a channel) has it run on every rank first, best effort and bounded by
        :data:`WORKER_SHUTDOWN_S`. On a ``spawn`` view only that role's own ``shutdown``
        runs: the shared workers end with the group that spawned the views.
        """
        if not self._workers_alive() or self._role_shut:
            return
        call = self._group_methods.get("shutdown")
        if call is not None:
            bounded = copy.copy(self)
            bounded.call_timeout_s = min(
                self.call_timeout_s or WORKER_SHUTDOWN_S, WORKER_SHUTDOWN_S
            )
            with contextlib.suppress(Exception):  # the processes end regardless
                call(bounded)
        if self._is_view:
            self._role_shut = True
        else:
            self._end_workers()

    def kill(self) -> None:
        """End the group's workers: the same as :meth:`shutdown`."""
        self.shutdown()

    def timeout_for(self, method: str) -> float | None:
        """The deadline of a blocking call of ``method``: its ``@register(timeout_s=...)``,
        else the group's ``call_timeout_s`` (``None``: no deadline)."""
        bound = self._bound.get(method)
        override = bound[1].timeout_s if bound is not None else None
        return override if override is not None else self.call_timeout_s

    def wait_results(
        self,
        method: str,
        handles: list[Any],
        ranks: list[int] | None = None,
        timeout_s: float | None = None,
    ) -> list[Any]:
        """Results of a non-blocking call's per-rank ``handles`` (``ranks``: whose they are,
        default ``0..n-1``), in order; a failure raises :class:`WorkerGroupError` naming the
        group, rank, ``method`` and node, as a blocking call would. ``timeout_s`` defaults
        to :meth:`timeout_for` ``(method)``."""
        return self._wait(
            method,
            handles,
            list(range(len(handles))) if ranks is None else ranks,
            timeout_s if timeout_s is not None else self.timeout_for(method),
        )

    # ------------------------------------------------------------------ binding

    def _bind_worker_methods(self, user_class: type, prefix: str = "") -> list[str]:
        """Attach a group method for every registered method of ``user_class``.

        With ``prefix`` (colocated roles) the group method ``m`` calls the worker
        method ``{prefix}m``. Returns the bound names.
        """
        bound = []
        for name, spec in registered_methods(user_class).items():
            # A worker's own ``shutdown`` is run by the group's shutdown() (see there).
            if hasattr(type(self), name) and not prefix and name != "shutdown":
                raise ValueError(
                    f"worker method {user_class.__name__}.{name} clashes with a WorkerGroup "
                    f"attribute; rename the method"
                )
            self._bound[name] = (prefix + name, spec)
            self._group_methods[name] = _group_call(name, prefix + name, spec)
            bound.append(name)
        return bound

    def _pad_arguments(
        self, spec: MethodSpec, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any], Padding | None]:
        divisor = self.world_size
        if _is_mesh(spec):
            dp_ranks, _ = self.dp_layout(str(spec.dispatch_mode["mesh_name"]))  # type: ignore[index]
            divisor = max(dp_ranks) + 1
        paddings: list[Padding] = []

        def pad(value: Any) -> Any:
            if not is_shardable(value) or not hasattr(value, "__len__"):
                return value
            padded, padding = pad_to_multiple(value, divisor)
            paddings.append(padding)
            return padded

        new_args = tuple(pad(a) for a in args)
        new_kwargs = {k: pad(v) for k, v in kwargs.items()}
        return new_args, new_kwargs, paddings[0] if paddings else None

    # ------------------------------------------------------------------ mesh layouts

    def _mesh_answers(self, mesh_name: str) -> list[tuple[int, bool]]:
        """Each rank's ``(dp_rank, is_collect)`` for ``mesh_name``, as its worker answers."""
        answers: list[tuple[int, bool]] = self._query_dispatch_info(mesh_name)  # type: ignore[attr-defined]
        return answers

    def dp_layout(self, mesh_name: str) -> tuple[list[int], list[bool]]:
        """Per-rank ``(dp_rank, is_collect)`` for ``mesh_name``, asked of the workers once."""
        if mesh_name not in self._dp_layout_cache:
            answers = self._mesh_answers(mesh_name)
            dp_ranks = [int(a[0]) for a in answers]
            collect = [bool(a[1]) for a in answers]
            if sorted(set(dp_ranks)) != list(range(max(dp_ranks) + 1)):
                raise ValueError(f"mesh {mesh_name!r}: dp ranks {dp_ranks} must cover 0..N-1")
            self._dp_layout_cache[mesh_name] = (dp_ranks, collect)
        return self._dp_layout_cache[mesh_name]

    # ------------------------------------------------------------------ direct execution

    def execute_all_async(self, method_name: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Start ``method_name`` on every worker; list arguments of world-size length are split."""
        return self._execute(
            method_name, self._calls_for_all(args, kwargs), list(range(self.world_size))
        )

    def execute_all_sync(self, method_name: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Run ``method_name`` on every worker and return the results in rank order."""
        calls = self._calls_for_all(args, kwargs)
        ranks = list(range(self.world_size))
        timeout_s = self.timeout_for(method_name)
        return self._call(method_name, method_name, calls, ranks, timeout_s, data=False)

    def _calls_for_all(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
        """Every rank's ``(args, kwargs)`` under verl's execute_all convention (split once)."""
        split_args, split_kwargs = _maybe_split(self.world_size, args, kwargs)
        return _calls_for(list(range(self.world_size)), split_args, split_kwargs)

    execute_all = execute_all_async

    def execute_rank_zero_async(self, method_name: str, *args: Any, **kwargs: Any) -> Any:
        """Start ``method_name`` on rank 0 only."""
        return self._execute(method_name, [(args, kwargs)], [0])[0]

    def execute_rank_zero_sync(self, method_name: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``method_name`` on rank 0 and return its result."""
        handle = self.execute_rank_zero_async(method_name, *args, **kwargs)
        return self._wait(method_name, [handle], [0], self.timeout_for(method_name))[0]

    execute_rank_zero = execute_rank_zero_async

    # ------------------------------------------------------------------ colocated roles

    def spawn(self, prefix_set: Iterable[str]) -> dict[str, WorkerGroup]:
        """One group per colocated role, all sharing this group's workers.

        Needs a worker class made by ``create_colocated_worker_cls(_fused)``. The workers
        stay up while the group or any of its views is referenced; a view's
        :meth:`shutdown` only runs its role's own ``shutdown``, this group's ends them.
        """
        roles = role_classes(self.cls_with_init)
        views: dict[str, WorkerGroup] = {}
        for prefix in prefix_set:
            if prefix not in roles:
                raise ValueError(f"no colocated role {prefix!r}; roles: {sorted(roles)}")
            # A view shares the workers (and the backend's lifetime token, so the workers
            # live while the group or any view is referenced); its methods are its own.
            view = copy.copy(self)
            WorkerGroup.__init__(view, f"{self.name}.{prefix}", self.world_size)
            view.call_timeout_s = self.call_timeout_s
            view._bound.update(self._bound)
            view._group_methods.update(self._group_methods)
            view._is_view = True
            view._bind_worker_methods(roles[prefix], prefix=f"{prefix}_")
            views[prefix] = view
        return views

    def fuse(self, prefix_set: Iterable[str]) -> None:
        """Attach each role's group as an attribute: ``group.actor.update_actor(batch)``."""
        for prefix, view in self.spawn(prefix_set).items():
            if prefix in self.__dict__ or hasattr(type(self), prefix):
                raise ValueError(
                    f"cannot fuse role {prefix!r}: the group already has that attribute"
                )
            setattr(self, prefix, view)

    # ------------------------------------------------------------------ observability

    @property
    def timings(self) -> list[CallTiming]:
        """Dispatch / execute / collect timings of every call so far."""
        return list(self.timer.records)

    def export_trace(self, path: str | os.PathLike[str]) -> str:
        """Write this group's call timeline as Chrome-trace JSON (open in ui.perfetto.dev)."""
        return export_chrome_trace(self.timer.records, path)


def _group_call(name: str, remote_name: str, spec: MethodSpec) -> Callable[..., Any]:
    """``call(group, *args, **kwargs)`` for the group method ``name`` (worker method
    ``remote_name``); it refers to no group, so binding it creates no reference cycle."""
    fns = resolve_dispatch_mode(spec.dispatch_mode)
    rank_zero = spec.execute_mode is Execute.RANK_ZERO or spec.dispatch_mode is Dispatch.RANK_ZERO
    if spec.pad_to_equal and spec.dispatch_mode not in PADDABLE_MODES and not _is_mesh(spec):
        raise ValueError(
            f"{name}: pad_to_equal needs a data-parallel dispatch mode, not {spec.dispatch_mode!r}"
        )

    # Results that are data to be joined (DataProto shards), not small answers.
    data = _is_mesh(spec) or (
        not isinstance(spec.dispatch_mode, dict) and spec.dispatch_mode in PADDABLE_MODES
    )

    def group_call(self: WorkerGroup, *args: Any, **kwargs: Any) -> Any:
        with self.timer.phase(name, "dispatch"):
            padding = None
            if spec.pad_to_equal:
                args, kwargs, padding = self._pad_arguments(spec, args, kwargs)
            split_args, split_kwargs = fns["dispatch_fn"](self, *args, **kwargs)
            ranks = [0] if rank_zero else list(range(self.world_size))
            calls = _calls_for(ranks, split_args, split_kwargs)
        with self.timer.phase(name, "execute"):
            if spec.blocking:
                deadline = _deadline(self, spec)
                outputs = self._call(name, remote_name, calls, ranks, deadline, data)
            else:  # the future may outlive the group: its workers must not
                outputs = self._execute(remote_name, calls, ranks)
                self._keep_workers_for(outputs)
        if rank_zero:
            return outputs[0]
        with self.timer.phase(name, "collect"):
            return unpad(fns["collect_fn"](self, outputs), padding)

    group_call.__name__ = name
    group_call.__qualname__ = f"WorkerGroup.{name}"
    group_call.__doc__ = f"Group call of worker method {remote_name!r} ({spec.dispatch_mode})."
    return group_call


def _deadline(group: WorkerGroup, spec: MethodSpec) -> float | None:
    return spec.timeout_s if spec.timeout_s is not None else group.call_timeout_s


def _is_mesh(spec: MethodSpec) -> bool:
    return isinstance(spec.dispatch_mode, dict) and "mesh_name" in spec.dispatch_mode


def _calls_for(
    ranks: list[int], split_args: Sequence[Sequence[Any]], split_kwargs: dict[str, Any]
) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """Each of ``ranks``' ``(args, kwargs)`` from the split arguments. When every rank gets
    the very same objects (a broadcast), the ranks share one call tuple, found without a
    Python loop over the ranks: a large group's broadcast costs the driver O(1) here."""
    if all(map(all_same, split_args)) and all(map(all_same, split_kwargs.values())):
        return [_call_for_rank(ranks[0], split_args, split_kwargs)] * len(ranks)
    return [_call_for_rank(rank, split_args, split_kwargs) for rank in ranks]


def all_same(values: Sequence[Any]) -> bool:
    """Whether every entry of ``values`` is the very same object (a loop in C)."""
    return not values or all(map(operator.is_, values, itertools.repeat(values[0])))


def _call_for_rank(
    rank: int, split_args: Sequence[Sequence[Any]], split_kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    return tuple(a[rank] for a in split_args), {k: v[rank] for k, v in split_kwargs.items()}


def _maybe_split(
    world_size: int, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[list[list[Any]], dict[str, list[Any]]]:
    """verl's execute_all convention: world-size lists go one entry per rank, the rest to all."""

    def per_rank(value: Any) -> list[Any]:
        if isinstance(value, list) and len(value) == world_size:
            return value
        return [value] * world_size

    return [per_rank(a) for a in args], {k: per_rank(v) for k, v in kwargs.items()}
