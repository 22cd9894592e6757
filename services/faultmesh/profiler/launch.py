"""Where the example job's ranks meet (:mod:`faultmesh.profiler.example_job`): the torchrun
environment (:func:`rendezvous`) and, across hosts, the interface gloo must use
(:func:`gloo_interface`)."""

from __future__ import annotations

import os
import socket
from typing import NamedTuple


def _free_port(addr: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


class Rendezvous(NamedTuple):
    """Where the ranks meet (gloo's TCP store at ``master_addr:master_port``), and this process's
    ``rank`` of ``world_size`` (``local_rank`` on its host) when a launcher started it; ``rank`` is
    None when the job spawns its ranks itself."""

    master_addr: str
    master_port: int
    rank: int | None = None
    world_size: int | None = None
    local_rank: int | None = None


def rendezvous(env=os.environ) -> Rendezvous:
    """The torchrun environment: ``MASTER_ADDR`` (default 127.0.0.1), ``MASTER_PORT`` (default: a
    free port, single host only), ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` (all three or none:
    launched by torchrun or by hand on each host). Raises ``ValueError`` naming the variable."""

    def number(name: str, lo: int, hi: int) -> int | None:
        text = env.get(name, "").strip()
        if not text:
            return None
        if not text.isdigit() or not lo <= int(text) <= hi:
            raise ValueError(f"{name}={text[:32]!r}: expected an integer in {lo}..{hi}")
        return int(text)

    addr = env.get("MASTER_ADDR", "").strip() or "127.0.0.1"
    port = number("MASTER_PORT", 1, 65535)
    world = number("WORLD_SIZE", 1, 1 << 20)
    rank = number("RANK", 0, 1 << 20)
    if rank is None or world is None:
        if rank is not None or world is not None:
            raise ValueError("RANK and WORLD_SIZE come together (as torchrun sets them)")
        return Rendezvous(addr, port or _free_port(addr))
    if rank >= world:
        raise ValueError(f"RANK={rank} is not below WORLD_SIZE={world}")
    if port is None:
        raise ValueError("MASTER_PORT is needed with RANK and WORLD_SIZE: every rank dials the same one")
    return Rendezvous(addr, port, rank, world, number("LOCAL_RANK", 0, world - 1) or 0)


SIOCGIFADDR = 0x8915  # Linux ioctl: an interface's IPv4 address


def gloo_interface(master_addr: str, master_port: int) -> tuple[str, str] | None:
    """(interface name, local IPv4 address) this host uses toward ``master_addr``, for
    ``GLOO_SOCKET_IFNAME``: gloo binds the address the host name resolves to, which on a stock
    Debian/Ubuntu ``/etc/hosts`` (``127.0.1.1 <hostname>``) or in a container is loopback, so ranks on
    other hosts were told to dial 127.0.0.1 and the job failed (``Gloo connectFullMesh failed``).
    None when that address is loopback (one host), not IPv4, or not found on an interface (Linux
    only: ``SIOCGIFADDR``)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((master_addr, master_port))  # UDP: picks the route, sends nothing
            local = s.getsockname()[0]
    except OSError:
        return None
    if local.startswith("127."):
        return None
    try:
        import fcntl
        import struct
    except ImportError:  # not a POSIX host
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                req = struct.pack("256s", name.encode()[:15])
                addr = socket.inet_ntoa(fcntl.ioctl(s.fileno(), SIOCGIFADDR, req)[20:24])
            except OSError:  # no IPv4 address on it
                continue
            if addr == local:
                return name, local
    return None
