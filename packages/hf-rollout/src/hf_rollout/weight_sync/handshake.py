"""The control plane of one push, through the channel's ``TCPStore`` (no collective).

For push ``n`` (counted on every member since it joined) of a channel with receivers
``1..R``::

    receiver r: set ready/<n>/<r> = ready  it entered receive()
    sender:     set open/<n>                it is here, and decides within its timeout
                wait for every ready/<n>/*  (at most the channel's timeout), then claim
                each one: ready -> claimed  (an atomic compare-and-set), then
                set start/<n> = "go"        or "abort: <why>", and no collective follows
    ...         the buckets' broadcasts     (at most the push's deadline)
    receiver r: set done/<n>/<r>            "ok", or what was wrong (before loading)
    sender:     wait for every done/<n>/*   (the rest of the deadline)
    sender:     set abort/<n> = <why>       only when the broadcasts failed: the receivers
                                            still waiting stop and report instead of
                                            sitting out the deadline

so a missing rank is named, by the sender, within the timeout or the deadline instead of
surfacing as a collective's timeout, and only the ranks that are gone or hung are named:
a live receiver of a failed push hears the abort and reports. Every function here is a few
store round trips.

A receiver waits ``timeout_s`` for the sender's word. If by then the sender has opened the
push, its word is due within the sender's own timeout, and the receiver waits that long
again: a receiver that said ready *before* the sender came must not give up first, or the
sender would name a rank that was there all along. If the sender has not come, the
receiver withdraws: it swaps its ``ready`` for ``withdrawn`` with the same
compare-and-set the sender claims it with, so exactly one of the two wins, and a sender
that comes later names it instead of broadcasting to a rank that left.
"""

from __future__ import annotations

import contextlib
import datetime
import pickle
from typing import Any

import torch.distributed as dist

__all__ = [
    "announce_abort",
    "announce_start",
    "await_all",
    "await_ready",
    "await_start",
    "forget_push",
    "mark_ready",
    "read_abort",
    "read_reports",
    "report_done",
]

GO = b"go"
READY = b"ready"
CLAIMED = b"claimed"
WITHDRAWN = b"withdrawn"


def _key(kind: str, push: int, rank: int | None = None) -> str:
    return f"{kind}/{push}" if rank is None else f"{kind}/{push}/{rank}"


def mark_ready(store: Any, push: int, rank: int) -> None:
    """Receiver ``rank`` says it waits for push ``push``."""
    store.set(_key("ready", push, rank), READY)


def await_all(store: Any, kind: str, push: int, ranks: list[int], timeout_s: float) -> list[int]:
    """Wait until every ``<kind>/<push>/<rank>`` of ``ranks`` is set, at most ``timeout_s``;
    return the ranks still missing then (empty: all there).

    One ``wait`` on all the keys: it returns as soon as the last one is set (one round trip
    when all are there already); only when it times out are the keys checked one by one to
    name the missing ranks.
    """
    keys = [_key(kind, push, rank) for rank in ranks]
    try:
        store.wait(keys, _delta(timeout_s))
        return []
    except Exception:  # the store's timeout: name who is missing
        return [r for r, k in zip(ranks, keys, strict=True) if not store.check([k])]


def await_ready(store: Any, push: int, ranks: list[int], timeout_s: float) -> list[int]:
    """Sender: open push ``push``, wait until every receiver of ``ranks`` is ready for it (at
    most ``timeout_s``), then claim each ready one; return the ranks not claimed (never
    came, or withdrew before the sender came), empty when all are.

    A claimed rank waits for :func:`announce_start`, which must follow."""
    store.set(_key("open", push), b"1")
    await_all(store, "ready", push, ranks, timeout_s)
    # compare_set of a missing key returns the expected value: only a swap reads CLAIMED
    claims = {r: store.compare_set(_key("ready", push, r), READY, CLAIMED) for r in ranks}
    return [r for r, value in claims.items() if value != CLAIMED]


def announce_start(store: Any, push: int, abort: str | None = None) -> None:
    """Sender: push ``push`` starts now (or is abandoned, saying why)."""
    store.set(_key("start", push), GO if abort is None else f"abort: {abort}".encode())


def await_start(store: Any, push: int, rank: int, timeout_s: float) -> str | None:
    """Receiver ``rank``: wait for the sender's word on push ``push``; ``None`` when it
    starts, else why not: its abort message, or that it did not come.

    The wait is ``timeout_s``, and ``timeout_s`` more once the sender has opened the push
    (its word is due within its own timeout). A rank that still has no word withdraws its
    ``ready`` (atomically against the sender's claim; see the module's docstring); a rank
    the sender claimed first waits for the word that follows the claim."""
    key = _key("start", push)
    if not _wait(store, key, timeout_s):
        opened = store.check([_key("open", push)])
        if not (opened and _wait(store, key, timeout_s)):
            if store.compare_set(_key("ready", push, rank), READY, WITHDRAWN) != CLAIMED:
                waited = 2 * timeout_s if opened else timeout_s
                return f"the sender did not start it within {waited:.1f} s"
            store.wait([key], _delta(timeout_s))  # claimed: the sender's word follows
    value = bytes(store.get(key))
    return None if value == GO else value.decode(errors="replace")


def announce_abort(store: Any, push: int, why: str) -> None:
    """Sender: push ``push`` failed mid-way (``why``); receivers still inside it stop.
    Best effort: the receivers' deadline still ends the push if this cannot be said."""
    with contextlib.suppress(Exception):
        store.set(_key("abort", push), why.encode())


def read_abort(store: Any, push: int) -> str | None:
    """Receiver: why the sender abandoned push ``push`` mid-way, or ``None`` while it has
    not; a store that is gone (the sender's process died) raises."""
    key = _key("abort", push)
    return bytes(store.get(key)).decode(errors="replace") if store.check([key]) else None


def _wait(store: Any, key: str, timeout_s: float) -> bool:
    """Whether ``key`` is set within ``timeout_s``; a store that is gone (its host died)
    raises its ``DistNetworkError`` here instead of counting as a timeout."""
    try:
        store.wait([key], _delta(timeout_s))
        return True
    except dist.DistStoreError:  # the store's wait timed out
        return False


def report_done(store: Any, push: int, rank: int, problem: dict[str, Any] | None) -> None:
    """Receiver ``rank`` is through push ``push``: ``problem`` ``None`` if it verified every
    bucket, else what was wrong (``{"message", "names", "buckets"}``). Best effort: a
    receiver whose store is gone has nothing to report to."""
    with contextlib.suppress(Exception):
        store.set(_key("done", push, rank), pickle.dumps(problem))


def read_reports(store: Any, push: int, ranks: list[int]) -> dict[int, dict[str, Any]]:
    """The problems reported by ``ranks`` (all of which reported) for push ``push``."""
    reports = {}
    for rank in ranks:
        problem = pickle.loads(bytes(store.get(_key("done", push, rank))))
        if problem is not None:
            reports[rank] = problem
    return reports


def forget_push(store: Any, push: int, ranks: list[int]) -> None:
    """Delete push ``push``'s keys (every receiver has read them), best effort."""
    keys = [_key("start", push), _key("open", push), _key("abort", push)]
    keys += [_key(kind, push, rank) for kind in ("ready", "done") for rank in ranks]
    for key in keys:
        try:
            store.delete_key(key)
        except Exception:
            return


def _delta(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=max(seconds, 0.001))
