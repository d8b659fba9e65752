"""Fault injection for the weight channel's tests: what a :class:`WeightFaults` makes a
channel member do wrong, on purpose.

Only tests set it (``WeightChannel.join(..., faults=WeightFaults(...))``); production code
never passes one, and a channel without it runs none of these branches. Each fault stands
for a failure that a real run meets: a process killed mid-push (OOM killer, preemption), a
bit flipped on the way, a bucket lost by a protocol bug.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from hf_rollout.weight_sync.wire import Bucket

__all__ = ["WeightFaults", "corrupted", "exit_now"]


@dataclass(frozen=True)
class WeightFaults:
    """Faults to inject into one channel member; every field ``None`` means none.

    Buckets are counted from 0 within a push, and only in the push numbered ``push``
    (the channel's pushes are counted from 1 since it was joined).
    """

    push: int = 1
    """The push (1 = the first after joining) the faults below apply to."""
    exit_after_buckets: int | None = None
    """Sender or receiver: the process exits (``os._exit``, no clean-up, like a kill) once
    it has issued (sender) or received (receiver) this many buckets of the push."""
    corrupt_bucket: int | None = None
    """Sender: one byte of this bucket is flipped after its checksum was taken."""
    drop_bucket: int | None = None
    """Sender: this bucket (head and bytes) is never broadcast."""
    late_s: float | None = None
    """Sender: it comes to the push this many seconds late (a trainer still busy with its
    update while the receivers already wait)."""

    def applies(self, push: int, bucket: int, fault: int | None) -> bool:
        """Whether ``fault`` (one of the bucket fields) hits ``bucket`` of ``push``."""
        return fault is not None and push == self.push and bucket == fault


def exit_now() -> None:
    """End this process at once, as a kill would (no ``finally``, no atexit)."""
    os._exit(17)


def corrupted(bucket: Bucket) -> Bucket:
    """``bucket`` with one byte flipped on the wire (:attr:`WeightFaults.corrupt_bucket`): in
    a copy, so the sender's own tensors stay intact."""
    if bucket.packed is not None and bucket.packed.numel():
        packed = bucket.packed.clone()
        packed[0] ^= 0xFF
        return Bucket(bucket.entries, packed, bucket.direct)
    direct = [t.clone() for t in bucket.direct]
    if direct:
        direct[0][0] ^= 0xFF
    return Bucket(bucket.entries, None, direct)
