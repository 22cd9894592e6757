"""``noded`` console script (and ``python -m noded``)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import threading
import time

from faultmesh import config, runtime
from faultmesh import log as fmlog
from faultmesh.agent import check_clusterd_arguments
from faultmesh.log import event
from faultmesh.runtime import wait_for
from noded import nodeinfo
from noded.app import NodeD, build_parser
from noded.levels import LevelTableError

log = logging.getLogger("noded")


async def print_node_info(app: NodeD, timeout_s: float) -> int:
    """Poll the BMC once (when configured) and print the node-info document. Returns 0, or 1 when
    the BMC poll failed (the document then reflects no BMC faults)."""
    rc = 0
    if app.bmc is not None and app.bmc_configured:
        app.bmc.ctx = app.make_ctx(app.bmc)
        app.bmc.publish()
        try:
            ok = await wait_for(app.bmc.poll_once(), timeout_s)
        except TimeoutError:
            ok = False
        if not ok:
            sys.stderr.write(f"noded: BMC poll failed: {app.bmc.last_error or 'timeout'}\n")
            rc = 1
    info = app.node_info()
    doc = nodeinfo.node_info_document(info)
    out = {"NodeInfo": json.loads(doc["NodeInfo"]), "updateTime": doc["updateTime"]}
    sys.stdout.write(json.dumps(out, indent=2) + "\n")
    return rc


def pool_threads_hung(prefix: str = "noded-blocking", wait_s: float = 1.0) -> bool:
    """True when a thread of the (shut down) blocking pool is still running after ``wait_s`` s: a
    hung pyghmi / DCMI call the interpreter would otherwise join at exit (up to ~30 s)."""
    deadline = time.monotonic() + wait_s
    for t in threading.enumerate():
        if t.name.startswith(prefix) and t.is_alive():
            t.join(max(0.0, deadline - time.monotonic()))
    return any(t.name.startswith(prefix) and t.is_alive() for t in threading.enumerate())


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``noded``. Returns the exit status (2 on bad flags or configuration)."""
    parser = build_parser()
    args = config.parse(parser, argv)
    check_clusterd_arguments(parser, args)
    fmlog.setup_from_args(args)
    if not args.node_name:
        parser.error("--node-name (or env NODE_NAME) is required")

    hung: list[bool] = []

    async def _main(stop: asyncio.Event) -> int:
        try:
            app = NodeD(args)
        except (ValueError, OSError, LevelTableError) as e:
            event(log, logging.ERROR, "noded configuration error", error=str(e))
            return 2
        if args.print_node_info:
            try:
                return await print_node_info(app, args.bmc_timeout + 5)
            finally:
                app.blocking.shutdown()
                hung.append(pool_threads_hung())
        try:
            await app.start()
        except OSError as e:
            event(log, logging.ERROR, "noded failed to start", error=str(e))
            await app.stop()
            return 1
        await stop.wait()
        await app.stop()
        hung.append(pool_threads_hung())
        return 0

    rc = runtime.run(_main, fast_loop=False)  # idle agent: asyncio's loop, 2.6 MiB less
    if any(hung):
        # a pyghmi / DCMI call that timed out still blocks its pool thread (up to ~30 s against a dead
        # BMC); the interpreter would join it at exit. Everything is flushed and stopped: leave now.
        event(log, logging.INFO, "exiting without waiting for a hung BMC call")
        sys.stdout.flush()
        sys.stderr.flush()
        logging.shutdown()
        os._exit(rc)
    return rc


if __name__ == "__main__":
    sys.exit(main())
