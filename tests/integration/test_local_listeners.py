"""A local run listens on the loopback only (issue 32, item 5).

A worker group on a local Ray joins torch.distributed through hf_engines'
``init_distributed`` (every engine worker's path) and a weight channel (the separate
placement's actor -> rollout path). While both are up, every listening TCP socket of the
driver and of all its descendant processes (GCS, raylet, agents, workers) must be bound to a
loopback address: torch's own rendezvous would have rank 0's store on ``*:<port>``.

Sockets are read from ``/proc`` (Linux), so the test needs no extra package.
"""

from __future__ import annotations

import ipaddress
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from hf_controller import (
    Dispatch,
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    Worker,
    register,
)
from hf_controller.worker import free_port
from hf_engines.workers.distributed import init_distributed
from hf_rollout.weight_sync import WeightChannel

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads sockets from /proc")

_LISTEN = "0A"  # TCP state of a listening socket in /proc/net/tcp


class ListeningWorker(Worker):
    """Joins the default process group and a weight channel, as a trainer's workers do."""

    def __init__(self) -> None:
        super().__init__()
        init_distributed(self.rank, self.world_size, self.local_rank, "cpu", timeout_s=60)
        self.channel: WeightChannel | None = None

    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def join_channel(self, port: int) -> int:
        self.channel = WeightChannel.join("127.0.0.1", port, self.rank, 2, timeout_s=60)
        return os.getpid()


def _address(hex_address: str) -> str:
    """An address of /proc/net/tcp{,6} (hex, little-endian words) as text."""
    raw = bytes.fromhex(hex_address)
    if len(raw) == 4:
        return str(ipaddress.IPv4Address(raw[::-1]))
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    address = ipaddress.IPv6Address(words)
    return str(address.ipv4_mapped or address)


def _listening_inodes() -> dict[str, str]:
    """Socket inode -> ``address:port`` of every listening TCP socket on the machine."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == _LISTEN:
                hex_address, hex_port = fields[1].split(":")
                found[fields[9]] = f"{_address(hex_address)}:{int(hex_port, 16)}"
    return found


def _descendants(root: int) -> set[int]:
    """``root`` and every process below it."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        parent = int(text.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(stat.parent.name))
    tree, todo = set(), [root]
    while todo:
        pid = todo.pop()
        tree.add(pid)
        todo += children.get(pid, [])
    return tree


def _listeners_of(pids: set[int]) -> list[tuple[int, str]]:
    """``(pid, address:port)`` of every socket ``pids`` listen on."""
    inodes = _listening_inodes()
    found = []
    for pid in pids:
        try:
            links = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
        except OSError:
            continue
        for link in links:
            inode = link[len("socket:[") : -1] if link.startswith("socket:[") else ""
            if inode in inodes:
                found.append((pid, inodes[inode]))
    return found


def _is_loopback(address_port: str) -> bool:
    return ipaddress.ip_address(address_port.rsplit(":", 1)[0]).is_loopback


def test_a_local_run_listens_on_the_loopback_only(ray_session: Any) -> None:
    group = RayWorkerGroup(
        RayResourcePool([2], use_gpu=False),
        RayClassWithInitArgs(ListeningWorker),
        name_prefix="listeners",
    )
    try:
        worker_pids = group.wait_results("join_channel", group.join_channel(free_port("127.0.0.1")))
        listeners = _listeners_of(_descendants(os.getpid()))
        workers = [address for pid, address in listeners if pid in worker_pids]
        # rank 0 hosts two stores (default group, channel); gloo's pairs listen too
        assert len(workers) >= 4, listeners
        outside = [(pid, address) for pid, address in listeners if not _is_loopback(address)]
        assert outside == [], f"listening beyond the loopback: {outside}"
    finally:
        group.shutdown()
