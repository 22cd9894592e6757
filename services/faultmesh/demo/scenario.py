"""The demo scenario: each step injects one fault into the running stack, waits for clusterd to show
it, and judges what clusterd made of it (node, device, code, level; the decision where there is
one). Steps run as concurrent tasks started at fixed offsets, so long ones (the 25 s link down and
its recovery, the slow rank) overlap the short ones and the whole run stays within a few minutes.

Facts used for the expected results: deviced's default faultCode.json (80E18008 = RestartNPU,
81078603 = NotHandleFault) and faultCustomization.json (81078603: PreSeparateNPU after 20 s down,
cleared 60 s after it recovers), noded's NodeDConfiguration.json (0800004B = PreSeparateFault),
clusterd's publicFaultConfiguration.json (020001001 = SeparateNPU, sender CCAE), the health mapping
of reference clusterd.md §2.4 (NotHandleFault -> Healthy; SubHealthFault, PreSeparateFault,
PreSeparateNPU -> SubHealthy; RestartNPU, SeparateNPU, ... -> UnHealthy).
"""

from __future__ import annotations

import asyncio
import shlex
import sys
import time
from dataclasses import dataclass

from faultmesh.demo.report import MISSING, NOT_AVAILABLE, RIGHT, WRONG, Clock, Row
from faultmesh.demo.stack import Stack, StackError
from faultmesh.demo.watch import FaultWatcher


@dataclass
class Timing:
    """The scenario's intervals (s). Defaults are the real rules; CI passes shorter ones by flag.

    ``detect_timeout_s``: how long a step waits for clusterd to show a fault;
    ``link_down_s``: how long the link stays down; ``link_escalate_s``: deviced's FaultTimeout for
    81078603 (the escalation to PreSeparateNPU); ``link_recover_s``: its RecoverTimeout (the fault
    clears this long after the link is up again).
    """

    detect_timeout_s: float = 30.0
    link_down_s: float = 25.0
    link_escalate_s: float = 20.0
    link_recover_s: float = 60.0


class Scenario:
    """Runs the steps against ``stack``; ``rows`` collects one :class:`Row` per expected detection."""

    def __init__(self, stack: Stack, clock: Clock, timing: Timing) -> None:
        self.stack = stack
        self.clock = clock
        self.say = clock.say
        self.t = timing
        self.rows: list[Row] = []
        self.watcher: FaultWatcher | None = None

    # -- helpers -------------------------------------------------------------------------------
    def row(self, fault: str) -> Row:
        """A new summary row, kept in scenario order."""
        r = Row(fault)
        self.rows.append(r)
        return r

    async def node_health(self, node: str) -> str:
        """``<health>`` of ``node`` from clusterd's node view (empty on error)."""
        try:
            view = await self.stack.clusterd_json(f"/v1/nodes/{node}")
            return str(view.get("health", ""))
        except (StackError, OSError, TimeoutError, ValueError):
            return ""

    async def cli(self, *args: str, timeout_s: float = 30.0) -> tuple[int, str]:
        """Run ``faultmesh <args>`` against this stack (``--http/--grpc`` added by the caller);
        returns (exit status, output). The command line is printed first."""
        argv = [sys.executable, "-m", "faultmesh", *args]
        self.say("$ faultmesh " + " ".join(shlex.quote(a) for a in args))
        p = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        try:
            out, _ = await asyncio.wait_for(p.communicate(), timeout_s)
        except TimeoutError:
            p.kill()
            await p.wait()
            return 124, f"timed out after {timeout_s:.0f} s"
        text = out.decode(errors="replace").rstrip()
        for line in text.splitlines():
            self.say("    " + line)
        return p.returncode or 0, text

    def server_flags(self) -> list[str]:
        """``--http`` and ``--grpc`` of this stack's clusterd, for CLI calls."""
        return ["--http", self.stack.http, "--grpc", self.stack.grpc]

    async def detect(self, row: Row, pred, what: str, timeout_s: float | None = None) -> dict | None:
        """Wait for a fault matching ``pred``; fill ``row.detected`` and return the fault (None and
        ``row.verdict = missing`` when it never shows)."""
        assert self.watcher is not None
        got = await self.watcher.wait_for(pred, timeout_s or self.t.detect_timeout_s)
        if got is None:
            row.verdict = MISSING
            row.note = f"clusterd never showed {what} within {timeout_s or self.t.detect_timeout_s:.0f} s"
            self.say(f"MISSING: {what}")
            return None
        fault, t = got
        row.detected = t
        self.say(
            f"clusterd shows {fault['code']} on {fault['node']} {fault['device_type']} {fault['device_id']}"
            f" level {fault['level']} (source {fault['source']}), {t - (row.injected or t):.1f} s after injection"
        )
        return fault

    # -- steps ---------------------------------------------------------------------------------
    async def step_bmc_memory(self) -> None:
        """iBMC memory alarm on server 2: OEM alarm 0800004B on Memory 3, read by noded over IPMI."""
        s = self.stack.server(2)
        row = self.row(f"iBMC memory alarm 0800004B, {s.name} Memory 3")
        self.say(
            f"STEP iBMC memory alarm on {s.name}: bmc-sim gets Huawei OEM alarm 0800004B on Memory 3 "
            f"(same as: faultmesh bmc-sim inject --control {s.bmc_control} --code 0800004B "
            "--device-type Memory --device-id 3)"
        )
        row.injected = time.time()
        await self.stack.post_json(
            f"http://{s.bmc_control}/alarms",
            {"code": "0800004B", "device_type": "Memory", "device_id": 3, "severity": 2},
        )
        f = await self.detect(
            row, lambda f: f["node"] == s.name and f["code"] == "0800004B", f"0800004B on {s.name}"
        )
        if f is None:
            return
        health = await self.node_health(s.name)
        row.decided = f"{f['level']}; {s.name} {health}"
        ok = f["device_type"].lower() == "memory" and int(f["device_id"]) == 3
        ok = ok and f["level"] == "PreSeparateFault" and health == "SubHealthy"
        row.verdict = RIGHT if ok else WRONG
        if not ok:
            row.note = f"expected Memory 3, PreSeparateFault, node SubHealthy; got {_brief(f)}, node {health}"

    async def step_npu_fault(self) -> None:
        """RestartNPU-level chip fault 80E18008 on server 1 NPU 0, through deviced's sim backend."""
        s = self.stack.server(1)
        dev = 0
        row = self.row(f"NPU fault 80E18008 (RestartNPU), {s.name} NPU {dev}")
        self.say(
            f"STEP NPU fault on {s.name}: DCMI sim raises 80E18008 on NPU {dev} (POST {s.deviced_http}/sim/fault)"
        )
        row.injected = time.time()
        try:
            await self.stack.post_json(
                f"http://{s.deviced_http}/sim/fault",
                {"device": dev, "code": "80E18008", "assertion": "occur"},
            )
        except StackError as e:
            row.verdict, row.note = NOT_AVAILABLE, f"deviced sim control API: {e}"
            return
        f = await self.detect(
            row,
            lambda f: f["node"] == s.name and f["code"].upper() == "80E18008",
            f"80E18008 on {s.name}",
        )
        if f is None:
            return
        health = await self.node_health(s.name)
        row.decided = f"{f['level']}; {s.name} {health}"
        ok = int(f["device_id"]) == dev and f["level"] == "RestartNPU" and health == "UnHealthy"
        row.verdict = RIGHT if ok else WRONG
        if not ok:
            row.note = f"expected NPU {dev} RestartNPU, node UnHealthy; got {_brief(f)}, node {health}"

    async def step_link_down(self) -> None:
        """A link down on server 3 NPU 4 for ``link_down_s``: NotHandleFault at once, PreSeparateNPU
        after ``link_escalate_s`` down, cleared ``link_recover_s`` after the link is up again."""
        s = self.stack.server(3)
        dev = 4
        t = self.t
        r_occ = self.row(f"NPU link down 81078603, {s.name} NPU {dev}")
        r_esc = self.row(f"link still down after {t.link_escalate_s:.0f} s (escalation)")
        r_rec = self.row(f"link up again after {t.link_down_s:.0f} s (recovery)")

        def match(f):
            return f["node"] == s.name and f["code"].upper() == "81078603" and int(f["device_id"]) == dev

        self.say(
            f"STEP link down on {s.name} NPU {dev} for {t.link_down_s:.0f} s (POST {s.deviced_http}/sim/link)"
        )
        down_at = time.time()
        r_occ.injected = r_esc.injected = down_at
        try:
            await self.stack.post_json(f"http://{s.deviced_http}/sim/link", {"device": dev, "state": "down"})
        except StackError as e:
            for r in (r_occ, r_esc, r_rec):
                r.verdict, r.note = NOT_AVAILABLE, f"deviced sim control API: {e}"
            return
        up_task = asyncio.get_running_loop().create_task(self._link_up_later(s, dev, down_at + t.link_down_s))
        try:
            f = await self.detect(r_occ, match, f"81078603 on {s.name} NPU {dev}")
            if f is not None:
                r_occ.decided = f"{f['level']}; {s.name} {await self.node_health(s.name)}"
                r_occ.verdict = RIGHT if f["level"] == "NotHandleFault" else WRONG
                if r_occ.verdict == WRONG:
                    r_occ.note = (
                        f"expected NotHandleFault in the first {t.link_escalate_s:.0f} s, got {f['level']}"
                    )
            f = await self.detect(
                r_esc,
                lambda f: match(f) and f["level"] == "PreSeparateNPU",
                f"81078603 escalated to PreSeparateNPU on {s.name}",
                timeout_s=t.link_escalate_s + t.detect_timeout_s,
            )
            if f is not None:
                lat = r_esc.latency or 0.0
                health = await self.node_health(s.name)
                r_esc.decided = f"{f['level']}; {s.name} {health}"
                early = lat < t.link_escalate_s - 0.5
                r_esc.verdict = WRONG if early or health != "SubHealthy" else RIGHT
                if early:
                    r_esc.note = f"escalated after {lat:.1f} s, before the {t.link_escalate_s:.0f} s rule"
                elif health != "SubHealthy":
                    r_esc.note = f"expected node SubHealthy (PreSeparateNPU), got {health}"
            up_at = await up_task
            r_rec.injected = up_at
            assert self.watcher is not None
            gone = await self.watcher.wait_gone(match, t.link_recover_s + t.detect_timeout_s)
            if gone is None:
                r_rec.verdict = MISSING
                r_rec.note = (
                    f"81078603 still active {t.link_recover_s + t.detect_timeout_s:.0f} s after link up"
                )
                self.say(f"MISSING: recovery of the link on {s.name} NPU {dev}")
                return
            r_rec.detected = gone
            lat = gone - up_at
            health = await self.node_health(s.name)
            r_rec.decided = f"cleared; {s.name} {health}"
            self.say(f"clusterd cleared 81078603 on {s.name} NPU {dev}, {lat:.1f} s after link up")
            early = lat < t.link_recover_s - 1.0
            r_rec.verdict = WRONG if early else RIGHT
            if early:
                r_rec.note = (
                    f"cleared {lat:.1f} s after link up, before the {t.link_recover_s:.0f} s recover rule"
                )
        finally:
            if not up_task.done():
                up_task.cancel()

    async def _link_up_later(self, s, dev: int, at: float) -> float:
        await asyncio.sleep(max(0.0, at - time.time()))
        self.say(f"STEP link up again on {s.name} NPU {dev} (after {self.t.link_down_s:.0f} s down)")
        await self.stack.post_json(f"http://{s.deviced_http}/sim/link", {"device": dev, "state": "up"})
        return time.time()

    async def step_public_fault(self) -> None:
        """A public fault sent with the CLI (PubFault): 020001001 (SeparateNPU) on server 4 NPU 5."""
        s = self.stack.server(4)
        row = self.row(f"public fault 020001001 via CLI, {s.name} NPU 5")
        self.say(f"STEP public fault via the CLI for {s.name} NPU 5")
        row.injected = time.time()
        rc, out = await self.cli(
            "pubfault", "send", *self.server_flags(), "--resource", "CCAE", "--code", "020001001",
            "--node", s.name, "--devices", "5", "--type", "NPU", "--description", "demo: HBM fault reported by CCAE",
        )  # fmt: skip
        if rc != 0:
            row.verdict, row.note = WRONG, f"faultmesh pubfault send failed ({rc}): {out[-200:]}"
            return
        f = await self.detect(
            row, lambda f: f["node"] == s.name and f["code"] == "020001001", f"020001001 on {s.name}"
        )
        if f is None:
            return
        health = await self.node_health(s.name)
        row.decided = f"{f['level']}; {s.name} {health}"
        ok = int(f["device_id"]) == 5 and f["level"] == "SeparateNPU" and health == "UnHealthy"
        row.verdict = RIGHT if ok else WRONG
        if not ok:
            row.note = f"expected NPU 5 SeparateNPU, node UnHealthy; got {_brief(f)}, node {health}"

    def not_available(self, fault: str, why: str) -> None:
        """A row for a part that is not installed: shown as ``not available`` (a failure)."""
        r = self.row(fault)
        r.verdict, r.note = NOT_AVAILABLE, why
        self.say(f"NOT AVAILABLE: {fault}: {why}")

    # -- the whole run -------------------------------------------------------------------------
    async def run(self) -> list[Row]:
        """Run every step (concurrently, at fixed offsets); returns the rows in scenario order."""
        assert self.stack.session is not None
        self.watcher = FaultWatcher(self.stack.session, self.stack.http)
        self.watcher.start()
        try:
            plan = [
                (0.0, self.step_bmc_memory),
                (2.0, self.step_npu_fault),
                (4.0, self.step_link_down),
                (6.0, self.step_public_fault),
            ]
            order: dict[str, int] = {}
            tasks = []
            for i, (offset, fn) in enumerate(plan):
                order[fn.__name__] = i
                tasks.append(asyncio.get_running_loop().create_task(self._at(offset, fn), name=fn.__name__))
            await asyncio.gather(*tasks)
            self.not_available("lossy HCCS link between two NPUs (pingmesh)", "slow-network part not landed")
            self.not_available("stress test + NIC switch via faultmesh trainsim", "brain part not landed")
            self.not_available("rank 2 slowed by 40% (FD-OL slow node)", "slow-node part not landed")
        finally:
            await self.watcher.stop()
        return self.rows

    async def _at(self, offset: float, fn) -> None:
        await asyncio.sleep(offset)
        try:
            await fn()
        except (StackError, OSError) as e:
            r = self.row(f"{fn.__name__}")
            r.verdict, r.note = WRONG, f"step failed: {e}"
            self.say(f"step {fn.__name__} failed: {e}")


def _brief(f: dict) -> str:
    return f"{f.get('node')} {f.get('device_type')} {f.get('device_id')} {f.get('code')} {f.get('level')}"


__all__ = ["Scenario", "Timing", "MISSING"]
