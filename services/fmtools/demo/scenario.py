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
import importlib.util
import json
import time

from fmtools.demo.harness import JOB, PLACEMENT, SLOW_RANK, Harness, Timing
from fmtools.demo.report import MISSING, NOT_AVAILABLE, RIGHT, WRONG, Clock, Row
from fmtools.demo.stack import Stack, StackError
from fmtools.demo.watch import FaultWatcher


class Scenario:
    """Runs the steps against ``stack`` through its :class:`Harness` ``h`` (the CLI, the job,
    clusterd's views and waits); ``rows`` collects one :class:`Row` per expected detection."""

    def __init__(self, stack: Stack, clock: Clock, timing: Timing) -> None:
        self.h = Harness(stack, clock, timing)
        self.stack = stack
        self.say = clock.say
        self.t = timing

    @property
    def rows(self) -> list[Row]:
        """The summary rows in scenario order (filled as the steps run)."""
        return self.h.rows

    async def step_bmc_alarm(self) -> None:
        """iBMC alarm on server 2: OEM alarm 0800004B on PCIe Card 3, read by noded over IPMI.

        The card, not memory (the demo called it "Memory 3" before issue 31): no reference fact
        names the part behind 0800004B, and faultmesh decodes its top byte 0x08 with the iBMC
        device-type table as a PCIe card (docs/fault-tables.md), so the alarm's record names the
        same part and the demo's words match what ``faultmesh faults`` / ``explain`` show."""
        s = self.stack.server(2)
        row = self.h.row(f"iBMC alarm 0800004B (PCIe card), {s.name} PCIe Card 3")
        self.say(
            f"STEP iBMC alarm on {s.name}: bmc-sim gets Huawei OEM alarm 0800004B on PCIe Card 3 "
            f"(same as: faultmesh bmc-sim inject --control {s.bmc_control} --code 0800004B "
            "--device-type 'PCIe Card' --device-id 3)"
        )
        row.injected = time.time()
        await self.stack.post_json(
            f"http://{s.bmc_control}/alarms",
            {"code": "0800004B", "device_type": "PCIe Card", "device_id": 3, "severity": 2},
        )
        f = await self.h.detect(
            row, lambda f: f["node"] == s.name and f["code"] == "0800004B", f"0800004B on {s.name}"
        )
        if f is None:
            return
        health = await self.h.node_health(s.name)
        row.decided = f"{f['level']}; {s.name} {health}"
        ok = f["device_type"].lower() == "pcie card" and int(f["device_id"]) == 3
        ok = ok and f["level"] == "PreSeparateFault" and health == "SubHealthy"
        row.verdict = RIGHT if ok else WRONG
        if not ok:
            row.note = (
                f"expected PCIe Card 3, PreSeparateFault, node SubHealthy; got {_brief(f)}, node {health}"
            )

    async def _sim_chip_fault(self, s, row, dev: int, code: str, kind: str, level: str) -> bool:
        """Raise ``code`` on chip ``dev`` of server ``s`` through its deviced's sim API and judge
        clusterd's view: that chip, ``level``, the node UnHealthy. Returns True when clusterd showed it."""
        row.injected = time.time()
        try:
            await self.stack.post_json(
                f"http://{s.deviced_http}/sim/fault", {"device": dev, "code": code, "assertion": "occur"}
            )
        except StackError as e:
            row.verdict, row.note = NOT_AVAILABLE, f"deviced sim control API: {e}"
            return False
        f = await self.h.detect(
            row, lambda f: f["node"] == s.name and f["code"].upper() == code, f"{code} on {s.name}"
        )
        if f is None:
            return False
        health = await self.h.node_health(s.name)
        row.decided = f"{f['level']}; {s.name} {health}"
        ok = int(f["device_id"]) == dev and f["level"] == level and health == "UnHealthy"
        row.verdict = RIGHT if ok else WRONG
        if not ok:
            row.note = f"expected {kind} {dev} {level}, node UnHealthy; got {_brief(f)}, node {health}"
        return True

    async def step_npu_fault(self) -> None:
        """RestartNPU-level chip fault 80E18008 on server 1 NPU 0, through deviced's sim backend."""
        s = self.stack.server(1)
        dev = 0
        row = self.h.row(f"NPU fault 80E18008 (RestartNPU), {s.name} NPU {dev}")
        self.say(
            f"STEP NPU fault on {s.name}: the DCMI sim raises 80E18008 on NPU {dev} "
            f"(same as: faultmesh device-sim --sim {s.deviced_http} fault {dev} 80E18008)"
        )
        if not await self._sim_chip_fault(s, row, dev, "80E18008", "NPU", "RestartNPU"):
            return
        if self.h.trainsim is None:
            return
        # rank 0 of the job runs on this NPU: clusterd must decide a recovery and the job recover
        got = await self.h.wait_decision(
            row.injected or 0.0,
            ("recover-success", "retry-success", "dump", "exit-completed", "kill-job"),
            60,
        )
        chain = " -> ".join(d["decision"] for d in got) or "no decision"
        for d in got:
            self.say(f"clusterd recovery decision for {JOB}: {d['decision']} ({d.get('reason', '')})")
        row.decided += f"; job {JOB} rank 0: {chain}"
        if not any(d["decision"] in ("recover-success", "retry-success") for d in got):
            row.verdict = WRONG
            row.note = (
                row.note + "; " if row.note else ""
            ) + f"expected the job to recover from rank 0's fault, got {chain}"

    async def step_gpu_xid(self) -> None:
        """XID 79 (GPU fallen off the bus) on GPU 3 of the simulated NVIDIA GPU server (issue 33): its
        deviced uses the NVIDIA fault table, so clusterd holds 4E560000004F at SeparateNPU beside the
        NPU faults."""
        s = next((s for s in self.stack.servers if s.gpu), None)
        dev, code = 3, "4E560000004F"
        row = self.h.row(f"GPU XID 79 (SeparateNPU), {s.name if s else 'gpu-server-1'} GPU {dev}")
        if s is None:
            row.verdict, row.note = NOT_AVAILABLE, "no GPU server in this stack (--gpu-servers 0)"
            return
        self.say(
            f"STEP GPU fault on {s.name}: the simulated GPU raises XID 79 on GPU {dev} "
            f"(same as: faultmesh device-sim --sim {s.deviced_http} fault {dev} {code}; "
            "faultmesh explain xid 79)"
        )
        await self._sim_chip_fault(s, row, dev, code, "GPU", "SeparateNPU")

    async def step_link_down(self) -> None:
        """A link down on server 3 NPU 4 for ``link_down_s``: NotHandleFault at once, PreSeparateNPU
        after ``link_escalate_s`` down, cleared ``link_recover_s`` after the link is up again."""
        s = self.stack.server(3)
        dev = 4
        t = self.t
        r_occ = self.h.row(f"NPU link down 81078603, {s.name} NPU {dev}")
        r_esc = self.h.row(f"link still down after {t.link_escalate_s:.0f} s (escalation)")
        r_rec = self.h.row(f"link up again after {t.link_down_s:.0f} s (recovery)")

        def match(f):
            return f["node"] == s.name and f["code"].upper() == "81078603" and int(f["device_id"]) == dev

        self.say(
            f"STEP link down on {s.name} NPU {dev} for {t.link_down_s:.0f} s "
            f"(same as: faultmesh device-sim --sim {s.deviced_http} link {dev} down)"
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
            f = await self.h.detect(r_occ, match, f"81078603 on {s.name} NPU {dev}")
            if f is not None:
                r_occ.decided = f"{f['level']}; {s.name} {await self.h.node_health(s.name)}"
                r_occ.verdict = RIGHT if f["level"] == "NotHandleFault" else WRONG
                if r_occ.verdict == WRONG:
                    r_occ.note = (
                        f"expected NotHandleFault in the first {t.link_escalate_s:.0f} s, got {f['level']}"
                    )
            f = await self.h.detect(
                r_esc,
                lambda f: match(f) and f["level"] == "PreSeparateNPU",
                f"81078603 escalated to PreSeparateNPU on {s.name}",
                timeout_s=t.link_escalate_s + t.detect_timeout_s,
            )
            if f is not None:
                lat = r_esc.latency or 0.0
                health = await self.h.node_health(s.name)
                r_esc.decided = f"{f['level']}; {s.name} {health}"
                early = lat < t.link_escalate_s - 0.5
                r_esc.verdict = WRONG if early or health != "SubHealthy" else RIGHT
                if early:
                    r_esc.note = f"escalated after {lat:.1f} s, before the {t.link_escalate_s:.0f} s rule"
                elif health != "SubHealthy":
                    r_esc.note = f"expected node SubHealthy (PreSeparateNPU), got {health}"
            up_at = await up_task
            r_rec.injected = up_at
            assert self.h.watcher is not None
            gone = await self.h.watcher.wait_gone(match, t.link_recover_s + t.detect_timeout_s)
            if gone is None:
                r_rec.verdict = MISSING
                r_rec.note = (
                    f"81078603 still active {t.link_recover_s + t.detect_timeout_s:.0f} s after link up"
                )
                self.say(f"MISSING: recovery of the link on {s.name} NPU {dev}")
                return
            r_rec.detected = gone
            lat = gone - up_at
            health = await self.h.node_health(s.name)
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
        self.say(
            f"STEP link up again on {s.name} NPU {dev} after {self.t.link_down_s:.0f} s down (device-sim link {dev} up)"
        )
        await self.stack.post_json(f"http://{s.deviced_http}/sim/link", {"device": dev, "state": "up"})
        return time.time()

    async def step_public_fault(self) -> None:
        """A public fault sent with the CLI (PubFault): 020001001 (SeparateNPU) on server 4 NPU 5."""
        s = self.stack.server(4)
        row = self.h.row(f"public fault 020001001 via CLI, {s.name} NPU 5")
        self.say(f"STEP public fault via the CLI for {s.name} NPU 5")
        row.injected = time.time()
        rc, out = await self.h.cli(
            "pubfault", "send", *self.h.server_flags(), "--resource", "CCAE", "--code", "020001001",
            "--node", s.name, "--devices", "5", "--type", "NPU", "--description", "demo: HBM fault reported by CCAE",
        )  # fmt: skip
        if rc != 0:
            row.verdict, row.note = WRONG, f"faultmesh pubfault send failed ({rc}): {out[-200:]}"
            return
        f = await self.h.detect(
            row, lambda f: f["node"] == s.name and f["code"] == "020001001", f"020001001 on {s.name}"
        )
        if f is None:
            return
        health = await self.h.node_health(s.name)
        row.decided = f"{f['level']}; {s.name} {health}"
        ok = int(f["device_id"]) == 5 and f["level"] == "SeparateNPU" and health == "UnHealthy"
        row.verdict = RIGHT if ok else WRONG
        if not ok:
            row.note = f"expected NPU 5 SeparateNPU, node UnHealthy; got {_brief(f)}, node {health}"

    async def step_lossy_link(self) -> None:
        """A lossy HCCS link (30 % loss, both directions) between server 2 NPU 1 and NPU 6 in the
        fabric simulator: pingmesh on every noded measures it, clusterd's slow-network analysis must
        raise 200001010 (slow network inside a node) localized to that NPU-to-NPU link."""
        st = self.stack
        s = st.server(2)
        a, b = 1, 6
        row = self.h.row(f"lossy HCCS link {s.name} NPU {a} <-> NPU {b} (30% loss)")
        if st.fabric_file is None:
            row.verdict, row.note = (
                NOT_AVAILABLE,
                "pingmesh / slow-network flags not offered by clusterd or noded",
            )
            self.say(f"NOT AVAILABLE: {row.fault}: {row.note}")
            return
        period = st.pingmesh_period()
        # the analysis needs a clean baseline first (3 periods by default) before a path can be faulty
        warm_until = st.started_at + 4.5 * period
        if time.time() < warm_until:
            self.say(f"pingmesh baseline: waiting {warm_until - time.time():.0f} s before the HCCS fault")
            await asyncio.sleep(warm_until - time.time())
        self.say(
            f"STEP lossy HCCS link {s.name} NPU {a} <-> NPU {b} in the fabric simulator (period {period:g} s)"
        )
        row.injected = time.time()
        rc, out = await self.h.run_cmd(
            "fmtools.sims.fabric", "inject", str(st.fabric_file), "lossy_link",
            "--a", f"{s.name}/{a}", "--b", f"{s.name}/{b}", "--loss", "0.3",
        )  # fmt: skip
        if rc != 0:
            row.verdict, row.note = WRONG, f"fabric inject failed ({rc}): {out[-200:]}"
            return
        f = await self.h.detect(
            row,
            lambda f: f["node"] == s.name and f["source"] == "slownet" and f["code"] == "200001010",
            f"200001010 on {s.name}",
            timeout_s=4 * period + 15,
        )
        if f is None:
            return
        where = str(f.get("attributes", {}).get("description", ""))
        ends = _link_ends(f)
        row.decided = f"{f['code']} {f['level']}: {where or ends}"
        ok = ends == {(s.name, a), (s.name, b)}
        row.verdict = RIGHT if ok else WRONG
        if not ok:
            row.note = f"expected the link {s.name}/{a} <-> {s.name}/{b}; clusterd localized {where or ends}"

    async def step_stress_and_nic(self) -> None:
        """An online stress test (AIC + P2P) on the job's ranks of server 4, then a NIC switch of
        those two NPUs, both answered by ``faultmesh trainsim``; clusterd pauses and resumes the job."""
        st = self.stack
        s = st.server(4)
        r_st = self.h.row(f"online stress test (AIC, P2P) on {s.name}, job ranks 2,3")
        r_nic = self.h.row(f"NIC switch of {s.name} NPU 0,1 (ranks 2,3)")
        await self.h.job_ready.wait()
        if self.h.trainsim is None:
            for r in (r_st, r_nic):
                r.verdict, r.note = NOT_AVAILABLE, self.h.job_error or "trainsim not started"
            return
        if not await self.h.wait_idle(90):
            for r in (r_st, r_nic):
                r.verdict, r.note = WRONG, "the job's recovery flow never finished"
            return
        self.say(f"STEP stress test on {s.name} (ops AIC, P2P) with the operator CLI")
        r_st.injected = time.time()
        ok, msg = await self.h.om_cli("stress-test", "--job", JOB, "--ops", "aic,p2p", "--node", s.name)
        r_st.detected = time.time()
        got = await self.h.wait_decision(
            r_st.injected, ("stress-test-success", "isolate-node", "stop-train"), 30
        )
        chain = " -> ".join(d["decision"] for d in got) or "no decision"
        r_st.decided = f"{_stress_brief(msg)}; {chain}"
        r_st.verdict = (
            RIGHT if ok and msg.startswith("stress test finish") and "stress-test-success" in chain else WRONG
        )
        self.say(f"stress test: {_stress_brief(msg)} (decisions: {chain})")
        await self.h.wait_idle(60)
        self.say(f"STEP NIC switch on {s.name} NPU 0,1 with the operator CLI")
        r_nic.injected = time.time()
        ok, msg = await self.h.om_cli(
            "switch-nic", "--job", JOB, "--nic", f"{s.name}:0=on", "--nic", f"{s.name}:1=on"
        )
        r_nic.detected = time.time()
        got = await self.h.wait_decision(r_nic.injected, ("switch-nic-success", "stop-train", "kill-job"), 30)
        chain = " -> ".join(d["decision"] for d in got) or "no decision"
        r_nic.decided = f"{msg[:40]}; {chain}"
        r_nic.verdict = (
            RIGHT if ok and msg == "switch nic finish" and "switch-nic-success" in chain else WRONG
        )
        self.say(f"NIC switch: {msg} (decisions: {chain})")
        for r in (r_st, r_nic):
            if r.verdict == WRONG and not r.note:
                r.note = f"clusterd answered: {r.decided}"

    async def step_slow_rank(self) -> None:
        """Rank 2 of the real PyTorch job slowed by 40 % of its compute; FD-OL (noded node part,
        clusterd cluster part) must confirm rank 2, and only rank 2, as the slow rank: log
        ``got degradation, slow rank ids: [2]`` and raise 110001010 on the server hosting it."""
        st = self.stack
        srv = st.server(PLACEMENT[SLOW_RANK][0])
        row = self.h.row(f"rank {SLOW_RANK} slowed by 40% ({self.t.slow_mode}), {srv.name}")
        await self.h.job_ready.wait()
        why = ""
        if not st.features.get("slownode") or not st.features.get("brain"):
            why = "FD-OL slow-node flags not offered by clusterd/noded"
        elif importlib.util.find_spec("torch") is None:
            why = "torch is not installed: pip install -e '.[torch]' (torch==2.13.0, CPU)"
        if why:
            row.verdict, row.note = NOT_AVAILABLE, why
            self.say(f"NOT AVAILABLE: {row.fault}: {row.note}")
            return
        if not await self.h.wait_training():
            row.verdict, row.note = (
                WRONG,
                f"the PyTorch job did not start; see {self.h.train.log_path if self.h.train else ''}",
            )
            return
        self.say(f"FD-OL baseline: {self.t.slow_after_steps} clean steps before rank {SLOW_RANK} is slowed")
        if not await self.h.wait_step(self.t.slow_after_steps, 180):
            row.verdict, row.note = WRONG, f"the PyTorch job did not reach step {self.t.slow_after_steps}"
            return
        self.say(f"STEP slow rank {SLOW_RANK} of the PyTorch job by 40% of its compute ({self.t.slow_mode})")
        row.injected = time.time()
        (st.run_dir / "slow-rank").write_text("1\n")

        def match(f):
            return f["source"] == "fd-online" and f["code"] == "110001010"

        f = await self.h.detect(row, match, "slow node 110001010", timeout_s=90)
        if f is None:
            return
        await asyncio.sleep(2 * self.t.slownode_round_s)  # every node's fault of this confirmation
        assert self.h.watcher is not None
        found = self.h.watcher.current(match)
        flagged = sorted(
            (x["node"], str(x.get("attributes", {}).get("influence", "")).replace(" ", ",")) for x in found
        )
        text = (st.log_dir / "clusterd.log").read_text(errors="replace")
        phrase = [
            ln[ln.find("[FD-OL") :] for ln in text.splitlines() if "got degradation, slow rank ids" in ln
        ]
        for ln in phrase:
            self.say("clusterd log: " + ln[:200])
        row.decided = f"{f['code']} {f['level']} " + ", ".join(f"on {n} ranks [{r}]" for n, r in flagged)
        ok = flagged == [(srv.name, str(SLOW_RANK))]
        ok = ok and bool(phrase) and all(ln.endswith(f"slow rank ids: [{SLOW_RANK}]") for ln in phrase)
        row.verdict = RIGHT if ok else WRONG
        if not ok:
            row.note = (
                f"expected only rank {SLOW_RANK} on {srv.name}; clusterd flagged {flagged}, log {phrase}"
            )

    async def run(self) -> list[Row]:
        """Run every step (concurrently, at fixed offsets); returns the rows in scenario order."""
        assert self.stack.session is not None
        self.h.watcher = FaultWatcher(self.stack.session, self.stack.http)
        self.h.watcher.start()
        try:
            try:
                await self.h.setup_job()
            except Exception as e:  # noqa: BLE001 - the job's rows then say why
                self.h.job_error = self.h.job_error or f"job setup failed: {e!r}"
                self.say(self.h.job_error)
                self.h.job_ready.set()
            plan = [
                (0.0, self.step_bmc_alarm),
                (2.0, self.step_npu_fault),
                (3.0, self.step_gpu_xid),
                (4.0, self.step_link_down),
                (6.0, self.step_public_fault),
                (8.0, self.step_lossy_link),
                (10.0, self.step_stress_and_nic),
                (12.0, self.step_slow_rank),
            ]
            order: dict[str, int] = {}
            tasks = []
            for i, (offset, fn) in enumerate(plan):
                order[fn.__name__] = i
                tasks.append(
                    asyncio.get_running_loop().create_task(self.h.step_at(offset, fn), name=fn.__name__)
                )
            await asyncio.gather(*tasks)
            self.say("what clusterd holds now:")
            await self.h.cli("nodes", "--http", self.stack.http)
            await self.h.cli("faults", "--http", self.stack.http)
            await self.h.stop_job()
            achieved = self.h.achieved_slowdown()
            if achieved:
                self.say(achieved)
                for r in self.h.rows:
                    if r.fault.startswith(f"rank {SLOW_RANK} slowed"):
                        r.note = (r.note + "; " if r.note else "") + achieved
        finally:
            await self.h.watcher.stop()
        return self.h.rows


def _link_ends(f: dict) -> set[tuple[str, int]]:
    """The NPU ends named by a slow-network fault's alarms (attribute ``alarms``, JSON list)."""
    ends: set[tuple[str, int]] = set()
    try:
        alarms = json.loads(f.get("attributes", {}).get("alarms", "[]"))
    except ValueError:
        return ends
    for al in alarms if isinstance(alarms, list) else []:
        if al.get("kind") != "link":
            continue
        ends.add((str(al.get("node")), int(al.get("phyId"))))
        ends.add((str(al.get("peerNode")), int(al.get("peerPhyId"))))
    return ends


def _stress_brief(msg: str) -> str:
    """``stress test finish, result:{...}`` -> ``stress test finish: N op results, codes [...]``."""
    from fmtools.cli.stress_test import result_rows

    head, rows = result_rows(msg)
    if not rows:
        return msg[:60]
    return f"{head}: {len(rows)} op results, codes {sorted({r[3] for r in rows})}"


def _brief(f: dict) -> str:
    return f"{f.get('node')} {f.get('device_type')} {f.get('device_id')} {f.get('code')} {f.get('level')}"


__all__ = ["Scenario", "Timing", "MISSING"]
