"""A push that fails, between real gloo processes: each fault injected by
``WeightFaults`` (the sender killed mid-push, a receiver killed mid-push, a bucket corrupted,
a bucket dropped, a rank that never comes) ends in seconds with a named error, and every
surviving receiver still holds exactly the last complete version."""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from hf_controller.worker import master_address
from hf_rollout.weight_sync import (
    WeightChannel,
    WeightChannelError,
    WeightFaults,
    WeightIntegrityError,
    WeightPushError,
    WeightReceiver,
)

pytestmark = pytest.mark.timeout(180)

KIB = 1024
BUCKET = 4 * KIB
DEADLINE_S = 3.0
JOIN_S = 60.0  # spawned processes start seconds apart on a loaded machine
NAMES = ["a", "b", "c", "d", "e", "f"]
"""Buckets of 4 KiB: [a, b], [c], [d], [e] (bigger than a bucket), [f]."""


def weights(version: int) -> list[tuple[str, torch.Tensor]]:
    """The sender's weights at ``version`` (the same in every process)."""
    gen = torch.Generator().manual_seed(version)
    tensors = [
        torch.randn(600, generator=gen),  # 2400 B
        torch.randn(24, 24, generator=gen).to(torch.bfloat16),  # 1152 B
        torch.randn(700, generator=gen),  # 2800 B
        torch.randint(-(2**40), 2**40, (300,), generator=gen),  # 2400 B
        torch.randn(1500, generator=gen),  # 6000 B
        torch.randn(10, generator=gen),
    ]
    return list(zip(NAMES, tensors, strict=True))


class DictEngine:
    """A rollout engine reduced to its weights: ``update_weights`` copies the stream."""

    def __init__(self) -> None:
        self.weights = {n: torch.zeros_like(t) for n, t in weights(0)}

    def update_weights(self, stream: Any) -> None:
        for name, tensor in stream:
            self.weights[name].copy_(tensor)

    def snapshot(self) -> dict[str, bytes]:
        return {n: _raw(t) for n, t in self.weights.items()}


def expected(version: int) -> dict[str, bytes]:
    """What a receiver holds after loading ``version`` (version 0: nothing loaded, zeros)."""
    if version == 0:
        return DictEngine().snapshot()
    return {n: _raw(t) for n, t in weights(version)}


def _raw(tensor: torch.Tensor) -> bytes:
    return tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _outcome(action: Callable[[], Any]) -> tuple[str, str, float]:
    """``("ok" | error class name, message, seconds)`` of ``action()``."""
    start = time.monotonic()
    try:
        action()
        return "ok", "", time.monotonic() - start
    except WeightChannelError as error:
        return type(error).__name__, str(error), time.monotonic() - start


# ------------------------------------------------------------------ the members


def _sender(port: int, world: int, plan: list[WeightFaults | None]) -> list[Any]:
    channel = WeightChannel.join(
        "127.0.0.1", port, 0, world, timeout_s=JOIN_S, deadline_s=DEADLINE_S
    )
    channel.timeout_s = DEADLINE_S  # the handshake's wait, once everyone has joined
    got = []
    for version, faults in enumerate(plan, start=1):
        channel.faults = faults or WeightFaults(push=-1)
        got.append(_outcome(lambda v=version: channel.send(iter(weights(v)), BUCKET, v)))
    return got


def _receiver(
    port: int, world: int, rank: int, plan: list[WeightFaults | None], idle: bool
) -> list[Any]:
    receiver = WeightReceiver("TestWorker")
    receiver.join("127.0.0.1", port, rank - 1, world, timeout_s=JOIN_S, deadline_s=DEADLINE_S)
    assert receiver.channel is not None
    receiver.channel.timeout_s = DEADLINE_S
    engine = DictEngine()
    got = []
    for faults in plan:
        if idle:  # joined, but never comes to receive
            time.sleep(2 * DEADLINE_S)
            break
        receiver.channel.faults = faults or WeightFaults(push=-1)
        outcome = _outcome(lambda: receiver.receive_into(lambda: engine))
        got.append((*outcome, receiver.version, engine.snapshot()))
    return got


def _member(rank: int, world: int, port: int, results: Any, plans: dict[int, Any]) -> None:
    try:
        plan, idle = plans.get(rank, ([], False))
        got = _sender(port, world, plan) if rank == 0 else _receiver(port, world, rank, plan, idle)
        results.put((rank, got, None))
    except BaseException:
        results.put((rank, [], traceback.format_exc()))


def run(world: int, plans: dict[int, Any], killed: int | None = None) -> dict[int, Any]:
    """Run the members with their plans (rank -> ``(faults per push, idle)``); the rank
    ``killed`` reports nothing. Returns rank -> outcomes."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    _, port = master_address()
    procs = [
        ctx.Process(target=_member, args=(rank, world, port, results, plans))
        for rank in range(world)
    ]
    for proc in procs:
        proc.start()
    out: dict[int, Any] = {}
    try:
        for _ in range(world - (killed is not None)):
            rank, payload, error = results.get(timeout=150)
            assert error is None, f"rank {rank} failed:\n{error}"
            out[rank] = payload
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    if killed is not None:
        assert procs[killed].exitcode == 17  # faults.exit_now
    return out


# ------------------------------------------------------------------ the tests


def test_a_corrupted_or_dropped_bucket_is_rejected_and_nothing_is_loaded() -> None:
    plan = [
        None,
        WeightFaults(push=2, corrupt_bucket=1),  # bucket [c]
        WeightFaults(push=3, drop_bucket=2),  # bucket [d]
        None,
    ]
    out = run(3, {0: (plan, False), 1: ([None] * 4, False), 2: ([None] * 4, False)})
    (ok1, _, _), corrupt, dropped, (ok4, _, _) = out[0]
    assert ok1 == ok4 == "ok"
    assert corrupt[0] == dropped[0] == WeightIntegrityError.__name__
    assert "version 2" in corrupt[1] and "checksum mismatch of c" in corrupt[1], corrupt[1]
    assert "rank 1" in corrupt[1] and "rank 2" in corrupt[1]
    assert "version 3" in dropped[1] and "tensors d lost" in dropped[1], dropped[1]
    for rank in (1, 2):
        first, bad, missing, last = out[rank]
        assert first[0] == "ok" and first[3] == 1 and first[4] == expected(1)
        assert bad[0] == WeightIntegrityError.__name__ and "checksum mismatch of c" in bad[1]
        assert "version 2" in bad[1] and bad[3] == 1 and bad[4] == expected(1)
        assert (
            missing[0] == WeightIntegrityError.__name__
            and "bucket(s) [2] never arrived" in missing[1]
        )
        assert "version 3" in missing[1] and missing[3] == 1 and missing[4] == expected(1)
        assert last[0] == "ok" and last[3] == 4 and last[4] == expected(4)  # channel still fine
        assert max(bad[2], missing[2]) < DEADLINE_S


def test_the_sender_killed_mid_push_leaves_the_receivers_on_the_last_version() -> None:
    plan = [None, WeightFaults(push=2, exit_after_buckets=2)]
    out = run(3, {0: (plan, False), 1: ([None] * 2, False), 2: ([None] * 2, False)}, killed=0)
    for rank in (1, 2):
        first, cut = out[rank]
        assert first[0] == "ok" and first[4] == expected(1)
        kind, message, seconds, version, held = cut
        assert kind == WeightPushError.__name__, message
        assert "version 2 cut off" in message and "keeps version 1" in message, message
        assert version == 1 and held == expected(1)  # exactly the last complete version
        assert seconds < DEADLINE_S + 2


def test_a_receiver_killed_mid_push_is_named_by_the_sender_within_the_deadline() -> None:
    plan = [None, None]
    dying = [None, WeightFaults(push=2, exit_after_buckets=1)]
    out = run(3, {0: (plan, False), 1: (plan, False), 2: (dying, False)}, killed=2)
    first, failed = out[0]
    assert first[0] == "ok"
    kind, message, seconds = failed
    assert kind == WeightPushError.__name__ and "version 2" in message, message
    assert "2]" in message.split("did not finish")[0], message  # rank 2 named
    assert seconds < DEADLINE_S + 2
    ok, cut = out[1]
    assert ok[0] == "ok" and ok[4] == expected(1)
    assert cut[0] == WeightPushError.__name__ and cut[3] == 1 and cut[4] == expected(1), cut[1]
    assert cut[2] < DEADLINE_S + 2


def test_a_rank_that_never_comes_to_receive_is_named_before_any_broadcast() -> None:
    out = run(3, {0: ([None], False), 1: ([None], False), 2: ([None], True)})
    kind, message, seconds = out[0][0]
    assert kind == WeightPushError.__name__, message
    assert "rank(s) [2] not ready" in message and "no tensor was sent" in message, message
    assert seconds < DEADLINE_S + 2
    kind, message, _, version, held = out[1][0]
    assert kind == WeightPushError.__name__ and "did not start" in message, message
    assert version == 0 and held == expected(0)
