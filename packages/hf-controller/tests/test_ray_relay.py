"""Group calls through a relay tree: same results, same failure reports as the direct path.

One 8-rank group with ``relay_fanout=2`` (leaves of 2 ranks, three levels of relays) is
shared by the module; a failure is injected on a rank deep in the tree.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
from rows import Rows

from hf_controller import (
    ConfigurationError,
    Dispatch,
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    Worker,
    WorkerDiedError,
    WorkerGroupError,
    WorkerTimeoutError,
    register,
)
from hf_controller.ray.relay import (
    RELAY_FANOUT_ENV,
    TreeNode,
    pack_calls,
    plan_tree,
    resolve_relay_fanout,
)

WORLD = 8


def hang_in_rank(rank: int, me: int) -> int:
    if me == rank:
        time.sleep(10**6)  # alive, never answering
    return me


class StubbornError(RuntimeError):
    """Pickles, but cannot be unpickled: its ``__init__`` needs more than ``args`` holds."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class TreeWorker(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def whoami(self, tag: str) -> tuple[int, str, int]:
        return self.rank, tag, os.getpid()

    @register(Dispatch.DP_COMPUTE_PROTO)
    def double(self, rows: Rows) -> Rows:
        return Rows([2 * v for v in rows.values])

    @register(Dispatch.ALL_TO_ALL)
    def add(self, value: int, *, offset: int = 0) -> int:
        return value + offset + self.rank

    @register(Dispatch.ONE_TO_ALL)
    def fail_on(self, rank: int) -> int:
        if self.rank == rank:
            raise ValueError(f"bad input on rank {self.rank}")
        return self.rank

    @register(Dispatch.ONE_TO_ALL)
    def fail_stubbornly_on(self, rank: int) -> int:
        if self.rank == rank:
            raise StubbornError(f"push rejected on rank {self.rank}", 7)
        return self.rank

    @register(Dispatch.ONE_TO_ALL)
    def die_on(self, rank: int, others_wait_s: float) -> int:
        if self.rank == rank:
            print("about to exit", flush=True)
            os._exit(3)
        time.sleep(others_wait_s)  # the others look like they wait in a collective
        return self.rank

    @register(Dispatch.ONE_TO_ALL, timeout_s=3.0)
    def hang_on(self, rank: int) -> int:
        return hang_in_rank(rank, self.rank)

    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def later(self) -> int:
        return self.rank


def make_group(name: str) -> RayWorkerGroup:
    return RayWorkerGroup(
        RayResourcePool([WORLD], use_gpu=False, cpus_per_worker=0.05),
        RayClassWithInitArgs(TreeWorker),
        name_prefix=name,
        relay_fanout=2,
    )


@pytest.fixture(scope="module")
def tree(ray_session: Any) -> Iterator[RayWorkerGroup]:
    group = make_group("tree")
    yield group
    group.shutdown()


def test_plan_keeps_leaves_within_a_node_and_bounds_every_fanout() -> None:
    root = plan_tree([[0, 1, 2, 3, 4], [5, 6]], fanout=2)
    leaves: list[TreeNode] = []

    def walk(node: TreeNode) -> None:
        assert len(node.children) <= 2
        if node.is_leaf:
            leaves.append(node)
        for child in node.children:
            walk(child)

    walk(root)
    assert [leaf.ranks for leaf in leaves] == [(0, 1), (2, 3), (4,), (5, 6)]
    assert root.ranks == tuple(range(7))
    assert plan_tree([[0, 1, 2]], fanout=16) == TreeNode((0, 1, 2))  # one leaf, no root above
    wide = plan_tree([list(range(17 * 16))], fanout=16)  # 17 leaves: 2 children of 9 and 8
    assert [len(child.children) for child in wide.children] == [9, 8]


def test_fanout_values_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_relay_fanout(4) == 4
    monkeypatch.setenv(RELAY_FANOUT_ENV, "0")
    assert resolve_relay_fanout() == 0
    for bad in ("-1", "two", "1.5"):
        monkeypatch.setenv(RELAY_FANOUT_ENV, bad)
        with pytest.raises(ConfigurationError, match=RELAY_FANOUT_ENV):
            resolve_relay_fanout()


def test_pack_sends_shared_arguments_once_and_per_rank_data_as_refs(ray_session: Any) -> None:
    tag = object()
    shared, per_rank = pack_calls([((tag,), {"k": 1})] * 3)
    assert per_rank is None and shared == ((tag,), {"k": 1})
    shared, per_rank = pack_calls([((Rows([1]),), {}), ((Rows([2]),), {})])
    assert shared is None and per_rank is not None
    assert [ray_session.get(per_rank[r][0][0]).values for r in (0, 1)] == [[1], [2]]


def test_calls_go_through_the_tree_and_answer_in_rank_order(tree: RayWorkerGroup) -> None:
    assert tree._relays is not None and len(tree._relays.relays) == 7  # 4 leaves, 2 + 1 above
    answers = tree.whoami("x")
    assert [(rank, tag) for rank, tag, _ in answers] == [(r, "x") for r in range(WORLD)]
    assert len({pid for *_, pid in answers}) == WORLD
    assert tree.double(Rows(list(range(20)))).values == [2 * v for v in range(20)]
    assert tree.add(list(range(WORLD)), offset=[10] * WORLD) == [2 * r + 10 for r in range(WORLD)]
    assert tree.execute_all_sync("whoami", "y")[5][:2] == (5, "y")


def test_relays_start_with_the_group_so_no_call_deadline_counts_them(ray_session: Any) -> None:
    # A group's start-up waits for its relays too: the first call's deadline (3 s for
    # hang_on) was once spent on relay processes still starting on a loaded machine.
    group = make_group("prompt")
    try:
        assert group._relays is not None and group._relays._ready
    finally:
        group.shutdown()


def test_a_relay_dead_before_the_first_call_is_named(ray_session: Any) -> None:
    group = RayWorkerGroup(
        RayResourcePool([WORLD], use_gpu=False, cpus_per_worker=0.05),
        RayClassWithInitArgs(TreeWorker),
        name_prefix="norelay",
        relay_fanout=2,
        block_until_ready=False,
    )
    try:
        assert group._relays is not None
        ray_session.kill(group._relays.relays[0])
        with pytest.raises(WorkerDiedError) as info:
            group.whoami("x")
        assert (info.value.group, info.value.method) == ("norelay", "__init__")
        assert "relay of its call tree died" in info.value.cause
    finally:
        group.shutdown()


def test_an_exception_deep_in_the_tree_names_its_rank_and_traceback(tree: RayWorkerGroup) -> None:
    with pytest.raises(WorkerGroupError) as info:
        tree.fail_on(6)
    error = info.value
    assert (error.group, error.rank, error.method) == ("tree", 6, "fail_on")
    assert error.node == "127.0.0.1"
    assert "ValueError: bad input on rank 6" in str(error)
    assert "raise ValueError" in error.details
    assert isinstance(error.__cause__, ValueError)
    assert tree.fail_on(99) == list(range(WORLD))  # the group still works afterwards


def test_an_exception_deep_in_the_tree_that_cannot_be_unpickled_is_named(
    tree: RayWorkerGroup,
) -> None:
    with pytest.raises(WorkerGroupError) as info:
        tree.fail_stubbornly_on(5)
    error = info.value
    assert (error.group, error.rank, error.method) == ("tree", 5, "fail_stubbornly_on")
    assert "StubbornError: push rejected on rank 5" in error.cause
    assert "__reduce__" in error.cause
    assert "raise StubbornError" in error.details
    assert tree.fail_stubbornly_on(99) == list(range(WORLD))


def test_a_call_after_a_pending_non_blocking_one_goes_direct(tree: RayWorkerGroup) -> None:
    future = tree.later()  # still running or not: the next call keeps the order either way
    assert [rank for rank, *_ in tree.whoami("z")] == list(range(WORLD))
    assert tree.wait_results("later", future) == list(range(WORLD))


def test_a_stuck_rank_deep_in_the_tree_is_named_with_its_stack(ray_session: Any) -> None:
    group = make_group("stuck")  # its own group: the stuck rank never takes a call again
    try:
        start = time.monotonic()
        with pytest.raises(WorkerTimeoutError) as info:
            group.hang_on(5)  # @register(timeout_s=3.0)
        elapsed = time.monotonic() - start
        assert elapsed < 3.0 + 20, f"took {elapsed:.1f}s"
        assert (info.value.group, info.value.ranks, info.value.method) == ("stuck", [5], "hang_on")
        assert "hang_in_rank" in info.value.stacks[5]
    finally:
        group.shutdown()


def test_a_dead_rank_deep_in_the_tree_is_named_within_seconds(ray_session: Any) -> None:
    group = make_group("doomed")  # its own group: a rank dies for good
    try:
        start = time.monotonic()
        with pytest.raises(WorkerDiedError) as info:
            group.die_on(7, others_wait_s=120)  # the others would keep the call open 2 min
        elapsed = time.monotonic() - start
        assert elapsed < 15, f"took {elapsed:.1f}s"
        error = info.value
        assert (error.group, error.rank, error.method) == ("doomed", 7, "die_on")
        assert "died" in error.cause
        assert "about to exit" in error.details  # the last lines of its log
        assert "doomed rank 0: still in die_on(); current stack" in error.details
    finally:
        group.shutdown()
