"""The core every flow of the per-job recovery controller holds (clusterd.md §7.2, §7.3).

:class:`ControllerCore` is one job's state (:class:`~clusterd.brain.ctlstate.ControllerState`),
its channel to the training side (:class:`~clusterd.brain.channel.SignalChannel`), its timeouts and
its ports to the rest of ClusterD (:class:`~clusterd.brain.ports.ControllerPorts`), and

- the flow task: at most one flow runs (the state leaves INIT); when it ends, fails or is
  cancelled (:meth:`ControllerCore.reset`) the controller returns to INIT and forgets the flow's
  faults, split and uuid (the reference's handleFinish -> reset);
- the steps every flow shares: record a decision, kill the job, FaultClear / FaultRetry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from clusterd.brain import states
from clusterd.brain.channel import SignalChannel
from clusterd.brain.ctlstate import INIT, ControllerState, FlowEnd, Timeouts, pod_ranks
from clusterd.brain.faultview import RankFault
from clusterd.brain.ports import ControllerPorts
from faultmesh.log import event
from faultmesh.runtime import wait_for

log = logging.getLogger("clusterd.brain")


class ControllerCore:
    """``job_id``, ``t`` (timeouts), ``ports``, ``st`` (state) and ``io`` (channel) of one job."""

    def __init__(self, ports: ControllerPorts, job_id: str, timeouts: Timeouts) -> None:
        self.job_id = job_id
        self.t = timeouts
        self.ports = ports
        self.st = ControllerState(job_id)
        self.io = SignalChannel(self.st, timeouts, ports)
        self._flow: asyncio.Task | None = None
        self.flow_began = asyncio.Event()  # set (and replaced) when a flow starts: the state leaves INIT

    def job(self):
        """The job now (None once deleted)."""
        return self.ports.jobs.get(self.job_id)

    def set_state(self, state: str) -> None:
        """Move to ``state`` (a :mod:`clusterd.brain.states` constant), judged against the state
        table (:meth:`ControllerState.set_state`)."""
        self.st.set_state(state)

    # -- the flow task ------------------------------------------------------------------------------
    def busy(self) -> bool:
        """True while a flow runs (the state is not INIT)."""
        return self._flow is not None and not self._flow.done()

    def start_flow(self, name: str, coro_fn: Callable[[], Awaitable[None]]) -> bool:
        """Run ``coro_fn()`` as the job's flow if the state is INIT. Returns False when busy."""
        if self.busy() or self.st.state != INIT:
            return False
        self.st.flow_name = name
        began, self.flow_began = self.flow_began, asyncio.Event()
        self._flow = self.ports.spawn(self._run_flow(name, coro_fn), f"flow-{name}-{self.job_id}")
        began.set()
        return True

    async def _run_flow(self, name: str, coro_fn) -> None:
        try:
            await coro_fn()
        except FlowEnd:
            pass
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a handler error resets the controller (§7.2)
            event(log, logging.ERROR, "recovery flow failed", job=self.job_id, flow=name, error=repr(e))
            self.decide(name, "reset", f"handler error: {e!r}")
        finally:
            self.io.clear()  # the reference's handleFinish -> reset
            self.st.clear_flow()
            self.set_state(INIT)
            self.st.flow_name = ""

    async def reset(self, reason: str) -> None:
        """Cancel the flow, drop pending reports, back to INIT (a new or ended subscription)."""
        flow = self._flow
        if flow is not None and not flow.done() and flow is not asyncio.current_task():
            flow.cancel()
            with contextlib.suppress(BaseException):
                await wait_for(asyncio.shield(flow), 2.0)
            self.decide(self.st.flow_name or "controller", "reset", reason)
        self._flow = None
        self.io.clear()
        self.io.finish_om(f"om failed, {reason}")
        self.st.clear_flow()
        self.set_state(INIT)

    # -- shared steps ------------------------------------------------------------------------------
    def decide(self, flow: str, decision: str, reason: str, faults: Any = None, **extra: Any) -> dict:
        """Record one decision of this job (the decision sink). Returns the record."""
        return self.ports.decide(self.job_id, flow, decision, reason, faults=faults, **extra)

    def expand_to_pods(self, keep: set[int] | frozenset[int] = frozenset()) -> list[RankFault]:
        """Every cached fault normal, plus every other rank of each fault pod not in ``keep``
        (:meth:`ControllerState.expand_to_pods`). Returns the cached faults."""
        return self.st.expand_to_pods(self.job(), keep)

    async def kill_job(self, flow: str, reason: str) -> None:
        """Signal ``killMaster`` (no actions), then end the flow (→ INIT). clusterd.md §7.3 step 8."""
        self.set_state(states.KILL_JOB)
        self.decide(flow, "kill-job", reason)
        ok = await self.io.signal("killMaster", [])
        if not ok:
            event(log, logging.WARNING, "killMaster not delivered", job=self.job_id)
        raise FlowEnd

    async def fault_retry(self, flow: str, reason: str) -> None:
        """FaultClear then FaultRetry (§7.3 step 7): process-recover-enable=pause, ``changeStrategy
        exit`` dump_exit to the fault pods, wait up to ``fault_retry_s`` for the job to run, label
        back to ``on``. A job that does not run again is killed (killMaster). Ends the flow."""
        self.set_state(states.FAULT_CLEAR)
        self.decide(flow, "fault-clear", reason)
        self.set_state(states.FAULT_RETRY)
        await self.ports.jobs.update(self.job_id, process_recover_enable="pause")
        await self.dump_exit()
        deadline = time.monotonic() + self.t.fault_retry_s
        while True:
            job = self.job()
            if job is None:
                raise FlowEnd
            if job.status == "running":
                break
            if time.monotonic() >= deadline:
                await self.kill_job(flow, f"job not running {self.t.fault_retry_s}s after FaultRetry")
            await asyncio.sleep(self.t.poll_s)
        await self.ports.jobs.update(self.job_id, process_recover_enable="on")
        self.decide(flow, "fault-retry", "processes told to exit (dump_exit); the job runs again")
        raise FlowEnd

    async def dump_exit(self) -> bool:
        """``changeStrategy exit`` with extraParams ``dump_exit`` and nodeRankIds = the fault pods
        (the reference's sendDumpExit: no faultRanks)."""
        pods = pod_ranks(self.expand_to_pods())
        return await self.io.signal(
            "changeStrategy",
            ["change_strategy"],
            change_strategy="exit",
            extra="dump_exit",
            node_rank_ids=pods,
        )
