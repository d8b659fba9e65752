"""The control plane of one push, through the channel's ``TCPStore`` (no collective).

For push ``n`` (counted on every member since it joined) of a channel with receivers
``1..R``::

    receiver r: set ready/<n>/<r>          it entered receive()
    sender:     wait for every ready/<n>/*  (at most the channel's timeout), then
                set start/<n> = "go"        or "abort: <why>", and no collective follows
    ...         the buckets' broadcasts     (at most the push's deadline)
    receiver r: set done/<n>/<r>            "ok", or what was wrong (before loading)
    sender:     wait for every done/<n>/*   (the rest of the deadline)

so a missing rank is named, by the sender, within the timeout or the deadline instead of
surfacing as a collective's timeout. Every function here is a few store round trips.
"""

from __future__ import annotations

import contextlib
import datetime
import pickle
from typing import Any

__all__ = [
    "announce_start",
    "await_all",
    "await_start",
    "forget_push",
    "mark_ready",
    "read_reports",
    "report_done",
]

GO = b"go"


def _key(kind: str, push: int, rank: int | None = None) -> str:
    return f"{kind}/{push}" if rank is None else f"{kind}/{push}/{rank}"


def mark_ready(store: Any, push: int, rank: int) -> None:
    """Receiver ``rank`` says it waits for push ``push``."""
    store.set(_key("ready", push, rank), b"1")


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


def announce_start(store: Any, push: int, abort: str | None = None) -> None:
    """Sender: push ``push`` starts now (or is abandoned, saying why)."""
    store.set(_key("start", push), GO if abort is None else f"abort: {abort}".encode())


def await_start(store: Any, push: int, rank: int, timeout_s: float) -> str | None:
    """Receiver ``rank``: wait for the sender's word on push ``push``; ``None`` when it
    starts, else why not (its abort message, or that it did not come within ``timeout_s``:
    then the rank takes back its ``ready``, so a sender that comes later names it instead of
    broadcasting to a rank that left)."""
    key = _key("start", push)
    try:
        store.wait([key], _delta(timeout_s))
    except Exception:
        started = False
        with contextlib.suppress(Exception):
            store.delete_key(_key("ready", push, rank))
            started = store.check([key])
        if not started:
            return f"the sender did not start it within {timeout_s:.1f} s"
    value = bytes(store.get(key))
    return None if value == GO else value.decode(errors="replace")


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
    keys = [_key("start", push)]
    keys += [_key(kind, push, rank) for kind in ("ready", "done") for rank in ranks]
    for key in keys:
        try:
            store.delete_key(key)
        except Exception:
            return


def _delta(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=max(seconds, 0.001))
