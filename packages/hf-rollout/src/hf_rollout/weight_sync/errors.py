"""The weight channel's errors: each names the channel, and a push's errors its version and
the ranks or tensors at fault."""

from __future__ import annotations

__all__ = ["WeightChannelError", "WeightIntegrityError", "WeightPushError"]


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
