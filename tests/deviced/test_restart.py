"""No false healthy on a deviced restart (issue 20 "Done when"): three restarts of deviced, with and
without ``--state-file``, while the chip keeps its fault, produce ZERO recover changes in ClusterD
(every committed change recorded, the faults sampled every 50 ms), and the fault keeps its level
(a re-report after a restart is not a second occurrence).

In process: ClusterD and DeviceD share one event loop; the sim backend (the "hardware") outlives
each DeviceD, so the restarted daemon finds the chip still carrying the fault.
"""

from __future__ import annotations

import asyncio

import pytest
from support import ChangeWatch, eventually, make_clusterd

from deviced.app import DeviceD, build_parser
from deviced.backends import SimBackend

NODE = "node-d"


def node_faults(cd):
    return {f.key: f for f in cd.center.faults(NODE)}


@pytest.mark.parametrize("state_file", [False, True], ids=["no-state-file", "state-file"])
async def test_three_deviced_restarts_make_no_recover(tmp_path, state_file):
    cd = await make_clusterd(tmp_path)
    argv = [
        "--node-name", NODE, "--clusterd", f"127.0.0.1:{cd.grpc_port}", "--backend", "sim",
        "--http-addr", "127.0.0.1:0", "--list-watch-period", "3",
    ]  # fmt: skip
    if state_file:
        argv += ["--state-file", str(tmp_path / "deviced-state.json")]
    args = build_parser().parse_args(argv)
    hw = SimBackend(cards=1, per_card=4)
    app = DeviceD(args, hw)
    try:
        await app.start()
        await eventually(lambda: app.cycles > 0, what="first cycle")
        hw.inject(1, 0x80E18008)  # RestartNPU; Times 2 in 24 h would make it ManuallySeparateNPU
        hw.inject(2, 0x80C98000)
        got = await eventually(
            lambda: len(node_faults(cd)) == 2 and node_faults(cd), what="faults in clusterd"
        )
        levels = {k: f.level for k, f in got.items()}
        devices = await eventually(
            lambda: (
                (devs := cd.nodes.get(NODE).devices)
                and len(devs) == 4
                and sum(d["health"] != "Healthy" for d in devs.values()) == 2
                and devs
            ),
            what="device states with chips 1 and 2 UnHealthy",
        )  # device states may reach clusterd a cycle after the faults: sample from the settled view
        unhealthy: list[int] = []
        assert "RestartNPU" in levels.values()

        async def sample_devices():  # the chips' health in the node view, every 50 ms
            while True:
                devs = cd.nodes.get(NODE).devices
                unhealthy.append(sum(d["health"] != "Healthy" for d in devs.values()))
                await asyncio.sleep(0.05)

        sampler = asyncio.create_task(sample_devices())
        async with ChangeWatch(cd, lambda: got) as watch:
            for _ in range(3):
                await app.stop()
                app = DeviceD(args, hw)
                await app.start()
                await eventually(lambda a=app: a.cycles > 0, what="first cycle after restart")
                await eventually(
                    lambda: (st := cd.nodes.get(NODE)) is not None and not st.pending,
                    what="pending sources cleared",
                )
                hw.inject(1, 0x80E18008)  # the driver repeats its callback too
                await asyncio.sleep(1.5)  # a duplicate counted would escalate within ~1 s
            assert watch.samples > 50
        sampler.cancel()
        assert watch.recovers == [], watch.recovers
        assert watch.gaps == []
        assert devices and set(unhealthy) == {2}, unhealthy  # chips 1 and 2 stay UnHealthy throughout
        assert {k: f.level for k, f in node_faults(cd).items()} == levels
    finally:
        await app.stop()
        await cd.stop()
