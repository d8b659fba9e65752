"""The weight channel's errors: each names the channel, and a push's errors its version and
the ranks or tensors at fault."""

from __future__ import annotations

from typing import Any

__all__ = [
    "WeightChannelError",
    "WeightIntegrityError",
    "WeightPushError",
    "rejected",
    "who_stopped",
]


class WeightChannelError(RuntimeError):
    """A peer did not join, died, or broke the protocol; the message names the channel."""


class WeightPushError(WeightChannelError):
    """A push did not finish: a rank was not ready, died, or missed the push's deadline.

    The receivers still hold the last complete version (nothing of this push was loaded).
    """

    def __init__(self, message: str, version: int | None, ranks: list[int]) -> None:
        super().__init__(message)
        self.version = version
        """The version the push carried (``None``: not known to this rank)."""
        self.ranks = ranks
        """Channel ranks that did not finish the push (empty: not known to this rank)."""

    def __reduce__(self) -> tuple[type, tuple[str, int | None, list[int]]]:
        """Pickle with every argument (Ray sends a worker's exception to the driver)."""
        return type(self), (str(self), self.version, self.ranks)


class WeightIntegrityError(WeightChannelError):
    """A push arrived whole but not intact: a bucket's checksum did not match, or a bucket
    was missing. Nothing of it was loaded; the channel stays usable for the next push."""

    def __init__(self, message: str, version: int, names: list[str]) -> None:
        super().__init__(message)
        self.version = version
        """The version the push carried."""
        self.names = names
        """Tensors that arrived corrupted or not at all (as far as this rank knows them)."""

    def __reduce__(self) -> tuple[type, tuple[str, int, list[str]]]:
        """Pickle with every argument (Ray sends a worker's exception to the driver)."""
        return type(self), (str(self), self.version, self.names)


def rejected(
    where: str, version: int, reports: dict[int, dict[str, Any]], buckets: list[list[str]]
) -> WeightIntegrityError:
    """The sender's error for a push that receivers found corrupted or incomplete
    (``reports``: channel rank -> its ``done`` report); the tensors of missing buckets are
    named from ``buckets``, the names per bucket of this push. ``where`` names the channel."""
    names: list[str] = []
    lines = []
    for rank, problem in sorted(reports.items()):
        lost = [n for b in problem["buckets"] for n in buckets[b]]
        names += [n for n in [*problem["names"], *lost] if n not in names]
        detail = f": tensors {', '.join(lost)} lost" if lost else ""
        lines.append(f"rank {rank}: {problem['message']}{detail}")
    return WeightIntegrityError(
        f"{where}: push of version {version} rejected, nothing of it loaded "
        f"(the receivers keep their last complete version): {'; '.join(lines)}",
        version,
        names,
    )


def who_stopped(missing: list[int], stopped: list[int]) -> str:
    """Which receivers of a failed push are gone (no report) and which heard the abort."""
    parts = [f"rank(s) {missing} did not finish it (no report: dead or hung)"] if missing else []
    if stopped:
        parts.append(f"rank(s) {stopped} stopped with it" if missing else "every rank stopped")
    return ", ".join(parts)
