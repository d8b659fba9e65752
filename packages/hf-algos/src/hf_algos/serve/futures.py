"""Tinker futures: every queued call gets a request id; clients poll ``retrieve_future``.

A result is kept until a client has read it and ``ttl_s`` has passed since it finished
(or ``ttl_s`` after it finished if never read); then it is dropped and the id is unknown
(404). Polls wait up to ``poll_wait_s`` for the result before answering ``try_again``
(the SDK polls again at once, so a short wait would spin).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from hf_algos.serve.errors import NotFoundError, ServeError

PROTOBUF = "application/x-protobuf"


@dataclass
class Reply:
    """A finished call's answer: JSON (a dict) or protobuf bytes."""

    body: dict[str, Any] | bytes

    @property
    def media_type(self) -> str:
        """``application/json`` or ``application/x-protobuf``."""
        return PROTOBUF if isinstance(self.body, bytes) else "application/json"


@dataclass
class _Entry:
    done: asyncio.Event
    reply: Reply | None = None
    error: BaseException | None = None
    finished_at: float | None = None
    created_at: float = field(default_factory=time.monotonic)


class FutureStore:
    """Request ids -> results of calls running on worker threads (one event loop)."""

    def __init__(self, ttl_s: float, poll_wait_s: float) -> None:
        self.ttl_s = ttl_s
        self.poll_wait_s = poll_wait_s
        self._entries: dict[str, _Entry] = {}
        self._ids = itertools.count(1)

    def track(self, future: Future[Reply], loop: asyncio.AbstractEventLoop) -> str:
        """A new request id for ``future`` (a call queued on a worker thread)."""
        request_id = f"req-{next(self._ids)}"
        entry = _Entry(done=asyncio.Event())
        self._entries[request_id] = entry

        def finished(result: Future[Reply]) -> None:
            loop.call_soon_threadsafe(self._finish, entry, result)

        future.add_done_callback(finished)
        return request_id

    @staticmethod
    def _finish(entry: _Entry, result: Future[Reply]) -> None:
        error = result.exception()
        if error is None:
            entry.reply = result.result()
        else:
            entry.error = error
        entry.finished_at = time.monotonic()
        entry.done.set()

    async def retrieve(self, request_id: str) -> Reply | None:
        """The reply of ``request_id`` once done (``None``: still running after the poll
        wait); raises the call's error, or :class:`NotFoundError` for an unknown or expired id."""
        self.expire()
        entry = self._entries.get(request_id)
        if entry is None:
            raise NotFoundError(
                f"no future {request_id!r}: it never existed or expired ({self.ttl_s:.0f} s "
                "after it finished; serve.future_ttl_s)"
            )
        try:
            await asyncio.wait_for(entry.done.wait(), self.poll_wait_s)
        except TimeoutError:
            return None
        if entry.error is not None:
            raise entry.error
        assert entry.reply is not None
        return entry.reply

    def expire(self) -> int:
        """Drop the results finished more than ``ttl_s`` ago; how many were dropped."""
        now = time.monotonic()
        old = [
            key
            for key, entry in self._entries.items()
            if entry.finished_at is not None and now - entry.finished_at > self.ttl_s
        ]
        for key in old:
            del self._entries[key]
        return len(old)

    def __len__(self) -> int:
        return len(self._entries)


def failure(error: BaseException) -> dict[str, str]:
    """Tinker's ``RequestFailedResponse`` for a call that raised ``error``."""
    category = error.category if isinstance(error, ServeError) else "server"
    return {"error": f"{type(error).__name__}: {error}", "category": category}
