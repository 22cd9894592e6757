"""deviced's command-line flags (issue 4; reference deviced.md §8 for the list-watch range).

Every flag can also come from the environment / config file through :func:`faultmesh.config.parse`.
"""

from __future__ import annotations

import argparse
import os

from deviced import faultconfig
from deviced.sinks import kube_deviceinfo
from faultmesh.agent import add_clusterd_arguments
from faultmesh.config import number_in
from faultmesh.log import add_log_arguments


def build_parser() -> argparse.ArgumentParser:
    """deviced's flags (issue 4; reference §8 for the list-watch range)."""
    p = argparse.ArgumentParser(
        prog="deviced", description="faultmesh deviced: NPU, network and switch faults"
    )
    p.add_argument(
        "--node-name",
        default=os.environ.get("NODE_NAME", ""),
        help="this node's name (env NODE_NAME, else hostname)",
    )
    add_clusterd_arguments(p)
    p.add_argument("--backend", choices=("dcmi", "sim", "nvml"), default="dcmi", help="nvml: NVIDIA GPUs")
    p.add_argument("--nvml-lib", help="nvml: path of libnvidia-ml.so.1 (default: nvidia-ml-py's own lookup)")
    p.add_argument("--nvml-fault-table", help="nvml: nvidiaFaultTable.json (default: faultmesh's table)")
    p.add_argument("--nvml-poll-interval", type=float, default=5.0, help="nvml: s between GPU health polls")
    p.add_argument("--dcmi-lib", help="path of libdcmi.so (default: the driver lib dirs)")
    p.add_argument(
        "--dcmi-api",
        choices=("auto", "v1", "v2"),
        default="auto",
        help="DCMI family: v1 (card/device; 910, A2, A3), v2 (dev id; A5); auto = v1 when exported, else v2",
    )
    p.add_argument("--lingqu-lib", help="path of liblingqu-dcmi.so (default: the driver lib dirs)")
    p.add_argument("--no-switch", action="store_true", help="do not watch lingqu switch faults")
    p.add_argument("--hccn-tool", default="/usr/local/Ascend/driver/tools/hccn_tool", help="hccn_tool path")
    p.add_argument(
        "--link-check-interval",
        type=float,
        default=300.0,
        help="s between hccn_tool link checks of a chip without network codes (reference: 5 min); 0 = off",
    )
    p.add_argument("--http-addr", default="127.0.0.1:0", help="metrics/health HTTP address")
    p.add_argument("--sim-control-addr", help="sim backend: separate HTTP address of the control API")
    p.add_argument(
        "--sim-vendor",
        choices=("ascend", "nvidia"),
        default="ascend",
        help="sim backend: nvidia = simulated GPUs with the NVIDIA fault table (XID / NVML codes)",
    )
    p.add_argument("--sim-cards", type=int, default=1)
    p.add_argument("--sim-devices-per-card", type=int, default=8)
    p.add_argument("--fault-code-file", help="faultCode.json (default: faultmesh's table)")
    p.add_argument("--fault-customization-file", help="faultCustomization.json")
    p.add_argument("--switch-fault-code-file", help="SwitchFaultCode.json")
    p.add_argument(
        "--relation-fault-file",
        help="relationFaultCustomization.json (relation faults; default: faultmesh's)",
    )
    p.add_argument(
        "--fault-duration-file", help="faultDuration.json (relation-fault deadlines; default: faultmesh's)"
    )
    p.add_argument("--list-watch-period", type=number_in(int, 3, 1800), default=5, help="s, 3..1800")
    p.add_argument(
        "--table-reload-interval",
        type=float,
        default=300.0,
        help="s between checks of the table files for changes (reference PollInterval); 0 = never",
    )
    p.add_argument("--probe-interval", type=float, default=2.5, help="gateway probe period (s); 0 = off")
    p.add_argument("--switch-query-interval", type=float, default=300.0, help="s between full switch queries")
    p.add_argument("--callback-rate-limit", type=int, default=1000, help="accepted callbacks per minute")
    p.add_argument(
        "--fast-fault-path",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="report a DCMI callback's fault at once (a fast cycle), not at the next 1 s cycle; "
        "--no-fast-fault-path keeps the reference's cadence",
    )
    p.add_argument("--dcmi-timeout", type=float, default=5.0, help="s per DCMI call")
    p.add_argument("--no-subscribe", action="store_true", help="poll only (no fault subscription)")
    p.add_argument("--reset-config-dir", help="directory of per-job reset-config files (off when unset)")
    p.add_argument(
        "--state-file",
        help="JSON file keeping escalations (ManuallySeparateNPU, failed resets) across restarts",
    )
    p.add_argument("--hot-reset", action="store_true", help="hot-reset idle RestartNPU/FreeRestartNPU chips")
    p.add_argument(
        "--grace-tolerance",
        action="store_true",
        help="graceful fault tolerance: the reset-config files drive TaskD through stop / reset / restart "
        "of a job's chips, timed by faultCustomization.json's GraceTolerance (needs --reset-config-dir; "
        "excludes --hot-reset)",
    )
    p.add_argument(
        "--grace-processes-timeout-s",
        type=float,
        default=60.0,
        help="graceful tolerance: s the job's processes get to leave its chips before it is isolated "
        "(reference WaitProcessesToZeroTime)",
    )
    p.add_argument(
        "--grace-error-clean-s",
        type=float,
        default=30.0,
        help="graceful tolerance: s a RestartRequest fault gets to clear before the chip is reset "
        "(reference WaitErrorCodeCleanTime)",
    )
    p.add_argument(
        "--grace-npu-ready-s",
        type=float,
        default=30.0,
        help="graceful tolerance: s after a reset before the recovered status is written "
        "(reference WaitNpuReadyTime)",
    )
    p.add_argument(
        "--grace-reset-group",
        type=int,
        default=0,
        help="graceful tolerance: chips reset together; a job with fewer chips on the node is left to "
        "rescheduling (reference resetDevNumOnce); 0: by product (910B 8, A3 every chip, 910 4)",
    )
    p.add_argument("--hot-reset-idle", type=float, default=60.0, help="s a chip must be idle before a reset")
    p.add_argument("--hot-reset-boot-timeout", type=float, default=180.0, help="s to wait for boot")
    p.add_argument(
        "--hot-reset-budget",
        type=int,
        default=3,
        help="hot resets per chip per --hot-reset-window-s (--hot-reset and --grace-tolerance)",
    )
    p.add_argument(
        "--hot-reset-window-s", type=float, default=6 * 3600.0, help="window of --hot-reset-budget (s)"
    )
    p.add_argument(
        "--recover-delay-s", type=float, default=1.0, help="a callback recover is applied this late (s; §1.1)"
    )
    p.add_argument(
        "--poll-fallback-s",
        type=float,
        default=300.0,
        help="a chip unhealthy this long is mended by polling (s; reference: 5 min)",
    )
    p.add_argument(
        "--hbm-pair-window-s",
        type=float,
        default=5.0,
        help="AIC/AIV bus faults within this of an HBM double-bit fault are its consequence (s; §4.3)",
    )
    p.add_argument(
        "--restart-grace-s",
        type=float,
        default=10.0,
        help="after a restart, a code the --state-file kept that no poll nor callback shows this long "
        "recovered while deviced was down (s; a driver slow to list its codes needs more)",
    )
    p.add_argument("--max-codes-per-chip", type=int, default=512, help="active codes kept per chip")
    p.add_argument("--print-device-info", action="store_true", help="print the device-info document and exit")
    add_log_arguments(p)
    kube_deviceinfo.add_arguments(p)
    faultconfig.add_arguments(p)
    return p
