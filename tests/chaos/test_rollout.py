"""A DaemonSet rollout with active faults changes nothing clusterd believes (issue 30).

Three simulated servers, each a BMC simulator (the real ``faultmesh bmc-sim``, IPMI lanplus), a noded
polling it (``--bmc-state-file``) and a deviced on the sim DCMI backend (``--state-file``), report to
one clusterd. Faults are active on every server -- stable ones (a RestartNPU chip fault with a
frequency rule, a second chip fault, a BMC alarm) and flapping ones (a chip fault and a BMC
alarm going on and off every ~0.3 s). Every agent is restarted in turn (maxUnavailable 1: deviced,
then noded, node by node), then all six at once. Before and after, with the flapping faults settled:
clusterd's stable faults, their levels and first-seen times, each node's health and each chip's
health are identical; during the rollout clusterd committed no change at all to a stable fault (no
recover/occur pair, no escalation, never missing from a 50 ms sample), its history holds one occur
per stable fault, and no deviced holds an escalation.

In process: clusterd, the nodeds and the deviceds share one event loop; the sim chips (the
"hardware") outlive each deviced, as a chip outlives the device plugin's pod.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest
from noded_support import BmcSim
from support import ChangeWatch, eventually, make_clusterd

from deviced.app import DeviceD
from deviced.app import build_parser as deviced_parser
from deviced.backends import SimBackend
from noded.app import NodeD
from noded.app import build_parser as noded_parser

NODES = ("rack-0", "rack-1", "rack-2")
HBM = 0x80E18008  # RestartNPU; a second occurrence in 24 h would make it ManuallySeparateNPU
AIC = 0x80C98000  # RestartRequest, also under the 2-in-24 h frequency rule
FLAP_CHIP = 0x80C98002  # RestartRequest, no frequency rule: flaps on chip 3
BMC_ALARM = "0800004B"  # BMC alarm (top byte 0x08: a PCIe card), PreSeparateFault
FLAP_BMC = "0100000D"  # BMC alarm, NotHandleFault: flaps


class Server:
    """One simulated server: its BMC simulator, chips, and the two agents (restartable)."""

    def __init__(self, name: str, tmp: Path, cd, bmc: BmcSim) -> None:
        self.name = name
        self.bmc = bmc
        self.hw = SimBackend(cards=1, per_card=4)
        self.deviced_args = deviced_parser().parse_args([
            "--node-name", name, "--clusterd", f"127.0.0.1:{cd.grpc_port}", "--backend", "sim",
            "--http-addr", "127.0.0.1:0", "--list-watch-period", "3",
            "--state-file", str(tmp / f"{name}-deviced.json"),
        ])  # fmt: skip
        self.noded_args = noded_parser().parse_args([
            "--node-name", name, "--clusterd", f"127.0.0.1:{cd.grpc_port}", "--http-addr", "127.0.0.1:0",
            "--bmc-host", "127.0.0.1", "--bmc-port", str(bmc.port), "--bmc-user", bmc.user,
            "--bmc-password-file", str(bmc.password_file), "--poll-interval", "1", "--bmc-timeout", "15",
            "--min-report-interval", "0.3", "--clusterd-backoff-max", "0.5",
            "--bmc-state-file", str(tmp / f"{name}-noded.json"),
        ])  # fmt: skip
        self.deviced: DeviceD | None = None
        self.noded: NodeD | None = None

    async def start_deviced(self) -> None:
        self.deviced = DeviceD(self.deviced_args, self.hw)
        await self.deviced.start()
        await eventually(lambda d=self.deviced: d.cycles > 0, what=f"{self.name} deviced first cycle")
        if HBM in self.hw.devs[1].codes:  # a restart: the driver repeats its callback too
            await asyncio.to_thread(self.hw.inject, 1, HBM)

    async def start_noded(self) -> None:
        self.noded = NodeD(self.noded_args)
        await self.noded.start()
        await eventually(
            lambda n=self.noded: n.bmc.polls_ok > 0, what=f"{self.name} first BMC poll", timeout_s=25
        )

    async def stop(self) -> None:
        for agent in (self.deviced, self.noded):
            if agent is not None:
                await agent.stop()
        self.deviced = self.noded = None


def stable_view(cd) -> dict:
    """What must not change: stable faults (key -> level, first seen), node and chip health."""
    faults = {
        f.key: (f.level, f.first_seen_ms)
        for f in cd.center.faults()
        if f.code not in (f"{FLAP_CHIP:08X}", FLAP_BMC)
    }
    nodes = {n: cd.nodes.health(n).health for n in NODES}
    chips = {
        (n, dev): st["health"]
        for n in NODES
        for dev, st in cd.nodes.get(n).devices.items()
        if "3" not in str(dev)  # the flapping chip
    }
    return {"faults": faults, "nodes": nodes, "chips": chips}


async def flap(servers: list[Server], stop: asyncio.Event, flips: list[int]) -> None:
    """Toggle the flapping chip fault and BMC alarm on every server until ``stop``, counting the
    flips in ``flips[0]``; ends recovered."""
    on = False
    while not stop.is_set():
        on = not on
        for s in servers:
            await asyncio.to_thread(s.hw.inject, 3, FLAP_CHIP, 1 if on else 0)
            if on:
                await asyncio.to_thread(s.bmc.add_alarm, FLAP_BMC, "Memory", 7)
            else:
                await asyncio.to_thread(s.bmc.clear_alarms, code=FLAP_BMC)
        flips[0] += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.3)
    if on:
        for s in servers:
            await asyncio.to_thread(s.hw.inject, 3, FLAP_CHIP, 0)
            await asyncio.to_thread(s.bmc.clear_alarms, code=FLAP_BMC)


def settled(cd, servers) -> bool:
    """No flapping fault left in clusterd, every source current."""
    codes = {f.code for f in cd.center.faults()}
    pending = any(cd.nodes.get(s.name).pending for s in servers)
    return not pending and f"{FLAP_CHIP:08X}" not in codes and FLAP_BMC not in codes


@pytest.mark.timeout(120)
async def test_rollout_one_at_a_time_then_all_at_once_changes_nothing(tmp_path):
    cd = await make_clusterd(tmp_path)
    bmcs = [BmcSim(tmp_path).start() for _ in NODES]
    servers = [Server(n, tmp_path, cd, b) for n, b in zip(NODES, bmcs, strict=True)]
    stop_flap = asyncio.Event()
    flapper = None
    try:
        for i, s in enumerate(servers):
            s.bmc.add_alarm(BMC_ALARM, "Memory", i)
            await asyncio.gather(s.start_deviced(), s.start_noded())
            await asyncio.to_thread(s.hw.inject, 1, HBM)
            await asyncio.to_thread(s.hw.inject, 2, AIC)
        await eventually(lambda: len(stable_view(cd)["faults"]) == 9, what="9 stable faults in clusterd")
        await eventually(lambda: settled(cd, servers), what="a settled cluster")
        await eventually(
            lambda: all(
                sum(st["health"] != "Healthy" for st in cd.nodes.get(n).devices.values()) == 2 for n in NODES
            ),
            what="chips 1 and 2 UnHealthy on every node",
        )
        before = stable_view(cd)
        assert set(before["nodes"].values()) == {"UnHealthy"}
        assert {lv for lv, _ in before["faults"].values()} == {
            "RestartNPU",
            "RestartRequest",
            "PreSeparateFault",
        }
        keys = set(before["faults"])
        flips = [0]
        flapper = asyncio.create_task(flap(servers, stop_flap, flips))

        async def flapped_meanwhile() -> None:  # the faults flap across every restart step
            n = flips[0]
            await eventually(lambda: flips[0] >= n + 2, what="two more flips")

        async with ChangeWatch(cd, lambda: keys) as watch:
            for s in servers:  # maxUnavailable 1
                for stop_one, start_one in (
                    (lambda s=s: s.deviced.stop(), s.start_deviced),
                    (lambda s=s: s.noded.stop(), s.start_noded),
                ):
                    await stop_one()
                    await flapped_meanwhile()  # while the agent is down
                    await start_one()
                    await eventually(lambda s=s: not cd.nodes.get(s.name).pending, what="pending cleared")
            await asyncio.gather(*(s.stop() for s in servers))  # all at once
            await flapped_meanwhile()
            await asyncio.gather(*(x for s in servers for x in (s.start_deviced(), s.start_noded())))
            await eventually(lambda: not any(cd.nodes.get(s.name).pending for s in servers), what="current")
            await flapped_meanwhile()
            stop_flap.set()
            await flapper
            await eventually(lambda: settled(cd, servers), what="flapping faults recovered", timeout_s=30)
        assert flips[0] >= 16
        flapped = [c for c in watch.changes if c.fault.code == FLAP_BMC]
        assert flapped, "clusterd saw no flapping fault"
        assert [c for c in watch.changes if c.fault.key in keys] == []  # no recover, occur or level change
        assert watch.gaps == [] and watch.samples > 20
        assert stable_view(cd) == before
        for s in servers:  # history: one occur per stable fault, nothing else
            for code in (f"{HBM:08X}", f"{AIC:08X}", BMC_ALARM):
                kinds = [e["kind"] for e in await cd.store.query_events(s.name, code, 0, 100)]
                assert kinds == ["occur"], (s.name, code, kinds)
            assert all(not d.reasons for d in s.deviced.engine.devices.values())
        assert not [f for f in cd.center.faults() if "upgrade" in f.attributes]
    finally:
        stop_flap.set()
        if flapper is not None:
            await asyncio.wait([flapper], timeout=10)
        for s in servers:
            await s.stop()
        for b in bmcs:
            b.stop()
        await cd.stop()
