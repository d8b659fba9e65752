"""``RayWorkerGroup``: a worker group whose ranks are Ray actors placed on a resource pool."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import weakref
from typing import Any

from hf_controller.errors import ConfigurationError
from hf_controller.ray.cluster import LOOPBACK_ENV, ensure_ray, started_local_ray
from hf_controller.ray.failures import wait_for_results
from hf_controller.ray.host import can_host
from hf_controller.ray.relay import RelayTree, resolve_relay_fanout
from hf_controller.ray.resource_pool import BundleSlot, RayResourcePool, node_of
from hf_controller.threads import THREADS_ENV
from hf_controller.worker import GROUP_NAME_ENV, RESERVED_ENV, master_address
from hf_controller.worker_class import ROLES_ATTR, ClassWithInitArgs, unwrap_worker_class
from hf_controller.worker_group import WorkerGroup


@functools.lru_cache(maxsize=1)
def _worker_import_roots() -> frozenset[str]:
    """The ``sys.path`` a fresh worker process of this interpreter starts with."""
    probe = [sys.executable, "-c", "import json, sys; print(json.dumps(sys.path))"]
    result = subprocess.run(
        probe, capture_output=True, text=True, timeout=60, cwd=tempfile.gettempdir(), check=False
    )
    paths = json.loads(result.stdout) if result.returncode == 0 else []
    return frozenset(os.path.realpath(p) for p in paths if p)


def _importable_by_workers(top_module: Any) -> bool:
    """True when a fresh process could import ``top_module`` (a top-level module/package)."""
    locations = list(getattr(top_module, "__path__", []))  # packages, namespace packages too
    if not locations and getattr(top_module, "__file__", None):
        locations = [top_module.__file__]
    roots = _worker_import_roots()
    return bool(locations) and all(
        os.path.realpath(os.path.dirname(location)) in roots for location in locations
    )


def make_picklable_for_workers(cls: type) -> None:
    """Let workers unpickle ``cls`` even when they cannot import its module.

    Classes whose top-level package a fresh process can import (installed,
    editable or on ``PYTHONPATH``) travel by reference as usual; classes from
    scripts, notebooks, test files and other source trees are sent by value,
    together with their whole top-level package (sibling modules they import
    included). Colocated worker classes bring their role classes along.
    """
    from ray import cloudpickle

    for klass in [cls, *getattr(cls, ROLES_ATTR, {}).values()]:
        top = sys.modules.get(klass.__module__.split(".")[0])
        if top is None or klass.__module__ == "__main__" or _importable_by_workers(top):
            continue  # __main__ is always sent by value
        with contextlib.suppress(ValueError):  # not a regular module: stays by reference
            cloudpickle.register_pickle_by_value(top)


class RayWorkerGroup(WorkerGroup):
    """A group of Ray actors, one per bundle of ``resource_pool``, all of one worker class.

    To let the caller (or ``HF_CONTROLLER_BACKEND``) pick the Ray or the local backend,
    build groups with :func:`hf_controller.make_worker_group`.

    ``call_timeout_s`` is the deadline of every blocking call (``None``: the
    ``HF_CONTROLLER_CALL_TIMEOUT_S`` environment variable, else none); a method's
    ``@register(timeout_s=...)`` overrides it. Past it, the call raises
    :class:`~hf_controller.WorkerTimeoutError` with the unanswered ranks' current stacks.

    ``relay_fanout`` (``None``: the ``HF_CONTROLLER_RELAY_FANOUT`` environment variable,
    else 16) is the most ranks the driver calls directly: a larger group's blocking calls
    go through a tree of relay actors (:mod:`hf_controller.ray.relay`), each reaching at
    most that many, so the driver's cost per call does not grow with the ranks. ``0``
    never uses relays. Failures are reported as on the direct path. Non-blocking calls,
    calls on some ranks only and calls made while non-blocking ones are still running
    (whose order the tree could change) go direct; so does every call while
    :attr:`use_relays` is ``False``.

    ``block_until_ready=False`` returns as soon as the workers are asked for, while their
    processes start and import (seconds): the caller can do other work meanwhile. The first
    call, or :meth:`wait_ready`, waits for them; a worker that failed to start raises there
    (shut the group down then, as the constructor does in the blocking case).

    Lifetime: the group's actors end, and its pool is told it has one user less (the
    last user releases the pool's placement groups), on :meth:`shutdown` (or ``kill``),
    or when the last reference to the group and its ``spawn`` views is dropped. Groups
    with ``detached=True`` are only ended by :meth:`shutdown`.

    ``named=True`` gives every worker the Ray actor name ``{name_prefix}:{rank}`` (listed in
    :attr:`worker_names`) without making it detached: another process of the same job (a
    Ray task, say) can then attach to the group with :meth:`from_detached`. Detached
    groups are always named.
    """

    def __init__(
        self,
        resource_pool: RayResourcePool | None = None,
        ray_cls_with_init: ClassWithInitArgs | None = None,
        name_prefix: str | None = None,
        detached: bool = False,
        worker_names: list[str] | None = None,
        worker_env: dict[str, str] | None = None,
        call_timeout_s: float | None = None,
        block_until_ready: bool = True,
        relay_fanout: int | None = None,
        named: bool = False,
        **kwargs: Any,
    ) -> None:
        if ray_cls_with_init is None:
            raise ConfigurationError("RayWorkerGroup needs ray_cls_with_init (the worker class)")
        if kwargs:
            hint = (
                "; to choose a backend use hf_controller.make_worker_group(..., backend=...)"
                if "backend" in kwargs
                else ""
            )
            raise ConfigurationError(f"unknown RayWorkerGroup arguments {sorted(kwargs)}{hint}")
        ensure_ray()
        user_class = unwrap_worker_class(ray_cls_with_init.cls)
        name = name_prefix or f"{user_class.__name__}_{uuid.uuid4().hex[:6]}"
        start_refs: list[Any] | None = None  # the hosts' constructions, when hosted
        if worker_names is not None:
            self._workers = _attach(worker_names)
            self._worker_names = list(worker_names)
        elif resource_pool is not None:
            self._worker_names = []
            self._workers, start_refs = self._create_workers(
                name, resource_pool, ray_cls_with_init, detached, worker_env, named
            )
        else:
            raise ConfigurationError("RayWorkerGroup needs a resource_pool or worker_names")
        self._relays = (  # relays only for groups this constructor placed on a pool
            None
            if resource_pool is None or worker_names is not None or detached
            else _relays_for(self._workers, resource_pool, relay_fanout, start_refs)
        )
        self.use_relays = True  # False: every call goes direct (see the class docs)
        pool = resource_pool if worker_names is None else None
        if pool is not None:
            pool._add_user()
            if detached:
                pool._keep_until_released()
        # The finalizer watches a token shared with every spawn() view (not the group), so
        # the workers live while the group or any view is referenced. It holds the actor
        # handles and the pool, never the group, so it does not keep the group alive.
        self._lifetime = _Lifetime()
        self._in_flight = _InFlight()
        relays = self._relays.relays if self._relays is not None else []
        self._finalizer = weakref.finalize(
            self._lifetime,
            _end_group,
            [*self._workers, *relays],
            pool,
            detached or pool is None,
            self._in_flight,
        )
        self._finalizer.atexit = False  # at exit Ray ends the job's actors and groups itself
        super().__init__(name, len(self._workers), call_timeout_s)
        self.cls_with_init = self.ray_cls_with_init = ray_cls_with_init
        # Workers built inside prestarted hosts (hf_controller.ray.host) are called through them.
        self._hosted = start_refs is not None
        # Shared with every spawn() view (copies share the object), so one wait serves all.
        self._readiness = _Readiness(
            start_refs or [w._hf_process_info.remote() for w in self._workers]
        )
        if block_until_ready:
            try:
                self.wait_ready()
            except BaseException:
                self.shutdown()  # workers that cannot start must not hold their bundles
                raise
        self._bind_worker_methods(user_class)

    # ------------------------------------------------------------------ creation

    def _create_workers(
        self,
        name: str,
        pool: RayResourcePool,
        cls_with_init: ClassWithInitArgs,
        detached: bool,
        worker_env: dict[str, str] | None,
        named: bool = False,
    ) -> tuple[list[Any], list[Any] | None]:
        """The workers (actors, or the pool's prestarted hosts building the class), and the
        hosts' construction refs (``None`` for actors of their own)."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        clashes = sorted(set(worker_env or {}) & set(RESERVED_ENV))
        if clashes:
            raise ConfigurationError(
                f"worker_env cannot set {clashes}: the group assigns them to every worker"
            )
        slots = pool.slots()
        local_ranks, local_sizes = _local_layout(slots)
        master_addr, master_port = _rendezvous_address(slots[0])
        user_class = unwrap_worker_class(cls_with_init.cls)
        make_picklable_for_workers(user_class)
        actor_class, env_at_init, remote_options = _actor_class(cls_with_init.cls, worker_env)
        # The loopback switch only concerns a local Ray we started; a real cluster's
        # workers keep their nodes' own setting (and so their network addresses).
        loopback = {LOOPBACK_ENV: os.environ.get(LOOPBACK_ENV, "0")} if started_local_ray() else {}
        threads = pool.worker_threads()
        hosts = pool.take_hosts()
        options_of_class = getattr(cls_with_init, "options", {})
        if hosts and (detached or named or not can_host(user_class, options_of_class, worker_env)):
            for host in hosts:  # this group cannot use them: they would only hold memory
                ray.kill(host)
            hosts = []
        workers = []
        start_refs = []
        for rank, slot in enumerate(slots):
            env = {
                **loopback,
                THREADS_ENV: str(threads[rank]),  # a worker_env of the caller may override it
                **(worker_env or {}),
                "RANK": str(rank),
                "WORLD_SIZE": str(len(slots)),
                "LOCAL_RANK": str(local_ranks[rank]),
                "LOCAL_WORLD_SIZE": str(local_sizes[rank]),
                "RAY_LOCAL_WORLD_SIZE": str(local_sizes[rank]),
                "MASTER_ADDR": master_addr,
                "MASTER_PORT": str(master_port),
                GROUP_NAME_ENV: name,
            }
            if hosts:
                args = (env, user_class, cls_with_init.args, cls_with_init.kwargs)
                start_refs.append(hosts[rank]._hf_construct.remote(*args))
                workers.append(hosts[rank])
                continue
            options: dict[str, Any] = {
                **pool.actor_resources(),
                "scheduling_strategy": PlacementGroupSchedulingStrategy(
                    slot.placement_group, slot.bundle_index
                ),
                **({} if env_at_init else {"runtime_env": _with_env(remote_options, env)}),
                **getattr(cls_with_init, "options", {}),
            }
            if detached or named:  # a host cannot take a name: these are actors of their own
                options["name"] = f"{name}:{rank}"
                self._worker_names.append(f"{name}:{rank}")
            if detached:
                options["lifetime"] = "detached"
            args = (env, *cls_with_init.args) if env_at_init else cls_with_init.args
            workers.append(actor_class.options(**options).remote(*args, **cls_with_init.kwargs))
        return workers, (start_refs if hosts else None)

    def wait_ready(self, timeout_s: float | None = None) -> None:
        """Wait until every worker process has started and constructed its class (once).

        Raises :class:`~hf_controller.WorkerGroupError` naming the rank whose start failed
        (:class:`~hf_controller.WorkerTimeoutError` past ``timeout_s``). Also learns each
        worker's pid and node, which failure reports name. A group with relays waits for
        them here too, within the same ``timeout_s``: a call's deadline never counts them.
        """
        readiness = self._readiness
        if readiness.info is None:
            ranks = list(range(len(readiness.refs)))
            # By default no deadline: start-up (process spawn, imports, the worker's __init__,
            # which may load a model) takes as long as it takes; a dead worker still surfaces.
            start = time.monotonic()
            infos = wait_for_results(self.name, "__init__", readiness.refs, ranks, {}, timeout_s)
            if self._relays is not None:  # started beside the workers: part of start-up
                spent = time.monotonic() - start
                left = None if timeout_s is None else max(0.0, timeout_s - spent)
                self._relays.wait_ready(self.name, left)
            readiness.info = dict(enumerate(infos))

    @classmethod
    def from_detached(
        cls,
        name_prefix: str | None = None,
        ray_cls_with_init: ClassWithInitArgs | None = None,
        worker_names: list[str] | None = None,
        world_size: int | None = None,
    ) -> RayWorkerGroup:
        """Reattach to the detached workers of a group created with ``detached=True``.

        Name them with ``worker_names``, or give ``name_prefix`` and ``world_size``. Workers
        of a group made with ``named=True`` can be attached to the same way (from the same
        job: they end with it).
        """
        if worker_names is None:
            if name_prefix is None or world_size is None or world_size < 1:
                raise ConfigurationError(
                    f"from_detached needs worker_names, or name_prefix and a world_size >= 1 "
                    f"(got name_prefix={name_prefix!r}, world_size={world_size!r})"
                )
            worker_names = [f"{name_prefix}:{rank}" for rank in range(world_size)]
        group = cls(ray_cls_with_init=ray_cls_with_init, worker_names=worker_names)
        if name_prefix is not None:
            group.name = name_prefix
            group.timer.group = name_prefix
        return group

    # ------------------------------------------------------------------ backend hooks

    @property
    def workers(self) -> list[Any]:
        """The actor handles, in rank order."""
        return list(self._workers)

    @property
    def worker_names(self) -> list[str]:
        """Ray actor names of the workers (empty unless made with ``detached`` or ``named``)."""
        return list(self._worker_names)

    def _execute(
        self, method: str, calls: list[tuple[tuple[Any, ...], dict[str, Any]]], ranks: list[int]
    ) -> list[Any]:
        if self._hosted:  # through the host; Ray's task name still says which method
            return [
                self._workers[rank]._hf_call.options(name=method).remote(method, *args, **kwargs)
                for rank, (args, kwargs) in zip(ranks, calls, strict=True)
            ]
        return [
            getattr(self._workers[rank], method).remote(*args, **kwargs)
            for rank, (args, kwargs) in zip(ranks, calls, strict=True)
        ]

    def _wait(
        self, method: str, handles: list[Any], ranks: list[int], timeout_s: float | None = None
    ) -> list[Any]:
        self.wait_ready(timeout_s)  # a group made with block_until_ready=False: its first call
        info = self._readiness.info or {}
        return wait_for_results(self.name, method, handles, ranks, info, timeout_s)

    def _call(
        self,
        method: str,
        remote_name: str,
        calls: list[tuple[tuple[Any, ...], dict[str, Any]]],
        ranks: list[int],
        timeout_s: float | None,
        data: bool,
    ) -> list[Any]:
        tree = self._relays
        direct = not self.use_relays or len(ranks) != self.world_size
        if tree is None or direct or self._in_flight.pending():
            return super()._call(method, remote_name, calls, ranks, timeout_s, data)
        self.wait_ready(timeout_s)
        info = self._readiness.info or {}
        return tree.run(self.name, method, remote_name, calls, info, timeout_s, fetch=not data)

    def _keep_workers_for(self, handles: list[Any]) -> None:
        self._in_flight.add(handles)

    def _workers_alive(self) -> bool:
        return bool(self._finalizer.alive)

    def _end_workers(self) -> None:
        """End every worker process (detached ones included) and tell the pool; the pool
        is released when no other group uses it (see :class:`RayResourcePool`)."""
        state = self._finalizer.detach()  # None once ended
        if state is not None:
            workers, pool, *_ = state[2]
            _end_group(workers, pool, detached=False)


class _Readiness:
    """The workers' start-up answers (``_hf_process_info`` refs) and, once waited for, the
    pid and node of each rank."""

    def __init__(self, refs: list[Any]) -> None:
        self.refs = refs
        self.info: dict[int, dict[str, Any]] | None = None


class _Lifetime:
    """Token whose death (no group or view refers to it any more) ends the workers."""


IN_FLIGHT_GRACE_S = 3600.0
"""Longest wait, once a group is dropped, for its non-blocking calls still running before its
workers are killed anyway (a call stuck for good must not hold them forever)."""


class _InFlight:
    """The object refs of a group's non-blocking calls not known to be done: what a dropped
    group's workers finish before they end, so that a future outlives its group.

    Refs already done are dropped whenever more are added (a zero-timeout ``ray.wait`` that
    fetches nothing), so a long-lived group pins at most its latest calls' results.
    """

    def __init__(self) -> None:
        self.refs: list[Any] = []
        self._lock = threading.Lock()

    def add(self, refs: list[Any]) -> None:
        """Track ``refs`` (object refs of one call), forgetting the ones already done."""
        import ray

        with self._lock:
            held = [*self.pending(), *(r for r in refs if isinstance(r, ray.ObjectRef))]
            self.refs = held

    def pending(self) -> list[Any]:
        """The tracked refs not done yet."""
        import ray

        if not self.refs:
            return []
        _, pending = ray.wait(self.refs, num_returns=len(self.refs), timeout=0, fetch_local=False)
        return list(pending)


def _end_group(
    workers: list[Any],
    pool: RayResourcePool | None,
    detached: bool,
    in_flight: _InFlight | None = None,
) -> None:
    """Kill ``workers`` and tell ``pool`` one group fewer uses it; quiet and best effort,
    since it also runs from a finalizer (possibly after ``ray.shutdown()``). Does nothing
    for ``detached`` groups, which only an explicit ``shutdown()`` ends.

    A dropped group's calls still ``in_flight`` finish first: a background thread waits for
    them (at most :data:`IN_FLIGHT_GRACE_S`), then ends the workers.
    """
    import ray

    if detached or not ray.is_initialized():
        return
    pending: list[Any] = []
    if in_flight is not None:
        with contextlib.suppress(Exception):  # refs of a Ray session that ended: none pending
            pending = in_flight.pending()
    if pending:
        end_later = functools.partial(_end_after, pending, workers, pool)
        threading.Thread(target=end_later, name="hf-group-end", daemon=True).start()
        return
    _kill(workers, pool)


def _end_after(pending: list[Any], workers: list[Any], pool: RayResourcePool | None) -> None:
    """Wait for ``pending`` refs (at most :data:`IN_FLIGHT_GRACE_S`), then end the group."""
    import ray

    with contextlib.suppress(Exception):  # Ray shut down meanwhile: nothing left to end
        ray.wait(pending, num_returns=len(pending), timeout=IN_FLIGHT_GRACE_S, fetch_local=False)
    if ray.is_initialized():
        _kill(workers, pool)


def _kill(workers: list[Any], pool: RayResourcePool | None) -> None:
    """Kill ``workers`` (already dead is fine) and tell ``pool`` one group fewer uses it."""
    import ray

    for worker in workers:
        with contextlib.suppress(Exception):  # already dead is fine
            ray.kill(worker, no_restart=True)
    if pool is not None:
        with contextlib.suppress(Exception):
            pool._remove_user()


def _actor_class(cls: Any, worker_env: dict[str, str] | None) -> tuple[Any, bool, dict[str, Any]]:
    """The Ray actor class for the worker class ``cls`` (plain or ``@ray.remote``), whether
    its constructor takes the rank's environment first (else a runtime_env carries it), and
    the options ``cls`` was decorated with.

    Without a worker_env the rank's environment is set by the constructor, not by a
    runtime_env: an actor with a runtime_env always gets a fresh process, started through
    Ray's setup_worker (twice the start-up CPU; 64 light workers took 66 s here, against
    36 s for as many plain actors). A decorated class is rewrapped with its own options,
    unless they hold a runtime_env (which the rank's environment then joins).
    """
    import ray

    decorated = hasattr(cls, "remote")
    remote_options = dict(getattr(cls, "_default_options", {})) if decorated else {}
    user_class = unwrap_worker_class(cls)
    if not worker_env and "runtime_env" not in remote_options:
        setting = _setting_rank_env(user_class)
        actor: Any = (
            ray.remote(**remote_options)(setting) if remote_options else ray.remote(setting)
        )
        return actor, True, remote_options
    return (cls if decorated else ray.remote(user_class)), False, remote_options


def _with_env(remote_options: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    """The runtime_env of a worker: its class's own (``@ray.remote(runtime_env=...)``, which
    the actor's options would replace) with the rank's environment added to its env_vars."""
    runtime_env = dict(remote_options.get("runtime_env") or {})
    runtime_env["env_vars"] = {**runtime_env.get("env_vars", {}), **env}
    return runtime_env


def _setting_rank_env(cls: type) -> type:
    """``cls`` whose constructor first takes the rank's environment and sets it, before the
    class's own ``__init__`` runs (what a prestarted host does too). Same name, module and
    docs as ``cls``; it travels to the workers by value."""

    class RankEnvironment(cls):
        def __init__(self, _hf_env: dict[str, str], /, *args: Any, **kwargs: Any) -> None:
            os.environ.update(_hf_env)
            super().__init__(*args, **kwargs)

    for attribute in ("__name__", "__qualname__", "__module__", "__doc__"):
        setattr(RankEnvironment, attribute, getattr(cls, attribute))
    return RankEnvironment


def _relays_for(
    workers: list[Any],
    pool: RayResourcePool,
    relay_fanout: int | None,
    start_refs: list[Any] | None,
) -> RelayTree | None:
    """The group's relay tree when it has more ranks than the fan-out (else ``None``):
    leaves per node, each relay placed on its first rank's bundle (a relay asks for no
    CPU), so a leaf runs next to the workers it calls."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    fanout = resolve_relay_fanout(relay_fanout)
    if not 0 < fanout < len(workers):
        return None

    slots = pool.slots()
    nodes: dict[int, list[int]] = {}
    for rank, slot in enumerate(slots):
        nodes.setdefault(id(slot.placement_group), []).append(rank)
    placement = [PlacementGroupSchedulingStrategy(s.placement_group, s.bundle_index) for s in slots]
    return RelayTree.start(workers, list(nodes.values()), fanout, start_refs is not None, placement)


def _rendezvous_address(slot: BundleSlot) -> tuple[str, int]:
    """Address and a free port on rank 0's node for the torch.distributed rendezvous.

    Found in this process when rank 0's bundle is on this process's node (always so with a
    local Ray): a task would first wait for Ray to start a worker process (1-2 s on a small
    machine). Otherwise a task placed on rank 0's bundle finds them there.
    """
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    if node_of(slot.placement_group) == ray.get_runtime_context().get_node_id():
        return master_address()
    first = PlacementGroupSchedulingStrategy(slot.placement_group, slot.bundle_index)
    address: tuple[str, int] = ray.get(
        ray.remote(master_address).options(num_cpus=0, scheduling_strategy=first).remote()
    )
    return address


def _local_layout(slots: list[BundleSlot]) -> tuple[list[int], list[int]]:
    """Local rank and local world size per rank: counted per placement group (node)."""
    per_group: dict[int, int] = {}
    local_ranks = []
    for slot in slots:
        key = id(slot.placement_group)
        local_ranks.append(per_group.get(key, 0))
        per_group[key] = per_group.get(key, 0) + 1
    return local_ranks, [per_group[id(s.placement_group)] for s in slots]


def _attach(worker_names: list[str]) -> list[Any]:
    """The handles of the named workers ``worker_names``; an empty list is an error."""
    if not worker_names:
        raise ConfigurationError(
            "RayWorkerGroup got worker_names=[] (e.g. from_detached(worker_names=[])): a "
            "group needs at least one worker. Pass the worker_names of a group created "
            "with detached=True or named=True (a plain group's worker_names is empty), "
            "or from_detached(name_prefix=..., world_size=...)"
        )
    return [_get_actor(n) for n in worker_names]


def _get_actor(name: str) -> Any:
    import ray

    try:
        return ray.get_actor(name)
    except ValueError:
        raise ConfigurationError(
            f"no detached worker named {name!r} in Ray namespace "
            f"{ray.get_runtime_context().namespace!r}; was the group created with detached=True "
            f"and the same name_prefix?"
        ) from None
