"""The demo's harness: the running stack's CLI, the example job, clusterd's views and waits, and
the result rows. The steps themselves (which fault, what clusterd must show) are
:class:`fmtools.demo.scenario.Scenario`, which holds a :class:`Harness`."""

from __future__ import annotations

import asyncio
import contextvars
import json
import re
import shlex
import sys
import time
from dataclasses import dataclass

from faultmesh.runtime import wait_for
from fmtools.demo.procs import Child, python_argv
from fmtools.demo.report import MISSING, NOT_AVAILABLE, RIGHT, WRONG, Clock, Row
from fmtools.demo.stack import Stack, StackError
from fmtools.demo.watch import FaultWatcher


@dataclass
class Timing:
    """The scenario's intervals (s). Defaults are the real rules; CI passes shorter ones by flag.

    ``detect_timeout_s``: how long a step waits for clusterd to show a fault;
    ``link_down_s``: how long the link stays down; ``link_escalate_s``: deviced's FaultTimeout for
    81078603 (the escalation to PreSeparateNPU); ``link_recover_s``: its RecoverTimeout (the fault
    clears this long after the link is up again); ``slownode_round_s``: FD-OL
    nSecondsDoOneDetection; ``slow_after_steps``: clean training steps before rank 2 is slowed;
    ``slow_mode``: ``sleep`` (a stall of 40 % of its compute per step) or ``compute`` (+40 % CPU work).
    """

    detect_timeout_s: float = 30.0
    link_down_s: float = 25.0
    link_escalate_s: float = 20.0
    link_recover_s: float = 60.0
    slownode_round_s: float = 1.0
    slow_after_steps: int = 60
    slow_mode: str = "sleep"


_STEP: contextvars.ContextVar[str] = contextvars.ContextVar("demo_step", default="")

JOB = "demo-job"
# global rank -> (server index, NPU): ranks 0,1 on server 1 (TP group [0,1]), ranks 2,3 on server 4
PLACEMENT = {0: (1, 0), 1: (1, 1), 2: (4, 0), 3: (4, 1)}
SLOW_RANK = 2


class Harness:
    """The demo's running parts and waits: the CLI, the job, clusterd's views, rows (the steps are
    :class:`fmtools.demo.scenario.Scenario`, which holds one)."""

    def __init__(self, stack: Stack, clock: Clock, timing: Timing) -> None:
        self.stack = stack
        self.clock = clock
        self.say = clock.say
        self.t = timing
        self.rows: list[Row] = []
        self.watcher: FaultWatcher | None = None
        self.train: Child | None = None
        self.trainsim: Child | None = None
        self.job_ready = asyncio.Event()  # the job is registered and its training side answers
        self.training_since = 0.0  # wall time the torch job finished its warm-up
        self.job_error = ""
        self._row_step: dict[Row, str] = {}  # which step created each row

    # -- helpers -------------------------------------------------------------------------------
    def row(self, fault: str) -> Row:
        """A new summary row, kept in scenario order."""
        r = Row(fault)
        self.rows.append(r)
        self._row_step[r] = _STEP.get()
        return r

    async def node_health(self, node: str) -> str:
        """``<health>`` of ``node`` from clusterd's node view (empty on error)."""
        try:
            view = await self.stack.clusterd_json(f"/v1/nodes/{node}")
            return str(view.get("health", ""))
        except (StackError, OSError, TimeoutError, ValueError):
            return ""

    async def cli(self, *args: str, timeout_s: float = 90.0, echo: bool = True) -> tuple[int, str]:
        """Run ``faultmesh <args>`` against this stack (``--http/--grpc`` added by the caller);
        returns (exit status, output). The command line is printed first."""
        self.say("$ faultmesh " + " ".join(shlex.quote(a) for a in args))
        return await self._exec([sys.executable, "-m", "faultmesh", *args], timeout_s, echo)

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

    # -- the training job ----------------------------------------------------------------------
    job_steps = 5000  # the example job's --steps (``faultmesh up --with-job`` runs it far longer)
    job_parallel = "tp"  # the example job's --parallel: tp (TP groups [0,1] [2,3]) or ddp (issue 34)

    def rank_server(self, rank: int):
        """The server of ``rank`` (:data:`PLACEMENT`; on a stack of fewer than 4 servers, ranks 2,3
        go to the last one; GPU servers never host it)."""
        srv = PLACEMENT[rank][0]
        return self.stack.server(min(srv, self.stack.cfg.servers))

    def job_spec(self) -> dict:
        """The job as ``faultmesh job apply`` takes it (clusterd.brain.jobs format)."""
        return {
            "id": JOB,
            "name": JOB,
            "namespace": "default",
            "status": "running",
            "framework": "pytorch",
            "recover-strategy": "retry,recover,dump",
            "process-recover-enable": "on",
            "subHealthyStrategy": "ignore",
            "ranks": [
                {"rank": r, "node": self.rank_server(r).name, "device": dev, "superPodId": 0}
                for r, (_, dev) in PLACEMENT.items()
            ],
        }

    def featconf(self) -> dict:
        """The job's FD-OL FeatConf (reference fdol.md §7 defaults, except the round period)."""
        from fdol.slownode.featconf import reference_featconf

        return reference_featconf(JOB, self.t.slownode_round_s)

    async def setup_job(self) -> None:
        """Register the job, enable slow-node detection for it, start the training-side stand-in
        (``faultmesh trainsim``) and the real PyTorch job. Sets ``job_error`` when a part is missing."""
        st = self.stack
        run = st.run_dir
        if not st.features.get("brain"):
            self.job_error = "the brain (jobs, Recover service) is not offered by clusterd"
        job_file = run / "job.json"
        job_file.write_text(json.dumps(self.job_spec(), indent=1) + "\n")
        if not self.job_error:
            self.say(
                f"JOB register {JOB}: ranks 0,1 on {self.rank_server(0).name} NPU 0,1; "
                f"ranks 2,3 on {self.rank_server(2).name} NPU 0,1"
            )
            rc, out = await self.cli("job", "apply", "-f", str(job_file), "--http", st.http)
            if rc != 0:
                self.job_error = f"faultmesh job apply failed ({rc}): {out[-200:]}"
        if not self.job_error:
            self.trainsim = await st.procs.start(
                "trainsim", python_argv("faultmesh", "trainsim", "--grpc", st.grpc, "--job", JOB)
            )
            self.say(f"JOB training-side stand-in: faultmesh trainsim --job {JOB} (pid {self.trainsim.pid})")
        switch = ""
        if st.features.get("slownode") and st.features.get("brain"):
            conf = run / "featconf.json"
            conf.write_text(json.dumps(self.featconf(), indent=1) + "\n")
            rc, out = await self.cli(
                "slownode", "enable", "--job", JOB, "--conf", str(conf), "--http", st.http
            )
            if rc != 0:
                self.job_error = self.job_error or f"faultmesh slownode enable failed ({rc}): {out[-200:]}"
            switch = str(st.datatrace_dir / f"default.data-trace-{JOB}" / "profilingSwitch")
        argv = python_argv(
            "faultmesh.profiler.example_job", "--base-dir", str(st.profiling_dir), "--task-id", JOB,
            "--switch", switch, "--steps", str(self.job_steps), "--slow-from", "-1", "--slow-file", str(run / "slow-rank"), "--slow-rank", str(SLOW_RANK), "--slow-mode", self.t.slow_mode,
            "--factor", "0.4", "--progress-every", "10", "--stop-file", str(run / "stop-training"), "--summary", str(run / "train-summary"),
            "--parallel", self.job_parallel,
        )  # fmt: skip
        self.train = await st.procs.start("train", argv)
        layout = (
            "TP groups [0,1] [2,3]" if self.job_parallel == "tp" else "DistributedDataParallel, no TP group"
        )
        self.say(f"JOB PyTorch job started: 4 gloo ranks on CPU, {layout} (pid {self.train.pid})")
        if self.trainsim is not None:
            await self._wait_registered()
        self.job_ready.set()

    async def _wait_registered(self, timeout_s: float = 30.0) -> None:
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            try:
                rec = await self.stack.clusterd_json(f"/v1/jobs/{JOB}/recovery")
                if rec.get("registered") and rec.get("subscribed"):
                    self.say(f"JOB {JOB} registered with clusterd's Recover service; signal stream open")
                    return
            except (StackError, OSError, TimeoutError, ValueError):
                pass
            await asyncio.sleep(0.5)
        self.job_error = self.job_error or f"trainsim did not register {JOB} within {timeout_s:.0f} s"

    async def wait_training(self, timeout_s: float = 120.0) -> bool:
        """Wait until the torch job printed its warm-up line; sets ``training_since``."""
        assert self.train is not None
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if "warm-up done" in self.train.log_path.read_text(errors="replace"):
                if not self.training_since:
                    self.training_since = time.time()
                    self.say("JOB PyTorch job is training (warm-up done)")
                return True
            if not self.train.alive:
                return False
            await asyncio.sleep(0.5)
        return False

    def train_step(self) -> int:
        """The latest step rank 0 reported in the job's log (-1 before the first report)."""
        assert self.train is not None
        steps = re.findall(r"rank 0: step (\d+):", self.train.log_path.read_text(errors="replace"))
        return int(steps[-1]) if steps else -1

    async def wait_step(self, step: int, timeout_s: float) -> bool:
        """Wait until the job reports a step >= ``step`` (progress lines every 10 steps)."""
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.train_step() + 1 >= step:
                return True
            if self.train is None or not self.train.alive:
                return False
            await asyncio.sleep(0.5)
        return False

    async def decisions(self) -> list[dict]:
        """The job's recovery decisions (GET /v1/jobs/<id>/recovery), [] on error."""
        try:
            rec = await self.stack.clusterd_json(f"/v1/jobs/{JOB}/recovery")
            return list(rec.get("decisions", []))
        except (StackError, OSError, TimeoutError, ValueError):
            return []

    async def wait_decision(self, since: float, final: tuple[str, ...], timeout_s: float) -> list[dict]:
        """Decisions taken after wall time ``since``, waiting until one in ``final`` shows (or timeout)."""
        deadline = time.time() + timeout_s
        got: list[dict] = []
        while time.time() < deadline:
            got = [d for d in await self.decisions() if d.get("time_ms", 0) >= since * 1000]
            if any(d.get("decision") in final for d in got):
                break
            await asyncio.sleep(0.5)
        return got

    async def wait_idle(self, timeout_s: float = 60.0) -> bool:
        """Wait until the job's recovery controller runs no flow."""
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            try:
                rec = await self.stack.clusterd_json(f"/v1/jobs/{JOB}/recovery")
                if not rec.get("flow"):
                    return True
            except (StackError, OSError, TimeoutError, ValueError):
                pass
            await asyncio.sleep(0.5)
        return False

    # -- steps ---------------------------------------------------------------------------------
    async def om_cli(self, *args: str) -> tuple[bool, str]:
        """Run an O&M command of the operator CLI (it waits for the outcome); (exit 0, result text)."""
        rc, out = await self.cli(
            *args, "--grpc", self.stack.grpc, "--timeout-s", "60", "-o", "json", echo=False
        )
        try:
            return rc == 0, str(json.loads(out[out.index("{") :])["result"])
        except (ValueError, KeyError):
            return False, f"exit {rc}: {out[-200:]}"

    async def stop_job(self) -> None:
        """Stop the PyTorch job (stop file; all ranks stop after the same step) and trainsim."""
        st = self.stack
        if self.train is not None and self.train.alive:
            self.train.stopping = True
            (st.run_dir / "stop-training").write_text("1\n")
            try:
                await wait_for(self.train.proc.wait(), 30)
                self.say(f"JOB PyTorch job finished (exit {self.train.proc.returncode})")
            except TimeoutError:
                self.say("JOB PyTorch job did not stop within 30 s; stopping it by PID")
                await st.procs.stop(self.train)
        if self.trainsim is not None:
            await st.procs.stop(self.trainsim)

    def achieved_slowdown(self) -> str:
        """From the job's per-rank summaries: rank 2's compute against the others', slow vs clean steps."""
        import statistics

        d = self.stack.run_dir / "train-summary"
        try:
            rows = {r: json.loads((d / f"rank{r}.json").read_text())["rows"] for r in range(4)}
            slow_idx = {i for i, x in enumerate(rows[SLOW_RANK]) if x["slow"]}
            n = min(len(v) for v in rows.values())

            def ratio(idx):
                mine = statistics.median(rows[SLOW_RANK][i]["compute"] for i in idx)
                others = statistics.median(rows[r][i]["compute"] for r in rows if r != SLOW_RANK for i in idx)
                return mine / others

            clean = [i for i in range(n) if i not in slow_idx]
            slow = [i for i in range(n) if i in slow_idx]
            if not slow or not clean:
                return ""
            period = statistics.median(rows[0][i]["period"] for i in slow) / statistics.median(
                rows[0][i]["period"] for i in clean
            )
            return (
                f"achieved: rank {SLOW_RANK} compute {ratio(clean):.2f}x -> {ratio(slow):.2f}x the others', "
                f"step time slowed/clean x{period:.2f} ({len(clean)} clean + {len(slow)} slowed steps)"
            )
        except (OSError, ValueError, KeyError, ZeroDivisionError, statistics.StatisticsError):
            return ""

    async def run_cmd(self, module: str, *args: str, timeout_s: float = 30.0) -> tuple[int, str]:
        """``python -m module args`` (printed first); returns (exit status, output)."""
        self.say(f"$ python -m {module} " + " ".join(shlex.quote(a) for a in args))
        return await self._exec([sys.executable, "-m", module, *args], timeout_s)

    async def _exec(self, argv: list[str], timeout_s: float, echo: bool = True) -> tuple[int, str]:
        p = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        try:
            out, _ = await wait_for(p.communicate(), timeout_s)
        except TimeoutError:
            p.kill()
            await p.wait()
            return 124, f"timed out after {timeout_s:.0f} s"
        text = out.decode(errors="replace").rstrip()
        for line in text.splitlines() if echo else ():
            self.say("    " + line)
        return p.returncode or 0, text

    def not_available(self, fault: str, why: str) -> None:
        """A row for a part that is not installed: shown as ``not available`` (a failure)."""
        r = self.row(fault)
        r.verdict, r.note = NOT_AVAILABLE, why
        self.say(f"NOT AVAILABLE: {fault}: {why}")

    # -- the whole run -------------------------------------------------------------------------
    async def step_at(self, offset: float, fn) -> None:
        """Run the step ``fn`` after ``offset`` s; its rows belong to it: a step that raises marks
        its own rows (or a new one named after it) WRONG, never the demo's other rows."""
        await asyncio.sleep(offset)
        _STEP.set(fn.__name__)  # this task's context: rows created below belong to this step
        try:
            await fn()
        except Exception as e:  # noqa: BLE001 - a failing step is a WRONG row, never a crashed demo
            mine = [r for r, st in self._row_step.items() if st == fn.__name__] or [self.row(fn.__name__)]
            for r in mine:
                if r.verdict in (MISSING, RIGHT):
                    r.verdict, r.note = WRONG, f"step {fn.__name__} failed: {e!r}"
            self.say(f"step {fn.__name__} failed: {e!r}")
