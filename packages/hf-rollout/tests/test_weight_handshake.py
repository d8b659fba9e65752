"""The pieces of a weight push that need no second process: the handshake's keys in a real
``TCPStore`` (in this process) and the bucket checksums."""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import threading
import time
import zlib
from typing import Any

import pytest
import torch
import torch.distributed as dist

from hf_controller.worker import master_address
from hf_rollout.weight_sync import handshake
from hf_rollout.weight_sync.checksum import _device_checksum, checksum


@pytest.fixture
def store() -> dist.Store:
    _, port = master_address()
    master = dist.TCPStore(
        "127.0.0.1", port, 1, is_master=True, timeout=datetime.timedelta(seconds=10)
    )
    return dist.PrefixStore("test/", master)


def second_client(store: dist.Store) -> dist.Store:
    """Another connection to ``store``'s server, as a receiver in its own process has (one
    client's calls run one at a time)."""
    master = store.underlying_store
    client = dist.TCPStore(
        master.host, master.port, is_master=False, timeout=datetime.timedelta(seconds=10)
    )
    return dist.PrefixStore("test/", client)


def test_the_sender_names_the_ranks_not_ready_and_their_reports(store: dist.Store) -> None:
    handshake.mark_ready(store, 1, 1)
    start = time.monotonic()
    assert handshake.await_all(store, "ready", 1, [1, 2, 3], 0.3) == [2, 3]
    assert 0.2 < time.monotonic() - start < 5
    handshake.mark_ready(store, 1, 2)
    handshake.mark_ready(store, 1, 3)
    assert handshake.await_all(store, "ready", 1, [1, 2, 3], 5.0) == []
    handshake.report_done(store, 1, 1, None)
    handshake.report_done(store, 1, 2, {"message": "bad", "names": ["w"], "buckets": []})
    assert handshake.await_all(store, "done", 1, [1, 2], 1.0) == []
    assert handshake.read_reports(store, 1, [1, 2]) == {
        2: {"message": "bad", "names": ["w"], "buckets": []}
    }
    handshake.forget_push(store, 1, [1, 2, 3])
    assert not store.check(["ready/1/1"]) and not store.check(["done/1/2"])


def test_a_failed_push_is_abandoned_for_the_receivers_still_in_it(store: dist.Store) -> None:
    receiver = second_client(store)
    assert handshake.read_abort(receiver, 4) is None  # nothing said: keep waiting
    handshake.announce_abort(store, 4, "push of version 7 failed")
    # a set is not answered: a round trip on the sender's connection orders it before the
    # receiver's read (the channel's receivers read again every 0.1 s instead)
    assert store.check(["abort/4"])
    assert handshake.read_abort(receiver, 4) == "push of version 7 failed"
    assert handshake.read_abort(receiver, 5) is None  # another push is not abandoned
    handshake.forget_push(store, 4, [1])
    assert handshake.read_abort(receiver, 4) is None


def test_a_receiver_sees_go_an_abort_or_takes_back_its_ready(store: dist.Store) -> None:
    handshake.announce_start(store, 1)
    assert handshake.await_start(store, 1, 1, 1.0) is None
    handshake.announce_start(store, 2, abort="rank(s) [2] not ready")
    assert handshake.await_start(store, 2, 1, 1.0) == "abort: rank(s) [2] not ready"
    handshake.mark_ready(store, 3, 1)
    why = handshake.await_start(store, 3, 1, 0.2)
    assert why == "the sender did not start it within 0.2 s"
    # a sender that comes later does not take the rank for ready
    assert handshake.await_ready(store, 3, [1], 0.1) == [1]


def test_a_rank_ready_before_the_sender_waits_is_never_named_not_ready(
    store: dist.Store,
) -> None:
    """Rank 1 says ready, then the sender begins its wait for ranks 1 and 2: rank 1's own
    timeout ends first, but the sender claims it and names rank 2 only; rank 1 stays for the
    sender's word (the abort)."""
    seen: list[str | None] = []
    theirs = second_client(store)
    handshake.mark_ready(theirs, 1, 1)

    def wait() -> None:
        seen.append(handshake.await_start(theirs, 1, 1, 0.4))

    receiver = threading.Thread(target=wait)
    receiver.start()
    time.sleep(0.2)  # the sender comes late: its timeout ends after the receiver's
    missing = handshake.await_ready(store, 1, [1, 2], 0.4)
    assert missing == [2]
    handshake.announce_start(store, 1, abort=f"rank(s) {missing} not ready")
    receiver.join(timeout=10)
    assert seen == ["abort: rank(s) [2] not ready"]


def test_a_rank_that_withdrew_is_not_claimed_and_a_claimed_rank_cannot_withdraw(
    store: dist.Store,
) -> None:
    handshake.mark_ready(store, 1, 1)
    assert handshake.await_start(store, 1, 1, 0.1) is not None  # withdrew: no sender
    assert handshake.await_ready(store, 1, [1], 0.1) == [1]
    handshake.mark_ready(store, 2, 1)
    assert handshake.await_ready(store, 2, [1], 1.0) == []
    handshake.announce_start(store, 2)
    assert handshake.await_start(store, 2, 1, 1.0) is None


def _store_host(port: int, up: Any) -> None:
    """A sender's process reduced to its store: it dies (as a kill would) once rank 1 said
    ready."""
    master = dist.TCPStore(
        "127.0.0.1",
        port,
        2,
        is_master=True,
        timeout=datetime.timedelta(seconds=60),
        wait_for_workers=False,
    )
    up.set()
    dist.PrefixStore("test/", master).wait(["ready/1/1"], datetime.timedelta(seconds=60))
    time.sleep(0.5)
    os._exit(9)


def test_a_receiver_whose_sender_died_hears_it_at_once_not_after_its_timeout() -> None:
    """The store lives in the sender's process: when that process dies, a receiver waiting
    for the start gets the store's connection error within seconds (which the channel words
    as "the sender's store is unreachable"), not "did not start it within 60 s"."""
    _, port = master_address()
    ctx = mp.get_context("spawn")
    up = ctx.Event()
    host = ctx.Process(target=_store_host, args=(port, up))
    host.start()
    assert up.wait(120), "the store's process did not start"
    client = dist.TCPStore(
        "127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=60)
    )
    store = dist.PrefixStore("test/", client)
    handshake.mark_ready(store, 1, 1)
    start = time.monotonic()
    with pytest.raises(dist.DistNetworkError):
        handshake.await_start(store, 1, 1, 60.0)
    assert time.monotonic() - start < 30
    host.join(timeout=30)
    assert host.exitcode == 9


def test_checksums_catch_a_flipped_byte_on_both_paths() -> None:
    data = torch.randn(3000).view(torch.uint8)  # 12000 B: two whole blocks and a tail
    assert checksum(data) == zlib.crc32(data.numpy().tobytes())
    assert checksum(data[:0]) == 0
    for fn in (checksum, _device_checksum):
        for position in (0, 4096, 11999):
            changed = data.clone()
            changed[position] ^= 1
            assert fn(changed) != fn(data), (fn.__name__, position)
    swapped = torch.cat([data[4096:8192], data[:4096], data[8192:]])
    assert _device_checksum(swapped) != _device_checksum(data)  # blocks that moved
    assert _device_checksum(data) == _device_checksum(data.clone())
