"""The rendezvous store listens on its host only; local transports stay on the loopback."""

from __future__ import annotations

import datetime
import os
import socket

import pytest

from hf_protocol.rendezvous import (
    TRANSPORT_INTERFACE_ENVS,
    is_loopback,
    local_address_toward,
    pin_transports_to_loopback,
    store_on,
)

TIMEOUT = datetime.timedelta(seconds=10)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _outside_address() -> str | None:
    """A non-loopback address of this machine, if it has one."""
    try:
        address = local_address_toward("192.0.2.1")  # TEST-NET-1: routed, never reached
    except OSError:
        return None
    return None if is_loopback(address) else address


def test_the_store_serves_its_ranks_and_listens_on_its_host_only() -> None:
    port = _free_port()
    master = store_on("127.0.0.1", port, 2, is_master=True, timeout=TIMEOUT)
    client = store_on("127.0.0.1", port, 2, is_master=False, timeout=TIMEOUT)
    client.set("greeting", "hello")
    assert master.get("greeting") == b"hello"
    outside = _outside_address()
    if outside is not None:  # torch's own store would accept this connection
        with socket.socket() as probe, pytest.raises(ConnectionRefusedError):
            probe.connect((outside, port))


def test_a_taken_port_is_a_named_error() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        with pytest.raises(RuntimeError, match=f"could not listen on 127.0.0.1:{port}"):
            store_on("127.0.0.1", port, 2, is_master=True, timeout=TIMEOUT)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("localhost", True),
        ("::1", True),
        ("192.0.2.7", False),
        ("no-such-host.invalid", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_local_address_toward_the_loopback_is_the_loopback() -> None:
    assert local_address_toward("127.0.0.1") == "127.0.0.1"
    assert local_address_toward("localhost") == "127.0.0.1"


def test_local_transports_are_pinned_to_the_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in TRANSPORT_INTERFACE_ENVS:
        monkeypatch.delenv(name, raising=False)
    pin_transports_to_loopback("192.0.2.7")  # a cluster's rendezvous: left to the user
    assert not any(name in os.environ for name in TRANSPORT_INTERFACE_ENVS)
    pin_transports_to_loopback("127.0.0.1")
    interfaces = {os.environ[name] for name in TRANSPORT_INTERFACE_ENVS}
    assert len(interfaces) == 1 and interfaces.pop().startswith("lo")
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "eth7")  # the user's choice stays
    pin_transports_to_loopback("127.0.0.1")
    assert os.environ["NCCL_SOCKET_IFNAME"] == "eth7"
