"""The node result of a slow-node round as the reference writes it (fdol.md §4.6)."""

from __future__ import annotations

__all__ = ["empty_result", "fmt_level", "time_rises"]


def fmt_level(x: float) -> str:
    """Degradation as the reference prints it: ``"35.12%"``; ``"0.0%"`` when not degraded."""
    return f"{100 * x:.2f}%" if x > 0 else "0.0%"


def empty_result(job_id: str, node_ip: str) -> dict:
    """A non-slow node result (§4.6)."""
    return {
        "isSlow": 0,
        "degradationLevel": "0.0%",
        "jobId": job_id,
        "nodeRank": node_ip,
        "slowCalculateRanks": [],
        "slowCommunicationDomains": [],
        "slowSendRanks": [],
        "slowHostNodes": [],
        "slowIORanks": [],
    }


def time_rises(by_rank: dict[int, tuple], ranks: list[int]) -> dict[str, dict[str, float | None]]:
    """``rise`` of a node result (:meth:`fdol.slownode.node.NodeDetector._per_rank`): per rank the
    recent TP wait and TP launch over their baselines and the baselines' relative spread, from
    ``by_rank`` (rank -> its time detectors in ``TIME_COLUMNS`` order; None before a baseline). A
    plain loop: for 2 x 8 windows of 8 values a Python sort beats building one numpy array."""
    out = {}
    for r in ranks:
        v = []
        for d in by_rank[r][1:3]:  # zp_device, zp_host
            x = d.recent()
            ok = d.ready and d.mean > 0
            v.append(round(x / d.mean, 4) if ok and x > 0 else None)
            v.append(round(d.std / d.mean, 4) if ok else None)
        out[str(r)] = {"zp": v[0], "zpSpread": v[1], "host": v[2], "hostSpread": v[3]}
    return out
