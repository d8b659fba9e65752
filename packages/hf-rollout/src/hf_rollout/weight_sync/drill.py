"""Weight-push drills: a sender and receivers in spawned processes over real gloo, running a
plan of pushes, some with a fault injected (:class:`~hf_rollout.weight_sync.faults.
WeightFaults`), and reporting what each member saw.

Used by the fault tests (``packages/hf-rollout/tests/test_weight_channel_faults.py``) and by
the fault table (``tools/reliability/faults_weights.py``). Each receiver loads pushes into a
:class:`DictEngine` through a :class:`~hf_rollout.weight_sync.WeightReceiver`, as a rollout
worker does, so what it holds after a failed push can be compared with :func:`expected`.
"""

from __future__ import annotations

import functools
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.multiprocessing as mp

from hf_controller.worker import master_address
from hf_rollout.weight_sync.channel import WeightChannel
from hf_rollout.weight_sync.errors import WeightChannelError
from hf_rollout.weight_sync.faults import WeightFaults
from hf_rollout.weight_sync.receiver import WeightReceiver
from hf_rollout.weight_sync.sender import send

if TYPE_CHECKING:
    from hf_rollout.base import RolloutEngine

__all__ = ["DEADLINE_S", "DictEngine", "Outcome", "Plans", "expected", "run", "weights"]

Outcome = tuple[Any, ...]
"""Sender: ``(kind, message, seconds)``; receiver: those and ``(version, bytes by name)``;
``kind`` is ``"ok"`` or the error's class name."""
Plans = dict[int, tuple[list[WeightFaults | None], bool]]
"""Channel rank -> (faults of each push, ``idle``: joins, then never receives)."""

KIB = 1024
BUCKET = 4 * KIB
DEADLINE_S = 3.0
JOIN_S = 60.0  # spawned processes start seconds apart on a loaded machine
NAMES = ["a", "b", "c", "d", "e", "f"]
"""Buckets of 4 KiB: [a, b], [c], [d], [e] (bigger than a bucket), [f]."""


def weights(version: int) -> list[tuple[str, torch.Tensor]]:
    """The sender's weights at ``version`` (the same in every process): six tensors, five
    buckets of :data:`BUCKET` bytes."""
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
        """Copy each ``(name, tensor)`` into the held weights."""
        for name, tensor in stream:
            self.weights[name].copy_(tensor)

    def snapshot(self) -> dict[str, bytes]:
        """The held weights' bytes by name."""
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
        got.append(_outcome(functools.partial(_push, channel, version)))
    return got


def _push(channel: WeightChannel, version: int) -> None:
    send(channel, iter(weights(version)), BUCKET, version)


def _receiver(
    port: int, world: int, rank: int, plan: list[WeightFaults | None], idle: bool
) -> list[Any]:
    receiver = WeightReceiver("TestWorker")
    receiver.join("127.0.0.1", port, rank - 1, world, timeout_s=JOIN_S, deadline_s=DEADLINE_S)
    assert receiver.channel is not None
    receiver.channel.timeout_s = DEADLINE_S
    engine = DictEngine()
    as_engine = cast("RolloutEngine", engine)  # what update_weights needs of one
    got = []
    for faults in plan:
        if idle:  # joined, but never comes to receive
            time.sleep(2 * DEADLINE_S)
            break
        receiver.channel.faults = faults or WeightFaults(push=-1)
        outcome = _outcome(lambda: receiver.receive_into(lambda: as_engine))
        got.append((*outcome, receiver.version, engine.snapshot()))
    return got


def _member(rank: int, world: int, port: int, results: Any, plans: Plans) -> None:
    try:
        plan, idle = plans.get(rank, ([], False))
        got = _sender(port, world, plan) if rank == 0 else _receiver(port, world, rank, plan, idle)
        results.put((rank, got, None))
    except BaseException:
        results.put((rank, [], traceback.format_exc()))


def run(world: int, plans: Plans, killed: int | None = None) -> dict[int, list[Outcome]]:
    """Run channel ranks ``0..world-1`` in spawned processes with their plans; the rank
    ``killed`` (a fault ends its process) reports nothing. Returns rank -> outcome of each
    push. Raises ``AssertionError`` with the traceback of a rank that failed otherwise."""
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
