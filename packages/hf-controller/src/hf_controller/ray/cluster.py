"""Ray for the controller: start a local one or join a cluster, and describe its nodes.

:func:`ensure_ray` connects the driver (joining a running cluster when there is
one); :func:`cluster_nodes` summarises every alive node (CPU, GPU, memory, total
and free) so pools and trainers can check a layout before reserving anything;
:func:`pick_nodes` chooses one distinct node per pool entry.
"""

from __future__ import annotations

import logging
import os
import signal
import stat
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hf_controller.errors import ConfigurationError

logger = logging.getLogger(__name__)

LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
AUTH_MODE_ENV = "RAY_AUTH_MODE"
"""Ray's token-authentication switch (``token`` or ``disabled``), read by every Ray process."""
AUTH_TOKEN_PATH_ENV = "RAY_AUTH_TOKEN_PATH"
"""Where Ray keeps the token when not at its default ``~/.ray/auth_token``."""
# ray.init arguments that describe a node Ray starts; a running cluster refuses them.
_START_ONLY_ARGS = ("num_cpus", "num_gpus", "resources", "labels", "object_store_memory")
_GIB = 1024.0**3

_BACKGROUND_THREAD = "hf-ray-start"
"""The name of :func:`start_ray_in_background`'s thread."""

_local_gcs_address: str | None = None  # set when ensure_ray started the Ray this process uses


class _BackgroundStart:
    """The thread of :func:`start_ray_in_background`, its end and its error, if any.

    The thread stays, idle, for the rest of the process once Ray is up: Ray ties the
    processes it starts (GCS, raylet) to the *thread* that started them (Linux
    ``PR_SET_PDEATHSIG``), so they would be killed if it ended.
    """

    def __init__(self, init_kwargs: dict[str, Any]) -> None:
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.thread = threading.Thread(
            target=self._run, args=(init_kwargs,), name=_BACKGROUND_THREAD, daemon=True
        )

    def _run(self, init_kwargs: dict[str, Any]) -> None:
        try:
            _connect(**init_kwargs)
        except BaseException as error:  # handed to the caller by the next ensure_ray()
            self.error = error
            return
        finally:
            self.done.set()
        threading.Event().wait()  # park: see the class docstring


_background: _BackgroundStart | None = None
_background_lock = threading.Lock()


def start_ray_in_background(**init_kwargs: Any) -> None:
    """Start (or join) Ray as :func:`ensure_ray` would, in a thread, and return once the
    thread runs (after importing Ray here: 0.3 s).

    The "start early" phase of an entry point: call it first, before importing torch and
    preparing data, so that Ray's own processes (GCS, raylet, agents: seconds on a small
    machine) start meanwhile. The next :func:`ensure_ray` waits for it and raises its
    error, if any; a second call before then does nothing. Same arguments as
    :func:`ensure_ray`.

    Ray is imported in the caller's thread, not in the background one: there, it shared the
    interpreter lock with the caller's own imports (torch) and took twice as long, and Ray's
    first process (the GCS) started 0.4 s later (measured in docs/benchmarks.md).
    """
    global _background
    if _background is not None:  # a start is under way
        return
    import ray  # here, not in the thread, where it would share the GIL with the caller's imports

    if ray.is_initialized():
        return
    _quiet_sigterm_warning()
    _background = _BackgroundStart(dict(init_kwargs))
    _background.thread.start()


def _wait_for_background_start() -> None:
    """Wait for :func:`start_ray_in_background`'s thread; raise what it raised (once).

    Every thread that calls :func:`ensure_ray` meanwhile waits (e.g. the trainer's and one
    that starts worker processes early): none may start a second Ray while the first starts.
    """
    global _background
    started = _background
    if started is None:
        return
    started.done.wait()
    with _background_lock:
        if _background is not started:  # another waiter took it (and its error) first
            return
        _background = None
    if started.error is not None:
        raise started.error


def ensure_ray(**init_kwargs: Any) -> None:
    """Connect this process to Ray: join a running cluster, or start a local one.

    * Ray already initialised here (the caller ran ``ray.init``): nothing changes.
    * ``RAY_ADDRESS`` set, or ``address=`` given (other than ``"local"``): join that
      cluster. Arguments that only describe a node being started (``num_cpus``,
      ``num_gpus``, ``resources``, ``labels``, ``object_store_memory``) are dropped,
      since the cluster's nodes declare their own; the loopback switch is left alone,
      so the cluster's workers keep their real network addresses. A failed join without
      ``RAY_AUTH_MODE=token`` raises a ``ConnectionError`` that says how to send the
      cluster's token (Ray sends none to an explicit address on its own).
    * Otherwise start a local single-node Ray bound to 127.0.0.1: ``LOOPBACK_ENV``
      defaults to ``"0"`` for the driver, the raylet and (see :func:`started_local_ray`)
      the workers of every group. It also requires Ray's token authentication
      (``RAY_AUTH_MODE=token`` unless set otherwise, see :func:`use_token_auth_by_default`):
      another local user's process cannot reach the GCS or raylets without the token.

    The Ray dashboard: a cluster joined by address keeps whatever it was started with
    (``ray start --head`` runs one unless told otherwise; its URL is logged).
    A local Ray starts without one unless ``include_dashboard=True``, which needs the
    dashboard's packages (``pip install 'hf-controller[dashboard]'``, i.e. ``ray[default]``):
    without them it is a :class:`ConfigurationError` saying so; with them the URL is
    logged and returned by :func:`dashboard_url`. The namespace defaults to
    ``"hybridflow"``. Other keyword arguments go to ``ray.init``.
    """
    import ray

    _wait_for_background_start()
    if not ray.is_initialized():
        _connect(**init_kwargs)
    _rearm_sigterm_handler(signal.getsignal(signal.SIGTERM))


class _NoSigtermWarningFilter(logging.Filter):
    """Drops Ray's "SIGTERM handler is not set because current thread is not the main thread"
    warning, logged when ``ray.init`` runs in :func:`start_ray_in_background`'s thread."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (
            record.threadName == _BACKGROUND_THREAD
            and str(record.msg).startswith("SIGTERM handler is not set")
        )


def _quiet_sigterm_warning() -> None:
    """Hide Ray's warning that ``ray.init`` in a thread sets no SIGTERM handler (once).

    Ray's handler only calls ``sys.exit``; in the main thread it would replace the process's
    own (an entry point's, see :func:`_rearm_sigterm_handler`), so that the background
    thread sets none is what is wanted, and the warning is noise.
    """
    ray_worker_logger = logging.getLogger("ray._private.worker")
    if not any(isinstance(f, _NoSigtermWarningFilter) for f in ray_worker_logger.filters):
        ray_worker_logger.addFilter(_NoSigtermWarningFilter())


def _rearm_sigterm_handler(handler: Any) -> None:
    """Put the process's own Python SIGTERM ``handler`` back in force, from the main thread.

    Starting Ray installs its C++ failure-signal handler for SIGTERM in this process (it
    prints ``*** SIGTERM received`` and a native stack, then calls the handler it replaced),
    and ``ray.init`` in the main thread sets a Python handler that only calls ``sys.exit``.
    An entry point that handles SIGTERM itself (the ``hybridflow`` command stops the run
    as on Ctrl-C) keeps its handler: installing it again replaces both. Ray keeps its
    handlers of the crash signals (SIGSEGV, SIGABRT, ...). Nothing changes for a process
    without a Python SIGTERM handler, or outside the main thread (``signal`` refuses there).
    """
    if callable(handler) and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)


def _connect(**init_kwargs: Any) -> None:
    """:func:`ensure_ray`'s work: ``ray.init`` as its docstring says."""
    import ray

    global _local_gcs_address
    if ray.is_initialized():
        return
    address = init_kwargs.get("address") or os.environ.get("RAY_ADDRESS") or "local"
    joining = address != "local"
    if joining:
        for name in (*_START_ONLY_ARGS, "include_dashboard"):
            init_kwargs.pop(name, None)
    else:
        if init_kwargs.get("include_dashboard"):
            _check_dashboard_installed()
        use_loopback_by_default()
        use_token_auth_by_default()
        # Explicit: without it ray.init would attach to any cluster it finds on this machine
        # (a `ray start` left running, a test cluster), which is joining, not starting.
        init_kwargs["address"] = "local"
        init_kwargs.setdefault("include_dashboard", False)
    init_kwargs.setdefault("namespace", "hybridflow")
    in_main_thread = threading.current_thread() is threading.main_thread()
    sigterm_handler = signal.getsignal(signal.SIGTERM) if in_main_thread else None
    try:
        ray.init(**init_kwargs)
    except ConnectionError as error:
        if joining and os.environ.get(AUTH_MODE_ENV, "").lower() != "token":
            raise ConnectionError(_token_hint(address, error)) from error
        raise
    _rearm_sigterm_handler(sigterm_handler)  # ray.init set its own
    _local_gcs_address = None if joining else ray.get_runtime_context().gcs_address
    if not joining:
        _keep_token_private()
    url = dashboard_url()
    if url is not None:
        logger.warning("Ray dashboard: %s", url)  # warning: shown by default logging config


def _token_hint(address: str, error: ConnectionError) -> str:
    """Why joining ``address`` may have failed when this driver sends no Ray token, and the fix."""
    return (
        f"could not join the Ray cluster at {address!r} ({error}). If the cluster requires "
        f"Ray's token authentication (`ray start` turns it on when a token exists, e.g. at "
        f"~/.ray/auth_token, which a local Ray started by HybridFlow creates), this driver "
        f"must send the token, which Ray does not do for an address given explicitly: "
        f"export {AUTH_MODE_ENV}=token, with the cluster's token in RAY_AUTH_TOKEN or in the "
        f"file named by {AUTH_TOKEN_PATH_ENV} (default ~/.ray/auth_token); 'InvalidAuthToken' "
        f"lines above mean this was the cause. Otherwise check that the head is running "
        f"and reachable at that address (`ray status --address {address}`)"
    )


def dashboard_url() -> str | None:
    """``http://host:port`` of the Ray dashboard of the connected cluster, or ``None`` when
    it has none (or Ray is not initialised here)."""
    import ray

    if not ray.is_initialized():
        return None
    node = ray._private.worker._global_node  # the public accessor is deprecated for this
    url = getattr(node, "webui_url", None) if node is not None else None
    if not url:
        return None
    return url if "://" in url else f"http://{url}"


def _check_dashboard_installed() -> None:
    """Refuse ``include_dashboard=True`` early when the dashboard's packages are missing
    (Ray would log an error and raise a bare ``Exception`` from deep inside ``ray.init``)."""
    from ray._private.utils import get_dashboard_dependency_error

    error = get_dashboard_dependency_error()
    if error is not None:
        raise ConfigurationError(
            f"the Ray dashboard was asked for (include_dashboard=True, e.g. "
            f"trainer.ray_dashboard=true) but its packages are not installed ({error}); run "
            f"pip install 'hf-controller[dashboard]' (which installs 'ray[default]'), or turn "
            f"the dashboard off"
        )


def use_token_auth_by_default() -> None:
    """Require Ray's token authentication of a Ray started here unless ``AUTH_MODE_ENV`` is set.

    Ray (2.5x and later) generates the token at ``~/.ray/auth_token`` (or
    ``RAY_AUTH_TOKEN_PATH``) when a local Ray starts without one; the raylet and the worker
    processes inherit ``RAY_AUTH_MODE`` from this process and read the token from there.
    ``RAY_AUTH_MODE=disabled`` turns it off (a warning says so).
    """
    mode = os.environ.get(AUTH_MODE_ENV)
    if mode is None:
        os.environ[AUTH_MODE_ENV] = "token"
        from ray._raylet import Config  # type: ignore[attr-defined]  # not in its stubs

        # Ray caches its config (the auth mode with it) at import: re-read the environment,
        # as Ray's own switch does, so this driver sends the token it requires.
        Config.initialize("")
    elif mode.lower() != "token":
        logger.warning(
            "%s=%s: the local Ray starts without token authentication, so any process on "
            "this machine can run code in it; unset %s to require a token",
            AUTH_MODE_ENV,
            mode,
            AUTH_MODE_ENV,
        )


def _keep_token_private() -> None:
    """Make the token file readable by its owner only (Ray writes it with the umask's mode)."""
    if os.environ.get(AUTH_MODE_ENV, "").lower() != "token" or os.environ.get("RAY_AUTH_TOKEN"):
        return
    path = Path(os.environ.get(AUTH_TOKEN_PATH_ENV) or Path.home() / ".ray" / "auth_token")
    try:
        info = path.stat()
        if info.st_uid == os.getuid() and info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            path.chmod(stat.S_IRUSR | stat.S_IWUSR)
    except OSError as error:  # the token still works; only its privacy is not improved
        logger.warning("could not make the Ray token file %s private: %s", path, error)


def use_loopback_by_default() -> None:
    """Bind Ray nodes started from this process to 127.0.0.1 unless ``LOOPBACK_ENV`` says otherwise.

    For Ray started here only (a local Ray, or a test cluster of local nodes).
    """
    # Ray reads this switch once, at import; set both so the raylet and the
    # driver agree on the loopback address whatever was imported first.
    os.environ.setdefault(LOOPBACK_ENV, "0")
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = os.environ[LOOPBACK_ENV] != "0"


def started_local_ray() -> bool:
    """True when the Ray this process is connected to is a local one :func:`ensure_ray` started.

    Only then do worker groups pass the loopback switch on to their workers; on a
    cluster joined by address the nodes' own settings apply.
    """
    import ray

    return (
        _local_gcs_address is not None
        and ray.is_initialized()
        and ray.get_runtime_context().gcs_address == _local_gcs_address
    )


@dataclass(frozen=True)
class NodeSummary:
    """One alive Ray node: identity, and CPU / GPU / memory in total and free right now.

    ``memory`` values are bytes. Free values drop as placement groups and actors
    reserve resources, and can be stale by the time they are read.
    """

    node_id: str
    address: str
    cpus: float
    gpus: float
    memory: float
    cpus_free: float
    gpus_free: float
    memory_free: float

    def fits(self, need: Mapping[str, float], free: bool = False) -> bool:
        """Whether ``need`` (``{"CPU": 2, "GPU": 1}``) fits in the total (or free) resources."""
        have = (
            {"CPU": self.cpus_free, "GPU": self.gpus_free}
            if free
            else {"CPU": self.cpus, "GPU": self.gpus}
        )
        return all(have.get(name, 0.0) + 1e-9 >= amount for name, amount in need.items())

    def describe(self) -> str:
        """One line: ``node 1a2b3c4d (10.0.0.5): CPU 1.5/2 free, GPU 0/1 free, memory ...``."""
        return (
            f"node {self.node_id[:8]} ({self.address}): CPU {self.cpus_free:g}/{self.cpus:g} "
            f"free, GPU {self.gpus_free:g}/{self.gpus:g} free, memory "
            f"{self.memory_free / _GIB:.1f}/{self.memory / _GIB:.1f} GiB free"
        )


def cluster_nodes() -> list[NodeSummary]:
    """Every alive node of the connected Ray cluster, the driver's own node first.

    Starts (or joins) Ray with :func:`ensure_ray` if needed. Use it to check a layout
    (e.g. ``nnodes`` x ``gpus per node``) before building pools.
    """
    import ray
    from ray._private import state

    ensure_ray()
    available = state.available_resources_per_node()
    driver_node = ray.get_runtime_context().get_node_id()
    summaries = []
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        total, free = node.get("Resources", {}), available.get(node["NodeID"], {})
        summaries.append(
            NodeSummary(
                node_id=node["NodeID"],
                address=node.get("NodeManagerAddress", "?"),
                cpus=float(total.get("CPU", 0.0)),
                gpus=float(total.get("GPU", 0.0)),
                memory=float(total.get("memory", 0.0)),
                cpus_free=float(free.get("CPU", 0.0)),
                gpus_free=float(free.get("GPU", 0.0)),
                memory_free=float(free.get("memory", 0.0)),
            )
        )
    return sorted(summaries, key=lambda n: n.node_id != driver_node)  # stable: keeps Ray's order


def describe_nodes(nodes: Sequence[NodeSummary]) -> str:
    """All nodes as ``"; "``-joined :meth:`NodeSummary.describe` lines."""
    return "; ".join(node.describe() for node in nodes) or "no alive nodes"


def _join_hint() -> str:
    import ray

    address = ray.get_runtime_context().gcs_address if ray.is_initialized() else "<head>:6379"
    return f"start more nodes with `ray start --address={address}`"


def pick_nodes(
    needs: Sequence[Mapping[str, float]],
    nodes: Sequence[NodeSummary],
    taken: Mapping[int, str] | None = None,
) -> list[NodeSummary]:
    """One distinct node per entry of ``needs`` (resources its bundles need on one node).

    ``taken`` maps entry index -> node id for entries already placed (a reattached
    reservation); the others get a node whose total resources fit, preferring nodes
    where they fit in the free resources too, then earlier nodes of ``nodes``.
    Raises :class:`ConfigurationError` naming the numbers when no such choice exists.
    """
    by_id = {node.node_id: node for node in nodes}
    taken = {entry: node_id for entry, node_id in (taken or {}).items() if node_id in by_id}
    if len(needs) > len(nodes):
        raise ConfigurationError(
            f"process_on_nodes has {len(needs)} entries but the cluster has {len(nodes)} alive "
            f"nodes: {describe_nodes(nodes)}. Each entry needs a node of its own: "
            f"{_join_hint()}, or use fewer nodes (fewer entries, more processes each)"
        )
    candidates: list[list[str]] = []
    for index, need in enumerate(needs):
        if index in taken:
            candidates.append([taken[index]])
            continue
        fitting = [n for n in nodes if n.fits(need)]
        if not fitting:
            raise ConfigurationError(
                f"process_on_nodes[{index}] needs {_amounts(need)} on one node, more than any "
                f"node has in total: {describe_nodes(nodes)}. Use fewer processes on that node, "
                f"a smaller cpus_per_worker / gpus_per_worker, or add larger nodes to the cluster"
            )
        fitting.sort(key=lambda n: not n.fits(need, free=True))  # stable: keeps node order
        candidates.append([n.node_id for n in fitting])
    owner = _match(candidates)
    if owner is None:
        raise ConfigurationError(
            f"process_on_nodes needs {len(needs)} distinct nodes "
            f"({', '.join(_amounts(need) for need in needs)}), but too few nodes are large "
            f"enough for them: {describe_nodes(nodes)}. Use fewer entries, smaller ones, or "
            f"{_join_hint()}"
        )
    chosen = {entry: node_id for node_id, entry in owner.items()}
    return [by_id[chosen[index]] for index in range(len(needs))]


def _match(candidates: list[list[str]]) -> dict[str, int] | None:
    """Node id -> entry, each entry on one of its candidates, or None (augmenting paths)."""
    owner: dict[str, int] = {}

    def place(entry: int, seen: set[str]) -> bool:
        for node_id in candidates[entry]:
            if node_id in seen:
                continue
            seen.add(node_id)
            if node_id not in owner or place(owner[node_id], seen):
                owner[node_id] = entry
                return True
        return False

    return owner if all(place(entry, set()) for entry in range(len(candidates))) else None


def _amounts(need: Mapping[str, float]) -> str:
    return ", ".join(f"{name} {amount:g}" for name, amount in sorted(need.items()))
