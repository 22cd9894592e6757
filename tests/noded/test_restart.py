"""No false healthy on a noded restart (issue 20 "Done when"): three restarts of noded, with and
without ``--node-sn``, with a BMC answering at once and one answering each request 1 s late,
produce ZERO recover changes in ClusterD (every committed change recorded, the faults sampled
every 50 ms) while the BMC keeps its alarm; the node never shows Healthy in between.

In process: ClusterD and NodeD share one event loop; the BMC is the bmc-sim process."""

from __future__ import annotations

import asyncio

import pytest
from support import ChangeWatch, eventually, make_clusterd

from noded.app import NodeD, build_parser

NODE = "node-n"


@pytest.mark.parametrize(
    ("node_sn", "delay_s"),
    [(True, 0.0), (False, 1.0)],
    ids=["node-sn", "no-sn-bmc-1s-late"],
)
async def test_three_noded_restarts_make_no_recover(tmp_path, bmc_sim, node_sn, delay_s):
    cd = await make_clusterd(tmp_path)
    argv = [
        "--node-name", NODE, "--clusterd", f"127.0.0.1:{cd.grpc_port}", "--http-addr", "127.0.0.1:0",
        "--bmc-host", "127.0.0.1", "--bmc-port", str(bmc_sim.port), "--bmc-user", bmc_sim.user,
        "--bmc-password-file", str(bmc_sim.password_file), "--poll-interval", "1",
        "--bmc-timeout", "15", "--min-report-interval", "0.3", "--clusterd-backoff-max", "0.5",
    ]  # fmt: skip
    if node_sn:
        argv += ["--node-sn", "SN-TEST-1"]
    args = build_parser().parse_args(argv)
    bmc_sim.add_alarm("0800004B", "Memory", 3)
    app = NodeD(args)
    statuses: list[str] = []
    try:
        await app.start()
        got = await eventually(lambda: cd.center.faults(NODE), what="BMC fault in clusterd")
        keys = {f.key for f in got}
        await eventually(lambda: cd.nodes.status(NODE) not in ("", "Healthy"), what="node status")
        bmc_sim.behave(delay_s=delay_s)

        async def sample_status():
            while True:
                statuses.append(cd.nodes.health(NODE).health)
                await asyncio.sleep(0.05)

        sampler = asyncio.create_task(sample_status())
        async with ChangeWatch(cd, lambda: keys) as watch:
            for _ in range(3):
                await app.stop()
                app = NodeD(args)
                await app.start()
                await eventually(
                    lambda a=app: a.bmc.polls_ok > 0, what="first BMC poll after restart", timeout_s=25
                )
                await eventually(
                    lambda: (st := cd.nodes.get(NODE)) is not None and not st.pending,
                    what="pending sources cleared",
                )
                await asyncio.sleep(0.5)
        sampler.cancel()
        assert watch.samples > 20
        assert watch.recovers == [], watch.recovers
        assert watch.gaps == []
        assert "Healthy" not in statuses, statuses
    finally:
        bmc_sim.behave(delay_s=0.0)
        await app.stop()
        await cd.stop()
