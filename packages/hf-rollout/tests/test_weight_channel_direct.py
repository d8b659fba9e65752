"""WeightChannel's fast paths between real gloo processes: tensors sent unpacked (from
their own memory), staged on the receiver and copied into destinations of other dtypes or
layouts, and the buffered (snapshot) send."""

from __future__ import annotations

import traceback
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from hf_rollout.testing import run_ranks
from hf_rollout.weight_sync.channel import WeightChannel
from hf_rollout.weight_sync.receiver import receive
from hf_rollout.weight_sync.sender import send, send_buffered, wait_sent

pytestmark = pytest.mark.timeout(180)

KIB = 1024
SETTINGS = [  # (bucket_bytes, direct_bytes) of each sync
    (4 * KIB, 1 * KIB),  # buckets smaller than some tensors, several direct per bucket
    (1 << 20, 1 * KIB),  # one bucket larger than every tensor
    (4 * KIB, 1 << 20),  # nothing direct but the lone tensors bigger than a bucket
]


def named_tensors() -> list[tuple[str, torch.Tensor]]:
    """Mixed dtypes and sizes (built the same way in every process)."""
    gen = torch.Generator().manual_seed(0)
    return [
        ("embed.weight", torch.randn(64, 16, generator=gen)),  # 4 KiB
        ("norm.weight", torch.randn(16, generator=gen).to(torch.bfloat16)),
        ("layer.0.q", torch.randn(24, 24, generator=gen).to(torch.bfloat16)),  # 1152 B
        ("layer.0.k", torch.randn(24, 24, generator=gen)),  # 2304 B
        ("positions", torch.randint(-(2**40), 2**40, (300,), generator=gen)),  # int64 2400 B
        ("huge", torch.randn(4096, generator=gen)),  # 16 KiB
        ("zero_sized", torch.empty(0, 4)),
        ("transposed", torch.randn(40, 30, generator=gen).t()),  # not contiguous, 4800 B
        ("flags", torch.tensor([True, False, True])),
        ("head.weight", torch.randn(32, 32, generator=gen).half()),  # 2 KiB
    ]


def destinations() -> dict[str, torch.Tensor]:
    """Zeroed destinations; two differ from the sender's tensor (dtype, layout)."""
    dest = {name: torch.zeros_like(t.contiguous()) for name, t in named_tensors()}
    dest["layer.0.k"] = torch.zeros(24, 24, dtype=torch.float64)  # dtype differs: a copy
    dest["embed.weight"] = torch.zeros(16, 64).t()  # not contiguous: a copy
    return dest


def _load(dest: dict[str, torch.Tensor], stream: Any) -> None:
    """Copy the stream into ``dest`` as an engine would."""
    for name, tensor in stream:
        dest[name].copy_(tensor.to(dest[name].dtype))


def _member(rank: int, world: int, port: int, results: Any, modified: Any) -> None:
    try:
        channel = WeightChannel.join("127.0.0.1", port, rank, world, timeout_s=60)
        got: list[Any] = []
        tensors = named_tensors()
        for bucket, direct in SETTINGS:
            channel.direct_bytes = direct
            if rank == 0:
                send(channel, iter(tensors), bucket_bytes=bucket)
                got.append(channel.last_buckets)
            else:
                dest = destinations()
                _load(dest, receive(channel))
                got.append((_bytes(dest), channel.last_buckets))
        # Buffered: the sender changes its tensors right after the call; the receivers only
        # start once it has, and must still get the values of the call.
        channel.direct_bytes = 1 * KIB
        for _ in range(2):
            if rank == 0:
                send_buffered(channel, iter(tensors), bucket_bytes=4 * KIB)
                for _, tensor in tensors:
                    tensor.copy_(~tensor if tensor.dtype == torch.bool else tensor + 1)
                modified.set()
                wait_sent(channel)
                modified.clear()
            else:
                modified.wait(timeout=60)
                dest = destinations()
                _load(dest, receive(channel))
                got.append(_bytes(dest))
        channel.close()
        results.put((rank, got, None))
    except BaseException:
        results.put((rank, [], traceback.format_exc()))


def _bytes(tensors: dict[str, torch.Tensor]) -> dict[str, bytes]:
    return {
        n: t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        for n, t in tensors.items()
    }


def _expected(step: int) -> dict[str, bytes]:
    """The destinations' bytes after loading the sender's tensors changed ``step`` times."""
    dest = destinations()
    for name, tensor in named_tensors():
        for _ in range(step):
            tensor = ~tensor if tensor.dtype == torch.bool else tensor + 1
        dest[name].copy_(tensor.to(dest[name].dtype))
    return _bytes(dest)


@pytest.fixture(scope="module", params=[2, 3], ids=["1 receiver", "2 receivers"])
def synced(request: pytest.FixtureRequest) -> dict[int, list[Any]]:
    ctx = mp.get_context("spawn")
    return run_ranks(_member, request.param, ctx.Event(), timeout_s=150, ctx=ctx)


def test_received_bit_identical_for_every_bucket_size(synced: dict[int, list[Any]]) -> None:
    want = _expected(0)
    for rank in sorted(synced)[1:]:
        for (bucket, direct), (got, buckets) in zip(SETTINGS, synced[rank], strict=False):
            assert got == want, (bucket, direct)
            assert buckets == synced[0][SETTINGS.index((bucket, direct))]


def test_buckets_follow_bucket_bytes(synced: dict[int, list[Any]]) -> None:
    sizes = {n: t.numel() * t.element_size() for n, t in named_tensors()}
    small, large, _ = synced[0][:3]
    assert ["huge"] in small and len(small) >= 4
    assert all(sum(sizes[n] for n in names) <= 4 * KIB for names in small if len(names) > 1)
    assert large == [[n for n, _ in named_tensors()]]


def test_buffered_send_delivers_the_snapshot_of_the_call(synced: dict[int, list[Any]]) -> None:
    for rank in sorted(synced)[1:]:
        first, second = synced[rank][3:]
        assert first == _expected(0)  # changed after the call: not seen
        assert second == _expected(1)
