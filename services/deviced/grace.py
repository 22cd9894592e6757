"""Graceful fault tolerance on the device side (优雅容错; reference deviced.md §4.4, §6; the device
plugin's ``ascend910.go`` ``processAllTask`` and its L2 / L3 / L5 flows, ``ascendtolerance.go``).

On with ``--grace-tolerance`` (needs ``--reset-config-dir``; excludes ``--hot-reset``, as the
reference's ``-hotReset`` takes one mode). A job with fewer chips on the node than one reset group
(``--grace-reset-group``; by product: 910B 8, A3 every chip of the node, other 910 4, others none:
the reference's ``resetDevNumOnce``) gets no episode and is left to rescheduling (reference
``isReSchedulingScene``). A job with process-level recovery (its JobInfo's process-recover-enable
and recover-strategy, :func:`faultmesh.exclusions.process_level_recovery`) gets none either: the
two exclude each other and the job is rescheduled at Job level (counted ``excluded``). Each cycle,
:meth:`GraceFlow.step` looks at every job with ranks on this node that is not already in a flow.
The job's policy is the worst policy of its chips (``restart_request`` < ``restart`` <
``free_reset`` < ``reset`` < ``isolate``); the flow runs for ``restart_request`` (L2), ``restart``
(L3) and ``reset`` (L5), and never for the others.

The first write of an episode lists every rank of the job on this node (the reset ring: one node of
910B / A3 training) with ``Policy = InitialPolicy = <policy>``, ``Status: unrecovered`` and
``RetryTime + 1``, and ``restartType`` hotReset. TaskD's ``fault_check`` reads it (``retry_time >
pre_retry_time``, the changed RankList), stops the training processes and restarts them once every
rank reads ``recovered``. Then, by policy (the waits are the GraceTolerance values of
faultCustomization.json and the reference's constants, :class:`GraceTimers`):

- L2: the codes are re-polled each second for up to ``error_clean_s`` (30 s); cleared -> recovered
  (no reset, no wait for the processes: the training side restarts them when it reads recovered).
  Still there -> upgrade to reset: ``Policy reset`` (unrecovered, no wait), wait for the chips'
  processes to stop, reset, re-poll: clean -> recovered, else isolate / failed.
- L3: wait for the processes to stop (``procs_zero_s``, 60 s), wait ``self_heal_s``
  (WaitFaultSelfHealingTime), re-poll: clean -> recovered; else upgrade to reset as in L2.
- L5: wait for the processes to stop, reset (boot polled up to ``device_reset_s``,
  WaitDeviceResetTime), re-poll: no chip needing a reset -> recovered, else isolate / failed.

The reference's fixed waits are flags (``--grace-processes-timeout-s``, ``--grace-error-clean-s``,
``--grace-npu-ready-s``). Processes still on the chips after ``procs_zero_s`` -> isolate / failed. A recovered write after a
reset is preceded by ``npu_ready_s`` (WaitNpuReadyTime, 30 s); every status write but the "no wait"
ones is followed by ``read_cm_s`` (WaitProcessReadCMTime) for the training side to read it. A
recovered job leaves the flow (a later fault is a new episode: RetryTime + 1 again); a failed one
stays in it until its ranks change or it ends (reference ``UpdateFreeTask``): the file says isolate,
and the reset-config writer refuses any non-empty RankList after that (the job is rescheduled). A
failed reset also escalates the chip (``engine.reset_failed``: SeparateNPU, as :mod:`deviced.hotreset`).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from deviced.chipio import CALL_ERRORS, ChipIO
from deviced.engine import FaultEngine
from deviced.hotreset import reset_and_boot
from deviced.sections import GraceConfig
from deviced.sinks.resetcfg import ResetConfigWriter, chips_of, policy_of, rank_entry
from deviced.tables import GraceTolerance
from faultmesh.exclusions import GRACE_LABEL, ON
from faultmesh.log import event
from faultmesh.runtime import TaskOwner, wait_for

log = logging.getLogger("deviced.grace")

# reference processPolicyTable: the order of the policy strings
POLICY_RANK = {
    "": 0,
    "ignore": 1,
    "restart_request": 2,
    "restart": 3,
    "free_reset": 4,
    "reset": 5,
    "isolate": 6,
}
HANDLED = ("restart_request", "restart", "reset")  # the policies a flow runs for (L2, L3, L5)
FAILED = "failed"  # Status of a rank whose recovery failed (reference RecoverFailedStatus)
RING_910, RING_910B = 4, 8  # chips reset together (reference Ascend910RingsNum, Ascend910BRingsNumTrain)


def reset_group_size(chip_name: str, chips: int) -> int:
    """Chips reset together on a training node of ``chip_name`` with ``chips`` chips (reference
    ``getResetDevNumOnce``): A3 (``910_93xx``) every chip of the node, 910B 8, other 910 chips 4;
    0 for a product without graceful tolerance (the reference: "only 910 device support grace
    tolerance")."""
    name = chip_name.upper().removeprefix("ASCEND")
    if name.startswith("910_93"):
        return chips
    if name.startswith("910B"):
        return RING_910B
    return RING_910 if name.startswith("910") else 0


@dataclass(frozen=True)
class GraceTimers:
    """The flow's waits (s). The first three are faultCustomization.json's GraceTolerance
    (WaitProcessReadCMTime, WaitDeviceResetTime, WaitFaultSelfHealingTime); the next three are the
    reference's constants (WaitProcessesToZeroTime 60, WaitErrorCodeCleanTime 30, WaitNpuReadyTime
    30; deviced's flags ``--grace-processes-timeout-s``, ``--grace-error-clean-s``,
    ``--grace-npu-ready-s``); ``poll_s`` is the 1 s polling interval; ``refresh_s`` bounds the wait
    for a re-poll."""

    read_cm_s: float = 30
    device_reset_s: float = 150
    self_heal_s: float = 15
    procs_zero_s: float = 60
    error_clean_s: float = 30
    npu_ready_s: float = 30
    poll_s: float = 1.0
    refresh_s: float = 15.0

    @classmethod
    def of(cls, grace: GraceTolerance, cfg: GraceConfig | None = None) -> GraceTimers:
        """The timers with ``grace``'s values (faultCustomization.json) and, from deviced's section
        ``cfg``, the constants' flags (``--grace-processes-timeout-s`` ...) and the re-poll bound (3
        list-watch periods); without ``cfg`` the reference's values."""
        t = cls(grace.wait_process_read_cm_s, grace.wait_device_reset_s, grace.wait_self_healing_s)
        if cfg is None:
            return t
        return dataclasses.replace(
            t,
            procs_zero_s=cfg.grace_processes_timeout_s,
            error_clean_s=cfg.grace_error_clean_s,
            npu_ready_s=cfg.grace_npu_ready_s,
            refresh_s=3.0 * cfg.list_watch_period,
        )


class FlowFailed(Exception):
    """The episode ended in isolate / failed (already written)."""


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``--grace-tolerance`` needs ``--reset-config-dir`` and excludes ``--hot-reset`` (exits 2)."""
    if args.grace_tolerance:
        if not args.reset_config_dir:
            parser.error("--grace-tolerance needs --reset-config-dir (the files TaskD reads)")
        if args.hot_reset:
            parser.error(
                "--grace-tolerance and --hot-reset exclude each other (the reference's one -hotReset mode)"
            )


class GraceFlow:
    """The graceful-tolerance action (see module docstring), on with ``cfg.grace_tolerance``
    (``cfg``: its section, :class:`deviced.sections.GraceConfig`).
    ``writer`` is the reset-config writer (None: the action does nothing); ``timers()`` gives the
    waits of a new episode (default: the engine's current GraceTolerance, so a table reload applies
    to the next episode); ``wake()`` asks for a cycle. ``episodes``, ``recovered`` and ``failed``
    count the flows; ``in_reset`` maps each job in an episode (or failed one) to its ranks then."""

    def __init__(
        self,
        cfg: GraceConfig,
        engine: FaultEngine,
        io: ChipIO,
        writer: ResetConfigWriter | None,
        tasks: TaskOwner,
        wake: Callable[[], None],
    ) -> None:
        self.on = cfg.grace_tolerance and writer is not None
        self.engine = engine
        self.io = io
        self.writer = writer
        self.tasks = tasks
        self.wake = wake
        self.timers: Callable[[], GraceTimers] = lambda: GraceTimers.of(engine.custom.grace, cfg)
        self.budget, self.window_s = cfg.hot_reset_budget, cfg.hot_reset_window_s  # resets per chip per s
        self.reset_group = cfg.grace_reset_group  # chips a job needs here (0: by product, group_size())
        self.left_out: dict[str, str] = {}  # jobs told (logged) why they get no episode -> why
        self.in_reset: dict[str, dict[int, int]] = {}  # job id -> its ranks when the episode began
        self.running: dict[str, asyncio.Task] = {}  # job id -> its episode
        self.isolating: set[str] = set()  # running episodes that wrote (or write) isolate / failed
        self.reset_times: dict[int, collections.deque[float]] = collections.defaultdict(collections.deque)
        self.episodes = self.recovered = self.failed = self.excluded = 0
        self._cycled = asyncio.Event()  # set (and replaced) by each step(): a full cycle ran
        if not self.on and engine.custom.ignored:
            event(log, logging.WARNING, "GraceTolerance has no effect", settings=",".join(engine.custom.ignored),
                  reason="it drives only --grace-tolerance; the hot reset uses --hot-reset-boot-timeout "
                  "and --hot-reset-idle")  # fmt: skip

    @property
    def hello_labels(self) -> dict[str, str]:
        """The agent Hello's labels: ``graceTolerance=on`` while on (:mod:`faultmesh.exclusions`)."""
        return {GRACE_LABEL: ON} if self.on else {}

    @property
    def busy(self) -> bool:
        """True while a flow runs (the cycle then runs every second: the flow waits for re-polls)."""
        return bool(self.running)

    async def step(self) -> None:
        """One cycle's look at the jobs (after ``engine.cycle()``): start the flows that are due."""
        if not self.on or self.writer is None:
            return
        cycled, self._cycled = self._cycled, asyncio.Event()
        cycled.set()
        jobs = self.writer.jobs
        for job_id in [j for j in self.running if j not in jobs]:  # the job ended: so does its episode
            self.running.pop(job_id).cancel()
            self.in_reset.pop(job_id, None)
            event(log, logging.WARNING, "grace tolerance cancelled", job=job_id, reason="job gone")
        self.left_out = {j: why for j, why in self.left_out.items() if j in jobs}
        for job_id in [j for j in self.in_reset if j not in self.running]:
            if job_id not in jobs or jobs[job_id].ranks != self.in_reset[job_id]:
                del self.in_reset[job_id]  # the job ended or changed: a failed episode is over
                event(log, logging.INFO, "grace tolerance released", job=job_id, reason="job changed")
        for job_id, job in jobs.items():
            if job_id in self.in_reset or not job.ranks:
                continue
            policy = self.policy(job.ranks)
            if policy not in HANDLED or not self._for_job(job_id, len(job.ranks), job.process_level):
                continue
            ranks = dict(job.ranks)
            if not self.write(job_id, ranks, policy, policy, "unrecovered", add_retry=True):
                if job.isolated:  # to be rescheduled: none until the job changes (a write error retries)
                    self.in_reset[job_id] = ranks
                continue
            self.in_reset[job_id] = ranks
            self.episodes += 1
            event(log, logging.WARNING, "grace tolerance start", job=job_id, policy=policy,
                  retry_time=job.retry_time, ranks=",".join(map(str, sorted(ranks))))  # fmt: skip
            coro = self._episode(job_id, ranks, policy, self.timers())
            self.running[job_id] = self.tasks.spawn(coro, name=f"grace-{job_id}")

    def filtered_health(self) -> tuple[set[int], set[int]]:
        """The chips the device-info document shows Healthy although the engine does not (reference
        ``filterDevStatus``): (logic ids whose Health is shown Healthy, logic ids whose NetworkHealth
        is). A chip of a running episode that is not Healthy is shown Healthy, and the network of
        every chip of its reset group (the job's chips here) too, so that no scheduler moves the job
        while the device side recovers it; an episode that wrote isolate is not filtered (reference
        ``isDevShouldBeIsolate``), nor is a failed one after it."""
        health: set[int] = set()
        network: set[int] = set()
        for job_id in self.running:
            ranks = self.in_reset.get(job_id)
            if job_id in self.isolating or not ranks:
                continue
            logics = self.logics(ranks)
            sick = [lg for lg in logics if self.engine.devices[lg].health != "Healthy"]
            if sick:
                health.update(sick)
                network.update(logics)
        return health, network

    def group_size(self) -> int:
        """Chips of one reset group: ``--grace-reset-group``, else by the chips' product
        (:func:`reset_group_size`)."""
        if self.reset_group > 0:
            return self.reset_group
        name = next(iter(self.io.chip_names.values()), "")
        return reset_group_size(name, len(self.engine.devices))

    def _for_job(self, job_id: str, chips: int, process_level: bool) -> bool:
        """Whether a job with ``chips`` chips here gets an episode: not with process-level recovery
        (Job-level rescheduling instead, :mod:`faultmesh.exclusions`), nor with fewer chips than a
        reset group (left to rescheduling, reference ``isReSchedulingScene``). Logged once per job
        and reason; an excluded job is counted once (``excluded``)."""
        group = self.group_size()
        if not process_level and group and chips >= group:
            self.left_out.pop(job_id, None)
            return True
        size = f"{chips} chips here, a reset group is {group}" if group else "product without grace tolerance"
        why = "process-level recovery (process-recover-enable, recover-strategy)" if process_level else size
        if self.left_out.get(job_id) != why:
            self.left_out[job_id] = why
            self.excluded += process_level
            event(log, logging.WARNING, "grace tolerance not for job", job=job_id, reason=why,
                  fallback="job-rescheduling" if process_level else "rescheduling")  # fmt: skip
        return False

    # ---------------------------------------------------------------- views of the chips
    def policies(self, ranks: dict[int, int]) -> dict[int, str]:
        """Rank -> its chip's policy string now."""
        chips = chips_of(self.engine)
        return {r: policy_of(chips[p].level) if p in chips else "" for r, p in ranks.items()}

    def policy(self, ranks: dict[int, int]) -> str:
        """The worst policy of the ranks' chips (reference ``GetTaskProcessPolicy``)."""
        return max(self.policies(ranks).values(), key=POLICY_RANK.__getitem__, default="")

    def needing(self, ranks: dict[int, int], at_least: str) -> list[int]:
        """Logic ids of the ranks' chips whose policy is ``at_least`` or worse (reference
        ``GetDevListByPolicyLevel``)."""
        pol = self.policies(ranks)
        out = [
            self.engine.logic_of_phy(ranks[r])
            for r, p in pol.items()
            if POLICY_RANK[p] >= POLICY_RANK[at_least]
        ]
        return sorted(lg for lg in out if lg is not None)

    def logics(self, ranks: dict[int, int]) -> list[int]:
        """Logic ids of the ranks' chips."""
        return sorted(lg for p in ranks.values() if (lg := self.engine.logic_of_phy(p)) is not None)

    def write(
        self, job_id: str, ranks: dict[int, int], policy: str, initial: str, status: str, add_retry=False
    ) -> bool:
        """Write the RankList of ``ranks`` with one policy / initial policy / status."""
        assert self.writer is not None
        chips = chips_of(self.engine)
        entries = [rank_entry(r, p, chips.get(p), policy, initial, status) for r, p in sorted(ranks.items())]
        return self.writer.write_ranks(job_id, entries, add_retry)

    # ---------------------------------------------------------------- the episode
    async def _episode(self, job_id: str, ranks: dict[int, int], policy: str, t: GraceTimers) -> None:
        try:
            if policy == "restart_request":
                final = await self._restart_request(job_id, ranks, t)
            elif policy == "restart":
                final = await self._restart(job_id, ranks, t)
            else:
                final = await self._reset(job_id, ranks, t)
            await self._status(job_id, ranks, final, policy, "recovered", t)
            self.in_reset.pop(job_id, None)  # reference UnSetTaskInReset: a later fault is a new episode
            self.recovered += 1
            event(
                log,
                logging.INFO,
                "grace tolerance recovered",
                job=job_id,
                policy=final,
                initial_policy=policy,
            )
        except FlowFailed as e:
            self.failed += 1
            event(
                log, logging.ERROR, "grace tolerance failed", job=job_id, initial_policy=policy, reason=str(e)
            )
        finally:
            if self.running.get(job_id) is asyncio.current_task():
                del self.running[job_id]
                self.isolating.discard(job_id)
            self.wake()

    async def _restart_request(self, job_id: str, ranks: dict[int, int], t: GraceTimers) -> str:
        """L2 (reference ``restartRequestProcess``): wait for the codes to clear, else reset."""
        deadline = time.monotonic() + t.error_clean_s
        while True:
            await self.refresh(ranks, t)
            if not self.needing(ranks, "restart_request"):
                event(log, logging.INFO, "grace tolerance self-healed", job=job_id, policy="restart_request")
                return "restart_request"
            if time.monotonic() >= deadline:
                break
            await asyncio.sleep(t.poll_s)
        return await self._upgrade(job_id, ranks, "restart_request", t, wait_procs=True)

    async def _restart(self, job_id: str, ranks: dict[int, int], t: GraceTimers) -> str:
        """L3 (reference ``restartProcess``): processes stop, self-healing wait, else reset."""
        await self.wait_procs_zero(job_id, ranks, "restart", t)
        await asyncio.sleep(t.self_heal_s)
        await self.refresh(ranks, t)
        if not self.needing(ranks, "restart"):
            return "restart"
        return await self._upgrade(job_id, ranks, "restart", t, wait_procs=False)

    async def _reset(self, job_id: str, ranks: dict[int, int], t: GraceTimers) -> str:
        """L5 (reference ``resetProcess``): processes stop, reset, no chip may still need one."""
        await self.wait_procs_zero(job_id, ranks, "reset", t)
        await self.reset_chips(job_id, ranks, "reset", t)
        if self.needing(ranks, "restart_request"):
            await self.isolate(job_id, ranks, "reset", t, "a chip still needs a reset after it")
        return "reset"

    async def _upgrade(
        self, job_id: str, ranks: dict[int, int], initial: str, t: GraceTimers, wait_procs: bool
    ) -> str:
        """The fault did not heal: the episode becomes a reset (written at once, no wait)."""
        event(
            log,
            logging.WARNING,
            "grace tolerance upgraded",
            job=job_id,
            initial_policy=initial,
            policy="reset",
        )
        self.write(job_id, ranks, "reset", initial, "unrecovered")
        if wait_procs:
            await self.wait_procs_zero(job_id, ranks, initial, t)
        await self.reset_chips(job_id, ranks, initial, t)
        if self.needing(ranks, initial):
            await self.isolate(job_id, ranks, initial, t, "the fault is still there after the reset")
        return "reset"

    async def _status(self, job_id: str, ranks: dict[int, int], policy: str, initial: str | None, status: str,
                      t: GraceTimers) -> None:  # fmt: skip
        """Write a status and give the training side ``read_cm_s`` to read it (reference
        ``updateResetCMStatus``; a recovered reset first waits ``npu_ready_s``)."""
        if status == "recovered" and policy == "reset":
            await asyncio.sleep(t.npu_ready_s)
        self.write(job_id, ranks, policy, initial or policy, status)
        await asyncio.sleep(t.read_cm_s)

    async def isolate(
        self, job_id: str, ranks: dict[int, int], initial: str, t: GraceTimers, why: str
    ) -> None:
        """Write isolate / failed and end the episode (raises :class:`FlowFailed`)."""
        self.isolating.add(job_id)  # the chips are shown as they are from now on
        await self._status(job_id, ranks, "isolate", initial, FAILED, t)
        raise FlowFailed(why)

    async def refresh(self, ranks: dict[int, int], t: GraceTimers) -> None:
        """Have the cycle re-poll the ranks' chips and wait (up to ``refresh_s``) until it did
        (reference ``refreshDevFaultInfo``)."""
        logics = self.logics(ranks)
        for lg in logics:
            self.engine.mark_reinit(lg)
        deadline = time.monotonic() + t.refresh_s
        while any(self.engine.devices[lg].reinit for lg in logics):
            cycled = self._cycled
            self.wake()
            try:
                await wait_for(cycled.wait(), deadline - time.monotonic())
            except TimeoutError:
                event(
                    log, logging.WARNING, "grace tolerance re-poll late", logic_ids=",".join(map(str, logics))
                )
                return

    async def wait_procs_zero(self, job_id: str, ranks: dict[int, int], initial: str, t: GraceTimers) -> None:
        """Wait until no process runs on the ranks' chips (reference
        ``waitForAllFaultyDeviceProcessesToZero``); a failed last query lets the flow go on; still
        busy after ``procs_zero_s`` -> isolate."""
        logics = self.logics(ranks)
        deadline = time.monotonic() + t.procs_zero_s
        while True:
            last = time.monotonic() >= deadline
            busy = await self._busy_chips(logics)
            if busy == [] or (busy is None and last):
                event(log, logging.INFO, "grace tolerance processes stopped", job=job_id)
                return
            if last:
                event(log, logging.WARNING, "grace tolerance processes still running", job=job_id,
                      logic_ids=",".join(map(str, busy or [])))  # fmt: skip
                await self.isolate(
                    job_id, ranks, initial, t, f"processes still on the chips after {t.procs_zero_s:g}s"
                )
            await asyncio.sleep(t.poll_s)

    async def _busy_chips(self, logics: list[int]) -> list[int] | None:
        """The chips with processes on them; None when a query failed."""
        busy = []
        for lg in logics:
            try:
                n = await self.io.call("procs", self.io.backend.process_count, self.io.ids[lg])
            except CALL_ERRORS:
                return None
            if n != 0:
                busy.append(lg)
        return busy

    async def reset_chips(self, job_id: str, ranks: dict[int, int], initial: str, t: GraceTimers) -> None:
        """Reset every chip of the ranks that needs it (policy restart_request or worse, isolate
        aside), each boot polled up to ``device_reset_s``, then re-poll (reference
        ``resetDeviceOnce``). A refused or failed reset -> isolate."""
        todo = [lg for lg in self.needing(ranks, "restart_request") if self._policy_of(lg) != "isolate"]
        for lg in todo:
            ok, why = await self._reset_one(lg, t)
            if not ok:
                if self.engine.reset_failed(lg):
                    event(
                        log,
                        logging.ERROR,
                        "hot reset failed",
                        logic_id=lg,
                        reason=why,
                        fault_level="SeparateNPU",
                    )
                await self.isolate(job_id, ranks, initial, t, f"reset of chip {lg} failed: {why}")
        await self.refresh(ranks, t)

    def _policy_of(self, logic: int) -> str:
        return policy_of(self.engine.devices[logic].worst_level())

    async def _reset_one(self, logic: int, t: GraceTimers) -> tuple[bool, str]:
        now = time.monotonic()
        used = self.reset_times[logic]
        while used and now - used[0] > self.window_s:
            used.popleft()
        if len(used) >= self.budget:
            return False, f"reset budget of {self.budget} per {self.window_s / 3600:g} h used"
        used.append(now)
        ids = self.io.ids[logic]
        self.engine.reset_begin(logic)
        event(
            log, logging.WARNING, "hot reset start", logic_id=logic, phy_id=ids.phy, reason="grace tolerance"
        )
        why = "reset cancelled"
        try:
            why = await reset_and_boot(self.io, ids, t.device_reset_s, t.poll_s)
            if not why:
                event(log, logging.INFO, "hot reset done", logic_id=logic, phy_id=ids.phy)
            return not why, why
        finally:
            self.engine.reset_end(logic, booted=not why)
