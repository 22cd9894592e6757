"""FeatConf: the per-job slow-node configuration (reference fdol.md §7).

The reference's ConfigMap ``ras-feature-slownode-<job>`` carries it under data key ``FeatConf``::

    {"jobName":"job1","jobNamespace":"default","normalNumber":20,"nSigma":3,
     "degradationPercentage":0.3,"nConsecAnomaliesSignifySlow":3,"nSecondsDoOneDetection":30,
     "clusterMeanDistance":1.3,"cardOneNode":16,"SlowNode":1}

Keys are matched case-insensitively (Go's JSON decoding does; ``slowNode`` == ``SlowNode``).
Validation follows §7 (``normalNumber`` > 0, ``nSigma`` >= 0, ``nConsecAnomaliesSignifySlow`` >= 1,
``clusterMeanDistance`` > 1, ``cardOneNode`` > 0, ``SlowNode`` 0|1, ``jobId`` ``[A-Za-z0-9-]+``),
with these deliberate differences, each a gap of the reference:

- *defaults*: a missing key takes the documented default (the reference fails start instead);
- *nSigma honoured*: ``degradationPercentage`` may be 0, and then the threshold is
  ``mean + nSigma*std`` (the reference forces it > 0, so nSigma was never used);
- *fractional interval*: ``nSecondsDoOneDetection`` is a float > 0 (seconds);
- faultmesh keys: ``nConsecSlowRoundsToConfirm`` (5, cluster rounds to confirm), ``traffic`` (0,
  TP op element-count filter), ``patternDetector`` (true), ``patternWindowSteps`` (30),
  ``computeRatio`` (1.10), ``waitRatio`` (3.0) — see :mod:`fdol.slownode.pattern`;
- ``rules``: ``faultmesh`` (default: peer-relative detection, :mod:`fdol.slownode.peers`, no
  step-time gate, cluster-wide slowdowns name nobody), ``reference`` (the reference's rules, its
  quirks fixed: step-time gate, homogenization, no pattern detector) or ``pattern`` (faultmesh's
  earlier rules: reference + :mod:`fdol.slownode.pattern`); with ``faultmesh``: ``peerWindowSteps``
  (40, the steps wait asymmetry judges), ``waitAsymmetry`` (0.2), ``lateShare`` (0.25),
  ``waitZ`` (4.0) — :mod:`fdol.slownode.peers` —, ``timeWindowSteps`` (8, the majority window of
  the time detectors and of a node's forward rise), ``nodeRise`` (0.08, a whole node's forward
  rise over its peers; with two nodes also ``nSigma`` times the nodes' forward noise), ``ioShare`` (0.05, a slow data loader must cost this
  share of the step), ``confirmGapRounds`` (1, clean rounds tolerated inside a confirmation),
  ``gapSpread`` (1.0), ``computeExcess`` (0.05), ``computeShift`` (0.03, 0: off: a card's excess
  risen over its own earlier level, :mod:`fdol.slownode.shift`), ``gapLongWindowSteps`` (160, 0: off) and
  ``gapLongSpread`` (0.5) — the gap-excess rule,
  :class:`fdol.slownode.peers.GapDetector` —, ``dpLagExcess`` (0.03), ``dpLagSpread`` (3.0,
  0: off) and ``dpLongSpread`` (1.0: on a shared host, the long horizon ``gapLongWindowSteps``
  judged against this many spreads of a step's lag) — the lag rule on data-parallel collectives
  and expert all-to-alls for ranks without a TP group, :mod:`fdol.slownode.dp` --, ``seqBound`` (6.0, 0: off) -- the sequential test across
  steps that confirms a slow card as soon as its evidence passes the bound instead of after
  ``nConsecSlowRoundsToConfirm`` rounds, :mod:`fdol.slownode.sequential`;
- ``commProfiling``: ``always`` or ``onDemand`` (the reference's heavy/light switching); default
  ``always`` with rules ``faultmesh`` (wait asymmetry needs the TP collectives), else ``onDemand``.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

JOB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")


class FeatConfError(ValueError):
    """A FeatConf that fails validation; the message names the key and the rule."""


@dataclass(frozen=True)
class FeatConf:
    """A validated FeatConf. Times in seconds; ratios are plain numbers (0.3 = 30 %)."""

    job_name: str
    job_namespace: str = "default"
    job_id: str = ""
    normal_number: int = 20
    n_sigma: float = 3.0
    degradation_percentage: float = 0.3
    n_consec: int = 3
    n_seconds: float = 30.0
    cluster_mean_distance: float = 1.3
    card_one_node: int = 16
    slow_node: int = 1
    n_confirm_rounds: int = 5
    traffic: int = 0
    pattern_detector: bool = True
    pattern_window: int = 30
    compute_ratio: float = 1.10
    wait_ratio: float = 3.0
    rules: str = "faultmesh"
    peer_window: int = 40
    time_window: int = 8
    wait_asymmetry: float = 0.2
    late_share: float = 0.25
    wait_z: float = 4.0
    node_rise: float = 0.08
    io_share: float = 0.05
    confirm_gap: int = 1
    gap_spread: float = 1.0
    compute_excess: float = 0.05
    compute_shift: float = 0.03
    gap_long_window: int = 160
    gap_long_spread: float = 0.5
    dp_lag_excess: float = 0.03
    dp_lag_spread: float = 3.0
    dp_long_spread: float = 1.0
    seq_bound: float = 6.0
    comm_profiling: str = ""
    rank_ids: tuple[int, ...] = field(default=())
    unknown_keys: tuple[str, ...] = field(default=(), compare=False)

    @property
    def use_pattern(self) -> bool:
        """The pattern detector runs (rules ``pattern``; ``patternDetector`` can switch it off)."""
        return self.rules == "pattern" and self.pattern_detector

    @property
    def comm_always(self) -> bool:
        """Communication profiling stays on (``commProfiling``; default: always with rules
        ``faultmesh``, whose wait-asymmetry rule needs the TP collectives every step; on demand
        with the reference's rules)."""
        if self.comm_profiling:
            return self.comm_profiling == "always"
        return self.rules == "faultmesh"

    @property
    def key(self) -> str:
        """Job key used everywhere in faultmesh: the job id."""
        return self.job_id

    def to_json(self) -> dict[str, Any]:
        """The FeatConf in its JSON key spelling (round-trips through :func:`parse_featconf`)."""
        d = asdict(self)
        out = {json_key: d[attr] for json_key, (attr, _, _) in _KEYS.items()}
        out["rankIds"] = list(self.rank_ids)
        return out


# json key -> (attribute, kind, default). kind: str|int|float|bool|ranks
_KEYS: dict[str, tuple[str, str, Any]] = {
    "jobName": ("job_name", "str", None),
    "jobNamespace": ("job_namespace", "str", "default"),
    "jobId": ("job_id", "str", ""),
    "normalNumber": ("normal_number", "int", 20),
    "nSigma": ("n_sigma", "float", 3.0),
    "degradationPercentage": ("degradation_percentage", "float", 0.3),
    "nConsecAnomaliesSignifySlow": ("n_consec", "int", 3),
    "nSecondsDoOneDetection": ("n_seconds", "float", 30.0),
    "clusterMeanDistance": ("cluster_mean_distance", "float", 1.3),
    "cardOneNode": ("card_one_node", "int", 16),
    "SlowNode": ("slow_node", "int", 1),
    "nConsecSlowRoundsToConfirm": ("n_confirm_rounds", "int", 5),
    "traffic": ("traffic", "int", 0),
    "patternDetector": ("pattern_detector", "bool", True),
    "patternWindowSteps": ("pattern_window", "int", 30),
    "computeRatio": ("compute_ratio", "float", 1.10),
    "waitRatio": ("wait_ratio", "float", 3.0),
    "rules": ("rules", "str", "faultmesh"),
    "peerWindowSteps": ("peer_window", "int", 40),
    "timeWindowSteps": ("time_window", "int", 8),
    "waitAsymmetry": ("wait_asymmetry", "float", 0.2),
    "lateShare": ("late_share", "float", 0.25),
    "waitZ": ("wait_z", "float", 4.0),
    "nodeRise": ("node_rise", "float", 0.08),
    "ioShare": ("io_share", "float", 0.05),
    "confirmGapRounds": ("confirm_gap", "int", 1),
    "gapSpread": ("gap_spread", "float", 1.0),
    "computeExcess": ("compute_excess", "float", 0.05),
    "computeShift": ("compute_shift", "float", 0.03),
    "gapLongWindowSteps": ("gap_long_window", "int", 160),
    "gapLongSpread": ("gap_long_spread", "float", 0.5),
    "dpLagExcess": ("dp_lag_excess", "float", 0.03),
    "dpLagSpread": ("dp_lag_spread", "float", 3.0),
    "dpLongSpread": ("dp_long_spread", "float", 1.0),
    "seqBound": ("seq_bound", "float", 6.0),
    "commProfiling": ("comm_profiling", "str", ""),
}
COMM_PROFILING = ("", "always", "onDemand")
RULES = ("faultmesh", "reference", "pattern")
_LOWER = {k.lower(): k for k in _KEYS}
_IGNORED = {"rankids", "servers"}


def _typed(key: str, kind: str, v: Any) -> Any:
    if kind == "str":
        if not isinstance(v, str):
            raise FeatConfError(f"{key} must be a string")
        return v
    if kind == "bool":
        if not isinstance(v, bool):
            raise FeatConfError(f"{key} must be true or false")
        return v
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise FeatConfError(f"{key} must be a number")
    if v != v or v in (float("inf"), float("-inf")):
        raise FeatConfError(f"{key} must be finite")
    if kind == "int":
        if float(v) != int(v):
            raise FeatConfError(f"{key} must be an integer")
        return int(v)
    return float(v)


REFERENCE_KEYS = (
    "jobNamespace", "normalNumber", "nSigma", "degradationPercentage", "nConsecAnomaliesSignifySlow",
    "nSecondsDoOneDetection", "clusterMeanDistance", "cardOneNode", "SlowNode",
)  # fmt: skip


def reference_featconf(job_name: str, n_seconds: float = 30.0, **keys: Any) -> dict[str, Any]:
    """The FeatConf JSON object the reference's ConfigMap carries (fdol.md §7: the keys of its
    example, :data:`REFERENCE_KEYS`) for ``job_name`` with the documented defaults,
    ``nSecondsDoOneDetection`` ``n_seconds`` (s), and ``keys`` (more keys, e.g. faultmesh's, or
    ``ranks``) on top."""
    out: dict[str, Any] = {"jobName": job_name, **{key: _KEYS[key][2] for key in REFERENCE_KEYS}}
    out["nSecondsDoOneDetection"] = n_seconds
    return {**out, **keys}


def known_keys() -> tuple[str, ...]:
    """The FeatConf keys in their documented spelling (docs/slownode.md), for suggestions."""
    return tuple(_KEYS)


def parse_featconf(obj: Any, *, job_name: str | None = None) -> FeatConf:
    """Validate a decoded FeatConf JSON object. ``job_name`` fills a missing ``jobName``.

    Returns a :class:`FeatConf`; ``job_id`` defaults to the job name. Raises :class:`FeatConfError`.
    """
    if not isinstance(obj, dict):
        raise FeatConfError("FeatConf must be a JSON object")
    vals: dict[str, Any] = {}
    unknown = []
    ranks: tuple[int, ...] = ()
    seen: dict[str, str] = {}
    for raw_key, v in obj.items():
        if not isinstance(raw_key, str):
            raise FeatConfError("keys must be strings")
        lk = raw_key.lower()
        if lk in _IGNORED:
            if lk == "rankids" and v is not None:
                if not isinstance(v, list) or not all(type(r) is int and r >= 0 for r in v):
                    raise FeatConfError("rankIds must be a list of non-negative integers")
                ranks = tuple(sorted(set(v)))
            continue
        key = _LOWER.get(lk)
        if key is None:
            unknown.append(raw_key)
            continue
        if key in seen:
            raise FeatConfError(f"{key} given twice ({seen[key]!r} and {raw_key!r})")
        seen[key] = raw_key
        attr, kind, _ = _KEYS[key]
        vals[attr] = _typed(key, kind, v)
    if not vals.get("job_name"):
        if job_name:
            vals["job_name"] = job_name
        else:
            raise FeatConfError("jobName is required")
    if not vals.get("job_namespace"):
        vals["job_namespace"] = "default"
    if not vals.get("job_id"):
        vals["job_id"] = vals["job_name"]
    conf = FeatConf(**vals, rank_ids=ranks, unknown_keys=tuple(unknown))
    _validate(conf)
    return conf


def _validate(c: FeatConf) -> None:
    if not JOB_ID_RE.match(c.job_id) or ".." in c.job_id:
        raise FeatConfError("jobId must match [A-Za-z0-9][A-Za-z0-9._-]* (it names a directory)")
    checks = [
        (c.normal_number > 0, "normalNumber must be > 0"),
        (c.n_sigma >= 0, "nSigma must be >= 0"),
        (c.degradation_percentage >= 0, "degradationPercentage must be >= 0"),
        (c.n_consec >= 1, "nConsecAnomaliesSignifySlow must be >= 1"),
        (c.n_seconds > 0, "nSecondsDoOneDetection must be > 0"),
        (c.cluster_mean_distance > 1, "clusterMeanDistance must be > 1"),
        (c.card_one_node > 0, "cardOneNode must be > 0"),
        (c.slow_node in (0, 1), "SlowNode must be 0 or 1"),
        (c.n_confirm_rounds >= 1, "nConsecSlowRoundsToConfirm must be >= 1"),
        (c.traffic >= 0, "traffic must be >= 0"),
        (c.pattern_window >= 4, "patternWindowSteps must be >= 4"),
        (c.compute_ratio > 1, "computeRatio must be > 1"),
        (c.wait_ratio > 1, "waitRatio must be > 1"),
        (c.rules in RULES, "rules must be one of faultmesh, reference, pattern"),
        (c.peer_window >= 2, "peerWindowSteps must be >= 2"),
        (c.time_window >= 1, "timeWindowSteps must be >= 1"),
        (c.wait_asymmetry > 0, "waitAsymmetry must be > 0"),
        (0 < c.late_share <= 1, "lateShare must be in (0, 1]"),
        (c.wait_z >= 0, "waitZ must be >= 0"),
        (c.node_rise > 0, "nodeRise must be > 0"),
        (0 <= c.io_share < 1, "ioShare must be in [0, 1)"),
        (c.comm_profiling in COMM_PROFILING, "commProfiling must be always or onDemand"),
        (c.confirm_gap >= 0, "confirmGapRounds must be >= 0"),
        (c.gap_spread >= 0, "gapSpread must be >= 0"),
        (c.gap_long_window >= 0, "gapLongWindowSteps must be >= 0"),
        (c.gap_long_spread >= 0, "gapLongSpread must be >= 0"),
        (c.compute_excess > 0, "computeExcess must be > 0"),
        (0 <= c.compute_shift < 1, "computeShift must be in [0, 1)"),
        (0 < c.dp_lag_excess < 1, "dpLagExcess must be in (0, 1)"),
        (c.dp_lag_spread >= 0, "dpLagSpread must be >= 0"),
        (c.dp_long_spread > 0, "dpLongSpread must be > 0"),
        (c.seq_bound >= 0, "seqBound must be >= 0"),
    ]
    for ok, msg in checks:
        if not ok:
            raise FeatConfError(msg)
