"""Business-plane retry reports: the reference's retry processor (clusterd.md §2.1 ReportProcessFault,
§6.2 "retry", §6.4).

A ``ReportProcessFault`` whose ranks are all retry types ("0" UCE, "2" HCCL) starts no recovery
flow by itself in the reference: the ranks go to the fault centre as business-plane retry reports
(RecoverTime = now). For :data:`REPORT_WINDOW_MS` (10 s) after a report, a job NPU that has no
UCE / HCCL code of its own gets a synthetic fault rank -- code 80E01801 (type "0") or 8C1F860B
(type "2"), level ``RestartBusiness`` -- and that rank reaches the Recover controller through the
normal fault intake (:mod:`clusterd.brain.intake`): retry configured and only retry ranks ->
the recovery starts (``stopTrain``); otherwise ``preExitProcess``.

The filter (:meth:`RetryReports.hidden_until`, clusterd.md §6.2 "retry"): on a job with ``retry`` in
its strategies and process recovery on, a *hardware* UCE / HCCL retry fault on the job's NPU is left
out of the job's fault view while the fault is younger than the report window (10 s: the business
plane has that long to say it handles the fault), or while a business-plane report of that rank came
at most 10 s after the fault and is younger than the complete window (30 s: the step retry runs). The
reference's CompleteTime is never set by its report collector, so only that first branch of the
complete rule applies. Reports are kept 60 s (the collector's expiry).
"""

from __future__ import annotations

from clusterd.brain.faultview import HCCL_RETRY_CODE, UCE_CODE, RankFault, fault_type

REPORT_WINDOW_MS = 10_000  # JobReportRecoverTimeout: the synthetic rank window and the hide window
COMPLETE_WINDOW_MS = 30_000  # JobReportCompleteTimeout
EXPIRE_MS = 60_000  # the report collector's data expiry
RETRY_CODES = (UCE_CODE, HCCL_RETRY_CODE)
CODE_OF_TYPE = {"0": UCE_CODE, "2": HCCL_RETRY_CODE}
RETRY_TYPES = frozenset(CODE_OF_TYPE)


class RetryReports:
    """Retry reports per job: job id -> rank -> (fault type, report time ms). ``window_ms``: the
    report window of synthetic ranks; ``hide_ms``: how long a new hardware retry fault is hidden
    (both the reference's 10 s JobReportRecoverTimeout); ``complete_ms``: the complete window after
    a report; reports are forgotten after ``expire_ms``."""

    def __init__(
        self,
        window_ms: int = REPORT_WINDOW_MS,
        hide_ms: int = REPORT_WINDOW_MS,
        complete_ms: int = COMPLETE_WINDOW_MS,
        expire_ms: int = EXPIRE_MS,
    ) -> None:
        self.window_ms = window_ms
        self.hide_ms = hide_ms
        self.complete_ms = complete_ms
        self.expire_ms = max(expire_ms, window_ms, hide_ms, complete_ms)
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
        reports = self._live(job.id, now_ms)
        if not reports:
            return []
        have = {f.rank for f in hardware if f.code in RETRY_CODES}
        out = []
        for r in job.ranks:
            rep = reports.get(r.rank)
            if rep is None or r.rank in have or now_ms - rep[1] > self.window_ms:
                continue
            code = CODE_OF_TYPE[rep[0]]
            out.append(
                RankFault(
                    r.rank, r.node, r.device_id, job.pod_rank(r.node), code, "RestartBusiness",
                    fault_type(job, code), rep[1],
                )
            )  # fmt: skip
        return out

    def _live(self, job_id: str, now_ms: int) -> dict[int, tuple[str, int]]:
        """The job's reports younger than the expiry (older ones are forgotten)."""
        reports = self._by_job.get(job_id)
        if not reports:
            return {}
        for rank in [r for r, (_, t) in reports.items() if now_ms - t > self.expire_ms]:
            del reports[rank]
        if not reports:
            del self._by_job[job_id]
        return reports

    def hidden_until(self, job, f: RankFault, now_ms: int) -> int | None:
        """The time (ms) until which the hardware fault ``f`` is left out of ``job``'s view by the
        retry filter (module docstring), or None when it is not hidden now."""
        if f.code not in RETRY_CODES or "retry" not in job.recover_strategy:
            return None
        if job.process_recover_enable != "on":
            return None
        ends = []
        if f.since_ms >= now_ms - self.hide_ms:
            ends.append(f.since_ms + self.hide_ms)
        rep = self._live(job.id, now_ms).get(f.rank)
        if rep is not None:
            recover = rep[1]
            if f.since_ms >= recover - self.hide_ms and now_ms <= recover + self.complete_ms:
                ends.append(recover + self.complete_ms)
        return max(ends) if ends else None

    def filter(self, job, hardware: list[RankFault], now_ms: int) -> tuple[list[RankFault], int | None]:
        """``hardware`` without the faults the retry filter hides now, and the earliest time (ms) a
        hidden one comes back (None when none is hidden)."""
        kept, soonest = [], None
        for f in hardware:
            until = self.hidden_until(job, f, now_ms)
            if until is None:
                kept.append(f)
            elif soonest is None or until < soonest:
                soonest = until
        return kept, soonest
