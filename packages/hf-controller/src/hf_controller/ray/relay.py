"""Relays: a tree of small actors that fans a group call out and gathers its answers.

Called directly, a group call costs the driver one ``.remote()``, one object ref and one
result per rank: O(N) driver time per call, which at hundreds of ranks is what a single
controller is blamed for. Through a relay tree the driver makes *one* call, to the root
relay; each relay forwards it to at most ``fanout`` children (workers, or relays below it)
and gathers their answers, so the driver's cost per call stays flat as the group grows and
the fan-out work is spread over the relays' processes (one tree per group, leaves kept
within one node, next to their workers).

Failure reporting is kept: every rank's answer comes back as an outcome ``(kind, value)``:

* ``"ok"``: the result;
* ``"error"``: the method raised (the original exception where it can travel, and Ray's
  text with the worker's traceback);
* ``"died"``: the worker process ended (Ray's text);
* ``"pending"``: no answer yet when the relay stopped waiting;
* ``"ref"``: the object ref of the rank's result, when the call asked for refs
  (``fetch=False``: results that are data, fetched once by the driver itself).

A relay stops waiting for its other children :data:`PEER_GRACE_S` after one failed (a
peer in a collective with the failed rank usually fails within that), so a failure deep
in the tree reaches the driver in about the same seconds as on the direct path. A call
past its deadline is explained with :meth:`Relay.pending`, which names the ranks still
running it, down the tree, while the call itself is still running.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hf_controller.errors import ConfigurationError

RELAY_FANOUT_ENV = "HF_CONTROLLER_RELAY_FANOUT"
"""Largest number of ranks a group calls directly; a larger group is called through relays
that each reach at most this many (``0``: never use relays)."""
DEFAULT_FANOUT = 16
POLL_S = 0.5
"""How long a relay waits for all its children at once before it looks at each."""
PEER_GRACE_S = 1.0
"""After a rank failed: how long a relay still waits for its other children."""

Outcome = tuple[str, Any]
FAILED = ("error", "died")
"""The outcome kinds of a rank whose call failed."""
CallArgs = tuple[tuple[Any, ...], dict[str, Any]]


def resolve_relay_fanout(fanout: int | None = None) -> int:
    """``fanout``, else :data:`RELAY_FANOUT_ENV`, else :data:`DEFAULT_FANOUT`; refused
    (naming the value) unless a whole number >= 0."""
    source = "relay_fanout"
    value: Any = fanout
    if value is None:
        value = os.environ.get(RELAY_FANOUT_ENV, "").strip() or DEFAULT_FANOUT
        source = RELAY_FANOUT_ENV
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = -1
    if number < 0 or str(number) != str(value).strip():
        raise ConfigurationError(
            f"{source} must be a whole number >= 0 (0: never call through relays), got {value!r}"
        )
    return number


@dataclass(frozen=True)
class TreeNode:
    """One relay of a tree plan: the ranks it answers for and its children (relays, or
    ranks when it is a leaf)."""

    ranks: tuple[int, ...]
    children: tuple[TreeNode, ...] = ()

    @property
    def is_leaf(self) -> bool:
        """True when this relay calls workers itself."""
        return not self.children


def plan_tree(nodes: Sequence[Sequence[int]], fanout: int) -> TreeNode:
    """A relay tree over ``nodes`` (each a list of ranks sharing one machine).

    Leaves hold at most ``fanout`` ranks and never span two machines; inner relays have at
    most ``max(fanout, 2)`` children, so the depth grows with the log of the rank count.
    """
    if fanout < 1:
        raise ValueError(f"a relay tree needs fanout >= 1, got {fanout}")
    level = [
        TreeNode(tuple(ranks[start : start + fanout]))
        for ranks in nodes
        for start in range(0, len(ranks), fanout)
    ]
    width = max(fanout, 2)
    while len(level) > 1:
        groups = math.ceil(len(level) / width)
        size = math.ceil(len(level) / groups)  # balanced: 17 children on 16 -> 9 + 8
        level = [
            TreeNode(
                tuple(r for child in level[i : i + size] for r in child.ranks),
                tuple(level[i : i + size]),
            )
            for i in range(0, len(level), size)
        ]
    return level[0]


class Relay:
    """A Ray actor that forwards group calls to its children and gathers their answers.

    A leaf's children are worker actor handles (``ranks`` lists whose they are); an inner
    relay's children are relays (``ranks`` lists the ranks below each). ``hosted``: the
    workers live in :class:`~hf_controller.ray.host.WorkerHost` processes and are called
    through ``_hf_call``. It runs calls in threads (``max_concurrency``), so
    :meth:`pending` answers while a call waits.
    """

    def __init__(
        self, children: list[Any], ranks: list[tuple[int, ...]], leaf: bool, hosted: bool
    ) -> None:
        self._children = children
        self._ranks = ranks
        self._leaf = leaf
        self._hosted = hosted
        self._calls: dict[str, list[Any]] = {}  # call id -> the children's object refs

    def ready(self) -> bool:
        """Answers once the relay's process is up."""
        return True

    def call(
        self,
        call_id: str,
        method: str,
        shared: CallArgs | None,
        per_rank: dict[int, CallArgs] | None,
        fetch: bool,
    ) -> dict[int, Outcome]:
        """Run ``method`` on every rank below this relay; an outcome per rank.

        ``shared`` are the arguments of every rank, else ``per_rank`` maps rank to its own.
        ``fetch=False`` answers each rank's object ref at once instead of its result.
        """
        refs = [
            self._submit(i, call_id, method, shared, per_rank, fetch)
            for i in range(len(self._children))
        ]
        if self._leaf and not fetch:  # the refs themselves are the answers
            return {self._ranks[i][0]: ("ref", ref) for i, ref in enumerate(refs)}
        self._calls[call_id] = refs
        try:
            return self._gather(refs)
        finally:
            self._calls.pop(call_id, None)

    def pending(self, call_id: str) -> list[int]:
        """The ranks below this relay still running call ``call_id`` (none once done)."""
        import ray

        refs = self._calls.get(call_id, [])
        if not refs:
            return []
        _, waiting = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
        stuck: list[int] = []
        for index, ref in enumerate(refs):
            if ref not in waiting:
                continue
            if self._leaf:
                stuck.extend(self._ranks[index])
            else:
                with contextlib.suppress(Exception):  # a dead relay: its ranks are unknown
                    stuck.extend(ray.get(self._children[index].pending.remote(call_id)))
        return sorted(stuck)

    # ------------------------------------------------------------------ internals

    def _submit(
        self,
        index: int,
        call_id: str,
        method: str,
        shared: CallArgs | None,
        per_rank: dict[int, CallArgs] | None,
        fetch: bool,
    ) -> Any:
        """Start the call on child ``index``; its object ref."""
        child = self._children[index]
        if not self._leaf:
            below = None if per_rank is None else {r: per_rank[r] for r in self._ranks[index]}
            return child.call.remote(call_id, method, shared, below, fetch)
        args, kwargs = shared if shared is not None else per_rank[self._ranks[index][0]]  # type: ignore[index]
        if self._hosted:
            return child._hf_call.options(name=method).remote(method, *args, **kwargs)
        return getattr(child, method).remote(*args, **kwargs)

    def _gather(self, refs: list[Any]) -> dict[int, Outcome]:
        """Every child's outcomes: one ``ray.get`` when all answer in time; else polled,
        and once one failed the others get :data:`PEER_GRACE_S` before their ranks are
        answered ``"pending"``."""
        import time

        import ray

        try:
            values = ray.get(refs, timeout=POLL_S)
            return self._merge({i: self._ok(i, v) for i, v in enumerate(values)})
        except (ray.exceptions.GetTimeoutError, ray.exceptions.RayError):
            pass  # some child is slow or failed: find out which below
        answers: dict[int, dict[int, Outcome]] = {}
        waiting = dict(zip(refs, range(len(refs)), strict=True))
        grace_end: float | None = None
        while waiting:
            wait_s = POLL_S if grace_end is None else max(0.0, grace_end - time.monotonic())
            ready, _ = ray.wait(list(waiting), num_returns=len(waiting), timeout=wait_s)
            for ref in ready:
                index = waiting.pop(ref)
                answers[index] = self._answer(index, ref)
                failed = any(kind in FAILED for kind, _ in answers[index].values())
                if failed and grace_end is None:
                    grace_end = time.monotonic() + PEER_GRACE_S
            if grace_end is not None and time.monotonic() >= grace_end:
                break
        for index in waiting.values():
            answers[index] = dict.fromkeys(self._ranks[index], ("pending", None))
        return self._merge(answers)

    def _ok(self, index: int, value: Any) -> dict[int, Outcome]:
        """Child ``index``'s outcomes from the value it answered."""
        return {self._ranks[index][0]: ("ok", value)} if self._leaf else dict(value)

    def _answer(self, index: int, ref: Any) -> dict[int, Outcome]:
        """Child ``index``'s outcomes from its finished ``ref``; never raises."""
        import ray

        ranks = self._ranks[index]
        try:
            return self._ok(index, ray.get(ref))
        except ray.exceptions.RayTaskError as error:
            return {ranks[0]: ("error", (_travelling(error.cause), str(error)))}
        except ray.exceptions.UnserializableException as error:  # its text travels
            from hf_controller.ray.failures import unpicklable_cause

            return {ranks[0]: ("error", (None, f"{unpicklable_cause(error)}\n{error}"))}
        except ray.exceptions.RayActorError as error:
            if self._leaf:
                return {ranks[0]: ("died", str(error))}
            text = f"the relay for ranks {list(ranks)} died: {error}"
            return dict.fromkeys(ranks, ("died", text))

    @staticmethod
    def _merge(answers: dict[int, dict[int, Outcome]]) -> dict[int, Outcome]:
        """The children's outcomes as one map, rank to outcome."""
        return {
            rank: outcome for index in sorted(answers) for rank, outcome in answers[index].items()
        }


def _travelling(cause: Any) -> BaseException | None:
    """``cause`` when it can be sent back to the driver (pickled and unpickled), else
    ``None``."""
    from ray import cloudpickle

    if not isinstance(cause, BaseException):
        return None
    try:
        cloudpickle.loads(cloudpickle.dumps(cause))
    except Exception:  # an exception that cannot travel: its text still does
        return None
    return cause


# ---------------------------------------------------------------------- the driver's side


class RelayTree:
    """The driver's handle on one group's relay tree: starts it, runs calls through it and
    turns its outcomes into results or into the errors the direct path raises."""

    def __init__(
        self, root: Any, relays: list[Any], world_size: int, spans: list[tuple[int, ...]]
    ) -> None:
        self.root = root
        self.relays = relays  # every relay actor, leaves first (what the group's end kills)
        self.world_size = world_size
        self.spans = spans  # the ranks each relay answers for, as ``relays``
        self._ready = False

    @classmethod
    def start(
        cls,
        workers: list[Any],
        nodes: Sequence[Sequence[int]],
        fanout: int,
        hosted: bool,
        placement: Sequence[Any | None],
    ) -> RelayTree:
        """Start the relays over ``workers`` (``nodes``: the ranks of each machine;
        ``placement[rank]``: a scheduling strategy that puts an actor on rank's machine,
        or ``None``). Returns at once; the relays' processes start in the background."""
        import ray

        actor = ray.remote(Relay)
        relays: list[Any] = []
        spans: list[tuple[int, ...]] = []

        def build(node: TreeNode) -> Any:
            below: list[tuple[int, ...]]
            if node.is_leaf:
                children = [workers[r] for r in node.ranks]
                below = [(r,) for r in node.ranks]
            else:
                children = [build(child) for child in node.children]
                below = [child.ranks for child in node.children]
            options: dict[str, Any] = {"num_cpus": 0, "max_restarts": 0, "max_concurrency": 8}
            where = placement[node.ranks[0]]
            if where is not None:
                options["scheduling_strategy"] = where
            relay = actor.options(**options).remote(children, below, node.is_leaf, hosted)
            relays.append(relay)
            spans.append(node.ranks)
            return relay

        root = build(plan_tree(nodes, fanout))
        return cls(root, relays, len(workers), spans)

    def wait_ready(self, group: str, timeout_s: float | None) -> None:
        """Wait until every relay's process is up (once): part of the group's start-up,
        so it has the start-up's deadline (``None``: none), never a call's.

        A relay that died raises :class:`WorkerDiedError`, one still starting past
        ``timeout_s`` :class:`WorkerGroupError`; both name the group and the relay's ranks.
        """
        import ray

        from hf_controller.errors import WorkerDiedError, WorkerGroupError

        if self._ready:
            return
        refs = [relay.ready.remote() for relay in self.relays]
        try:
            ray.get(refs, timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            _, waiting = ray.wait(refs, num_returns=len(refs), timeout=0)
            spans = [list(self.spans[refs.index(ref)]) for ref in waiting]
            if not spans:  # every relay came up just after the deadline
                self._ready = True
                return
            cause = (
                f"the relays of its call tree for ranks {spans} did not start within "
                f"{timeout_s:g}s (each is a Ray actor process asking for no CPU); give the "
                f"group's start-up more time (wait_ready(timeout_s=...)) or call directly "
                f"(relay_fanout=0)"
            )
            raise WorkerGroupError(group, spans[0][0], "__init__", "unknown", cause) from None
        except ray.exceptions.RayActorError as error:
            cause = "a relay of its call tree died while starting (its machine, or a kill)"
            raise WorkerDiedError(group, 0, "__init__", "unknown", cause, str(error)) from None
        self._ready = True

    def run(
        self,
        group: str,
        method: str,
        remote_name: str,
        calls: list[CallArgs],
        workers: dict[int, dict[str, Any]],
        timeout_s: float | None,
        fetch: bool,
    ) -> list[Any]:
        """Run ``remote_name`` on every rank through the tree; results in rank order.

        Failures raise what the direct path raises: :class:`WorkerGroupError` naming the
        failed rank, :class:`WorkerDiedError` with what became of the other ranks, and
        :class:`WorkerTimeoutError` naming the unanswered ranks with their stacks.
        ``fetch=False``: the ranks' object refs come back and are fetched here.
        """
        import time
        import uuid

        from hf_controller.ray.failures import wait_for_results

        start = time.monotonic()
        call_id = uuid.uuid4().hex
        shared, per_rank = pack_calls(calls)
        ref = self.root.call.remote(call_id, remote_name, shared, per_rank, fetch)
        outcomes = self._outcomes(group, method, ref, call_id, workers, timeout_s)
        failed = sorted(rank for rank, (kind, _) in outcomes.items() if kind in FAILED)
        if failed:
            raise call_failure(group, method, failed[0], outcomes, workers)
        values = [outcomes[rank][1] for rank in range(self.world_size)]
        if fetch:
            return values
        left = None if timeout_s is None else max(0.0, timeout_s - (time.monotonic() - start))
        return wait_for_results(group, method, values, list(range(self.world_size)), workers, left)

    def _outcomes(
        self,
        group: str,
        method: str,
        ref: Any,
        call_id: str,
        workers: dict[int, dict[str, Any]],
        timeout_s: float | None,
    ) -> dict[int, Outcome]:
        """The root's answer; past ``timeout_s`` a :class:`WorkerTimeoutError` naming the
        ranks the tree says are still running the call."""
        import ray

        from hf_controller.errors import WorkerGroupError, WorkerTimeoutError
        from hf_controller.ray.failures import STACK_WAIT_S, collect_stacks

        try:
            outcomes: dict[int, Outcome] = ray.get(ref, timeout=timeout_s)
            return outcomes
        except ray.exceptions.GetTimeoutError:
            pass
        except ray.exceptions.RayActorError as error:
            node = str(workers.get(0, {}).get("node_ip", "unknown"))
            cause = "the group's root relay died during the call (its machine, or a kill)"
            raise WorkerGroupError(group, 0, method, node, cause, str(error)) from None
        assert timeout_s is not None
        try:
            stuck = ray.get(self.root.pending.remote(call_id), timeout=STACK_WAIT_S)
        except Exception:  # the tree cannot say: every rank may be the one
            stuck = list(range(self.world_size))
        if not stuck:  # it finished in the meantime
            outcomes = ray.get(ref, timeout=STACK_WAIT_S)
            return outcomes
        nodes = {r: str(workers.get(r, {}).get("node_ip", "unknown")) for r in stuck}
        stacks = collect_stacks({r: workers.get(r, {}) for r in stuck})
        raise WorkerTimeoutError(group, stuck, method, nodes, timeout_s, stacks)


def pack_calls(calls: list[CallArgs]) -> tuple[CallArgs | None, dict[int, CallArgs] | None]:
    """``(shared, None)`` when every rank shares one call tuple (a broadcast, as
    :func:`~hf_controller.worker_group._calls_for` builds it: sent once), else
    ``(None, per_rank)``. Per-rank data (objects offering ``chunk``: DataProto shards) is
    put into the object store here, so relays pass refs on and never copy the bytes."""
    import ray

    from hf_controller.futures import is_future
    from hf_controller.sharding import is_shardable
    from hf_controller.worker_group import all_same

    if all_same(calls):  # a broadcast: its ranks share one call tuple (_calls_for)
        return calls[0], None

    def out_of_band(value: Any) -> Any:
        return ray.put(value) if is_shardable(value) and not is_future(value) else value

    per_rank = {
        rank: (tuple(map(out_of_band, args)), {k: out_of_band(v) for k, v in kwargs.items()})
        for rank, (args, kwargs) in enumerate(calls)
    }
    return None, per_rank


def call_failure(
    group: str,
    method: str,
    rank: int,
    outcomes: dict[int, Outcome],
    workers: dict[int, dict[str, Any]],
) -> Exception:
    """The error of a call whose ``rank`` failed, as the direct path words it: an exception
    names the rank with the worker's traceback; a dead process also says what became of
    the other ranks (their errors, or the stacks of those still running)."""
    from hf_controller.errors import WorkerDiedError, WorkerGroupError
    from hf_controller.ray.failures import collect_stacks, death_cause, tail_worker_logs

    kind, value = outcomes[rank]
    info = workers.get(rank, {})
    node = str(info.get("node_ip", "unknown"))
    if kind == "error":
        original, text = value
        error = WorkerGroupError(group, rank, method, node, _error_line(value), text)
        error.__cause__ = original
        return error
    logs = tail_worker_logs(info.get("pid"))
    details = f"{value}\n--- last lines of the worker's log ---\n{logs}" if logs else str(value)
    lines = []
    stuck = sorted(r for r, (k, _) in outcomes.items() if k == "pending")
    for other, (other_kind, other_value) in sorted(outcomes.items()):
        if other == rank or other_kind == "pending":
            continue
        if other_kind in ("ok", "ref"):
            lines.append(f"{group} rank {other}: finished the call")
        else:
            text = _error_line(other_value) if other_kind == "error" else death_cause(other_value)
            lines.append(f"{group} rank {other} failed too: {text}")
    if stuck:
        stacks = collect_stacks({r: workers.get(r, {}) for r in stuck}, PEER_GRACE_S * 3)
        lines += [
            f"{group} rank {r}: still in {method}(); current stack:\n{stacks[r]}" for r in stuck
        ]
    others = "\n--- the other ranks ---\n" + "\n".join(lines) if lines else ""
    return WorkerDiedError(group, rank, method, node, death_cause(str(value)), details + others)


def _error_line(value: tuple[BaseException | None, str]) -> str:
    """One line saying what a rank raised: ``Type: message`` of the original exception,
    else the first line of Ray's text."""
    original, text = value
    line = f"{type(original).__name__}: {original}" if original is not None else text
    return (line.strip().splitlines() or [text.strip()])[0]
