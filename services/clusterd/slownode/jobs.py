"""Slow-node detection: the per-job state every part reads, the FeatConf helpers, placement parsing,
the fault codes and the job status document (see :mod:`clusterd.slownode`)."""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import orjson

from fdol.slownode.cluster import ClusterDetector
from fdol.slownode.degradation import DegradationTracker
from fdol.slownode.featconf import FeatConf

MAX_ROUNDS_KEPT = 100
SOURCE = "fd-online"  # the fault records' source
CODE_SLOW = "110001010"  # SubHealthFault on a node hosting slow ranks
CODE_RECOVERED = "100001011"  # NotHandleFault (once) when the job recovered
AGENT = "noded"  # the agent that runs the node part


def prefix(conf: FeatConf) -> str:
    """The reference's log prefix ``[FD-OL SLOWNODE]job(name=<job>, namespace=<ns>, jobId=<id>)``."""
    return f"[FD-OL SLOWNODE]job(name={conf.job_name}, namespace={conf.job_namespace}, jobId={conf.job_id})"


def go_ints(xs: list[int]) -> str:
    """A Go slice print of ints: ``[3 5]``."""
    return "[" + " ".join(str(x) for x in xs) + "]"


class EnableError(ValueError):
    """An enable request that cannot be honoured (bad FeatConf, no placement)."""


class SlowNodeStateError(RuntimeError):
    """The store refused a slow-node config write (disk full, I/O error): nothing was changed."""


def parse_placement(obj: Any) -> dict[int, str]:
    """``{"0": "node-a", ...}`` -> {0: "node-a"}. Raises :class:`EnableError`."""
    if not isinstance(obj, dict) or not obj:
        raise EnableError('ranks must be a non-empty object {"<rank>": "<node>"}')
    out = {}
    for k, v in obj.items():
        try:
            r = int(k)
        except (TypeError, ValueError):
            raise EnableError(f"rank {k!r} is not an integer") from None
        if r < 0 or not isinstance(v, str) or not v:
            raise EnableError(f"rank {k!r}: node must be a non-empty string and rank >= 0")
        out[r] = v
    return out


def unwrap_configmap(obj: Any) -> tuple[Any, Any]:
    """The FeatConf object and optional placement from a file/body: a FeatConf, ``{"FeatConf": text}``
    or ``{"data": {"FeatConf": text}}``. Raises :class:`EnableError`."""
    if not isinstance(obj, dict):
        raise EnableError("expected a JSON object")
    ranks = obj.get("ranks")
    inner = obj.get("data") if isinstance(obj.get("data"), dict) else obj
    fc = None
    for k, v in inner.items():
        if isinstance(k, str) and k.lower() == "featconf":
            fc = v
    if fc is None:
        return {k: v for k, v in obj.items() if k != "ranks"}, ranks
    if isinstance(fc, str):
        try:
            fc = orjson.loads(fc)
        except orjson.JSONDecodeError as e:
            raise EnableError(f"FeatConf is not JSON: {e}") from None
    return fc, ranks if ranks is not None else (fc.get("ranks") if isinstance(fc, dict) else None)


@dataclass
class JobState:
    """One enabled job in clusterd."""

    conf: FeatConf
    placement: dict[int, str]
    source: str
    detector: ClusterDetector
    tracker: DegradationTracker
    task: asyncio.Task | None = None
    rounds: deque = field(default_factory=lambda: deque(maxlen=MAX_ROUNDS_KEPT))
    latest: dict | None = None
    faulted_nodes: set[str] = field(default_factory=set)
    enabled_ms: int = 0

    @property
    def ns_name(self) -> str:
        return f"{self.conf.job_namespace}/{self.conf.job_name}"

    def nodes(self) -> list[str]:
        return sorted(set(self.placement.values()))

    def ranks_on(self, node: str) -> list[int]:
        """The ranks placed on ``node``, ascending ([] for a node without ranks of the job)."""
        return self._by_node.get(node, [])

    @cached_property
    def _by_node(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for r, n in sorted(self.placement.items()):
            out.setdefault(n, []).append(r)
        return out


def job_status(js: JobState, brief: bool = False) -> dict[str, Any]:
    """The job's status document (``GET /v1/slownode/<job>``; ``brief``: the ``GET /v1/slownode``
    entry, without FeatConf, placement, results and rounds)."""
    t = js.tracker
    d: dict[str, Any] = {
        "jobId": js.conf.job_id,
        "jobName": js.conf.job_name,
        "namespace": js.conf.job_namespace,
        "enabled": True,
        "source": js.source,
        "nodes": js.nodes(),
        "heavyProfiling": t.heavy,
        "heavyReason": t.heavy_reason,
        "degraded": t.degraded,
        "slowRanks": t.reported_ranks,
        "consecutiveSlowRounds": t.slow_rounds,
        "rounds": js.detector.rounds,
        "enabledMs": js.enabled_ms,
    }
    if brief:
        return d
    d["featConf"] = js.conf.to_json()
    d["ranks"] = {str(r): n for r, n in sorted(js.placement.items())}
    d["cluster"] = js.latest
    d["nodeResults"] = js.detector.reports
    d["history"] = list(js.rounds)
    return d
