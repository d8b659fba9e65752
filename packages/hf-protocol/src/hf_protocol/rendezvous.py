"""torch.distributed rendezvous that listens on one address, never on every interface.

torch's own ``env://`` rendezvous and a plain ``TCPStore(..., is_master=True)`` make rank 0's
store listen on ``*:<port>`` (every interface, no authentication), whatever ``MASTER_ADDR``
says. A local run is meant to stay on the loopback, and a multi-node run on the cluster's
interface, so every store and transport of ours is built here:

* :func:`store_on` hosts the store on a socket bound to ``host`` only (torch's
  ``master_listen_fd``), and connects the other ranks to it as usual;
* :func:`pin_transports_to_loopback` keeps gloo's and NCCL's own sockets on the loopback
  when the rendezvous is local (unless the user chose interfaces already);
* :func:`gloo_device_toward` is the gloo device a process group built by hand uses: the
  address this process reaches ``host`` from.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
import sys
from typing import Any

import torch.distributed as dist

__all__ = [
    "gloo_device_toward",
    "is_loopback",
    "local_address_toward",
    "pin_transports_to_loopback",
    "store_on",
]

TRANSPORT_INTERFACE_ENVS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
"""The variables gloo and NCCL read to choose the interface their sockets use."""

_LISTEN_BACKLOG = 2048


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) resolves to a loopback address only."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return False
    addresses = {str(info[4][0]) for info in infos}
    return bool(addresses) and all(
        ipaddress.ip_address(address.split("%")[0]).is_loopback for address in addresses
    )


def local_address_toward(host: str) -> str:
    """The address of this machine that packets to ``host`` leave from (loopback for a
    loopback ``host``); found by routing, no packet is sent."""
    if is_loopback(host):
        return "127.0.0.1"
    family, _, _, _, address = socket.getaddrinfo(host, 1, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect(address)
        return str(probe.getsockname()[0])


def _loopback_interface() -> str:
    """The name of the loopback interface (``lo`` on Linux, ``lo0`` on macOS)."""
    names = [name for _, name in socket.if_nameindex() if name.startswith("lo")]
    if names:
        return sorted(names, key=len)[0]
    return "lo0" if sys.platform == "darwin" else "lo"


def pin_transports_to_loopback(master_addr: str) -> None:
    """Point gloo's and NCCL's sockets at the loopback interface when ``master_addr`` is a
    loopback address (a local run); a variable the user set is left alone, and so is any
    multi-node rendezvous. Call it before the process group is created."""
    if not is_loopback(master_addr):
        return
    interface = _loopback_interface()
    for name in TRANSPORT_INTERFACE_ENVS:
        os.environ.setdefault(name, interface)


def gloo_device_toward(host: str) -> Any:
    """A gloo device whose sockets listen on :func:`local_address_toward` ``host`` only, for
    a ``ProcessGroupGloo`` built directly: its default device follows what the machine's
    hostname resolves to, which may be another interface than the rendezvous's."""
    return dist.ProcessGroupGloo.create_device(hostname=local_address_toward(host))


def _listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` and listening; a clear error if it cannot be."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(_LISTEN_BACKLOG)
    except OSError as error:
        sock.close()
        raise RuntimeError(
            f"the rendezvous store could not listen on {host}:{port}: {error}. Another "
            "process took the port between its choice and this bind, or the address is not "
            "one of this machine's; start the group again (a new port is chosen)"
        ) from error
    return sock


def store_on(
    host: str,
    port: int,
    world_size: int,
    is_master: bool,
    timeout: datetime.timedelta,
) -> dist.TCPStore:
    """A ``TCPStore`` for ``world_size`` ranks at ``host:port``.

    The master (rank 0) listens on ``host`` only: its socket is bound here and handed to
    torch (``master_listen_fd``), so the store never listens on every interface. The
    others connect to it, waiting up to ``timeout`` for it to come up.
    """
    if not is_master:
        return dist.TCPStore(host, port, world_size, is_master=False, timeout=timeout)
    sock = _listening_socket(host, port)
    try:
        store = dist.TCPStore(
            host,
            port,
            world_size,
            is_master=True,
            timeout=timeout,
            wait_for_workers=False,
            master_listen_fd=sock.fileno(),
        )
    except BaseException:
        sock.close()
        raise
    sock.detach()  # the store owns the descriptor now and closes it itself
    return store
