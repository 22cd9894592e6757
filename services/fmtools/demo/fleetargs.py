"""The fleet's command-line flags, shared by ``make demo`` and ``faultmesh up`` (argparse only: the
CLI imports this at start, the stack itself only when it runs)."""

from __future__ import annotations

import argparse

from faultmesh.config import non_negative_float, number_in


def add_fleet_args(p: argparse.ArgumentParser, gpu_servers: int, gpu_max: int, servers_help: str) -> None:
    """The fleet's flags, the same in ``make demo`` and ``faultmesh up`` (:class:`StackConfig`'s sizes
    and periods): ``--servers``, ``--npus``, ``--gpu-servers`` (default ``gpu_servers``, at most
    ``gpu_max``), ``--bmc-poll`` (s), ``--list-watch`` (s), ``--pingmesh-period`` (s)."""
    p.add_argument("--servers", type=int, default=4, help=servers_help)
    p.add_argument("--npus", type=int, default=16, help="simulated NPUs per server (multiple of 8)")
    p.add_argument(
        "--gpu-servers",
        type=number_in(int, 0, gpu_max),
        default=gpu_servers,
        help="simulated NVIDIA GPU servers beside them (a mixed fleet; 0 = NPU only)",
    )
    p.add_argument(
        "--bmc-poll", type=number_in(float, 1, 600), default=2.0, help="noded's BMC poll period (s, 1..600)"
    )
    p.add_argument(
        "--list-watch",
        type=number_in(int, 3, 1800),
        default=3,
        help="deviced's list-watch period (s, 3..1800)",
    )
    p.add_argument(
        "--pingmesh-period",
        type=non_negative_float,
        default=0.0,
        help="pingmesh collection and slow-network detection period (s); 0 = 10 x task_interval",
    )
