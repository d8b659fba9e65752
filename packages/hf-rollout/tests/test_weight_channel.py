"""WeightChannel between real processes over gloo: exact bytes, buckets, order, timeouts."""

from __future__ import annotations

import time
import traceback
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from hf_controller.worker import master_address
from hf_rollout.testing import run_ranks
from hf_rollout.weight_sync.channel import WeightChannel
from hf_rollout.weight_sync.errors import WeightChannelError
from hf_rollout.weight_sync.receiver import receive
from hf_rollout.weight_sync.sender import send

pytestmark = pytest.mark.timeout(120)

KIB = 1024


def named_tensors(case: str) -> list[tuple[str, torch.Tensor]]:
    """The tensors a test case sends (built the same way in every process)."""
    gen = torch.Generator().manual_seed(0)
    if case == "empty":
        return []
    mixed = [
        ("embed.weight", torch.randn(64, 16, generator=gen)),  # 4 KiB: fills a bucket
        ("norm.weight", torch.randn(16, generator=gen).to(torch.bfloat16)),
        ("positions", torch.randint(-(2**40), 2**40, (7,), generator=gen)),  # int64
        ("scalar", torch.tensor(3.5)),  # 0-dim
        ("layer.0.weight", torch.randn(3, 5, generator=gen).to(torch.bfloat16)),
        ("huge", torch.randn(4096, generator=gen)),  # 16 KiB, bigger than a bucket
        ("zero_sized", torch.empty(0, 4)),
        ("transposed", torch.randn(6, 4, generator=gen).t()),  # not contiguous
        ("flags", torch.tensor([True, False, True])),
    ]
    return mixed


def _member(rank: int, world: int, port: int, results: Any, case: str) -> None:
    try:
        channel = WeightChannel.join("127.0.0.1", port, rank, world, timeout_s=30)
        got: list[list[Any]] = []
        for version in (5, 6):  # two pushes over one channel
            if rank == 0:
                send(channel, iter(named_tensors(case)), bucket_bytes=4 * KIB, version=version)
            else:
                # byte offset in the bucket buffer: 0 starts a new bucket
                got.append([(n, _portable(t), _byte_offset(t)) for n, t in receive(channel)])
                assert channel.version == version  # the push's version, delivered
        channel.close()
        results.put((rank, got, None))
    except BaseException:
        results.put((rank, [], traceback.format_exc()))


def run_members(world: int, case: str) -> dict[int, list[list[Any]]]:
    return run_ranks(_member, world, case)


@pytest.mark.parametrize(("world", "case"), [(3, "mixed"), (2, "empty")])
def test_every_tensor_arrives_bit_identical_in_order(world: int, case: str) -> None:
    expected = named_tensors(case)
    received = run_members(world, case)
    assert received[0] == []
    for rank in range(1, world):
        assert len(received[rank]) == 2
        for sync in received[rank]:
            assert [n for n, *_ in sync] == [n for n, _ in expected]
            for (name, got, _), (_, want) in zip(sync, expected, strict=True):
                # bytes, not values: NaN-safe and exact for every dtype
                assert got == _portable(want), name
    if case == "mixed":
        buckets: list[list[str]] = []
        for name, _, offset in received[1][0]:
            if offset == 0:
                buckets.append([])
            buckets[-1].append(name)
        assert ["huge"] in buckets  # bigger than a bucket: alone
        assert len(buckets) >= 3  # several buckets
        sizes = {n: t.numel() * t.element_size() for n, t in expected}
        small = [names for names in buckets if names != ["huge"]]
        assert all(sum(sizes[n] for n in names) <= 4 * KIB for names in small)


def _lonely_sender(port: int, results: Any) -> None:
    start = time.monotonic()
    try:
        WeightChannel.join("127.0.0.1", port, 0, 2, timeout_s=2)
        results.put(("joined", time.monotonic() - start))
    except WeightChannelError as error:
        results.put((str(error), time.monotonic() - start))


def test_a_receiver_that_never_joins_is_an_error_naming_the_channel() -> None:
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    _, port = master_address()
    proc = ctx.Process(target=_lonely_sender, args=(port, results))
    proc.start()
    message, elapsed = results.get(timeout=60)
    proc.join(timeout=30)
    assert f"127.0.0.1:{port}" in message and "rank 0" in message, message
    assert "rank(s) [1] did not join" in message, message
    assert elapsed < 30


def _byte_offset(tensor: torch.Tensor) -> int:
    return tensor.storage_offset() * tensor.element_size()


def _portable(tensor: torch.Tensor) -> tuple[str, tuple[int, ...], bytes]:
    """dtype, shape and raw bytes: what crosses the result queue (a tensor would be shared
    through a file descriptor that dies with its process)."""
    raw = tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return str(tensor.dtype), tuple(tensor.shape), raw
