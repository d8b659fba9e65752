"""The torch.distributed rendezvous port a worker group picks."""

from __future__ import annotations

import socket

from hf_controller.worker import RENDEZVOUS_PORTS, free_port


def test_free_port_stays_out_of_the_ephemeral_range() -> None:
    """Rendezvous ports come from below the kernel's ephemeral range, where no outgoing
    connection can take them before rank 0 listens; each is free when returned."""
    low, high = RENDEZVOUS_PORTS
    for _ in range(20):
        port = free_port("127.0.0.1")
        assert low <= port < high
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))  # free: binds
    # With no attempt left the kernel picks one, as before.
    assert 0 < free_port("127.0.0.1", attempts=0) < 65536
