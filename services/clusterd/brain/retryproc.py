"""Business-plane retry reports: the reference's retry processor (clusterd.md §2.1 ReportProcessFault,
§6.2 "retry", §6.4).

A ``ReportProcessFault`` whose ranks are all retry types ("0" UCE, "2" HCCL) starts no recovery
flow by itself in the reference: the ranks go to the fault centre as business-plane retry reports
(RecoverTime = now). For :data:`REPORT_WINDOW_MS` (10 s) after a report, a job NPU that has no
UCE / HCCL code of its own gets a synthetic fault rank -- code 80E01801 (type "0") or 8C1F860B
(type "2"), level ``RestartBusiness`` -- and that rank reaches the Recover controller through the
normal fault intake (:mod:`clusterd.brain.intake`): retry configured and only retry ranks ->
the recovery starts (``stopTrain``); otherwise ``preExitProcess``.

Not done: the reference also *hides* a hardware UCE for up to 30 s once the business plane reported
its recovery (the "complete window"); faultmesh's fault view approximates the step-retry window by
"the fault is new" (:mod:`clusterd.brain.faultview`).
"""

from __future__ import annotations

from clusterd.brain.faultview import HCCL_RETRY_CODE, UCE_CODE, RankFault, fault_type

REPORT_WINDOW_MS = 10_000
CODE_OF_TYPE = {"0": UCE_CODE, "2": HCCL_RETRY_CODE}
RETRY_TYPES = frozenset(CODE_OF_TYPE)


class RetryReports:
    """Retry reports per job: job id -> rank -> (fault type, report time ms)."""

    def __init__(self, window_ms: int = REPORT_WINDOW_MS) -> None:
        self.window_ms = window_ms
        self._by_job: dict[str, dict[int, tuple[str, int]]] = {}

    def report(self, job_id: str, rank: int, ftype: str, now_ms: int) -> None:
        """Record one retry report (``ftype`` "0" or "2"; other types raise ``ValueError``)."""
        if ftype not in RETRY_TYPES:
            raise ValueError(f"not a retry fault type: {ftype!r}")
        self._by_job.setdefault(job_id, {})[rank] = (ftype, now_ms)

    def drop(self, job_id: str) -> None:
        """Forget a job's reports (the job was deleted)."""
        self._by_job.pop(job_id, None)

    def synthetic(self, job, hardware: list[RankFault], now_ms: int) -> list[RankFault]:
        """Fault ranks for reports younger than the window on ranks without a UCE / HCCL code of
        their own in ``hardware`` (the job's rank faults). Old reports are forgotten."""
        reports = self._by_job.get(job.id)
        if not reports:
            return []
        for rank in [r for r, (_, t) in reports.items() if now_ms - t > self.window_ms]:
            del reports[rank]
        if not reports:
            del self._by_job[job.id]
            return []
        have = {f.rank for f in hardware if f.code in (UCE_CODE, HCCL_RETRY_CODE)}
        out = []
        for r in job.ranks:
            rep = reports.get(r.rank)
            if rep is None or r.rank in have:
                continue
            code = CODE_OF_TYPE[rep[0]]
            out.append(
                RankFault(
                    r.rank, r.node, r.device_id, job.pod_rank(r.node), code, "RestartBusiness",
                    fault_type(job, code), rep[1],
                )
            )  # fmt: skip
        return out
