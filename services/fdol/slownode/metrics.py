"""Per-step metrics of one rank, computed incrementally from marker records (reference fdol.md §2).

:class:`StepAssembler` pairs start/end records by ``(Id, SourceKind)`` (Name/Domain cached per Id),
classifies ranges (``step <N>``, ``forward``, ``dataloader``, ``save_checkpoint``, communication ops
whose Name is a JSON object) and, when a step is complete, emits one :class:`StepMetrics`:

- ``step_time``: device duration of the step range (host duration when no device records), ns;
- ``zp_device`` / ``zp_host``: TP collective durations: on the rank's ``tp`` group, the op type
  (all-reduce or reduce-scatter) that occurs most in the step, ops with ``count > traffic`` ordered
  by start, skip the first, average the next 3 (device durations; host durations of the same Ids);
- ``pp_device`` / ``pp_host``: device duration of the first send on the ``pp`` group; average host
  duration of all those sends;
- ``dataloader_host``: average host duration of ``dataloader`` ranges starting inside the step;
- ``zp_med`` (faultmesh): median device duration of *all* the step's TP collectives of that op type
  (robust to the first collective after a late PP receive or data load), ns;
- ``fwd_min`` (faultmesh): shortest host ``forward`` range starting inside the step, ns (a
  micro-batch an OS hiccup did not hit);
- ``compute`` (faultmesh): sum of host ``forward`` durations starting inside the step, ns;
- ``comm_wait`` (faultmesh): sum of host durations of all communication ops inside the step, ns;
- ``tp_ops`` (faultmesh): the durations (device, else host; ns) of the TP collectives of that op
  type in start order, except the step's first and the first after each ``forward`` start (those
  absorb a late data load or PP receive): the per-operation barrier waits the wait-asymmetry rule
  compares;
- ``tp_gaps`` (faultmesh): for each of ``tp_ops``, the time from the end of the TP collective before
  it to its start (the same clock: device, else host; ns; 0 when they overlap): the rank's own
  compute of that layer, which its TP peers' waits do not blur (the gap-excess rule compares them);
- ``dp_ops`` / ``dp_gaps`` / ``dp_starts`` (faultmesh, issue 34): for a rank without a TP group,
  its data-parallel collectives: on its ``dp`` group, else (a plain DDP / FSDP job: no PP group) on the default
  group, the op type (all-reduce, reduce-scatter or all-gather: gradient buckets, FSDP shards) that
  occurs most in the step, in start order, except the step's first (it absorbs a late data load):
  their durations (the waits), the gap before each from the end of the previous one, and each
  one's start from the step's start (the rank's arrival; the same clock: device, else host; ns).
  The rank that computes slowest arrives last at each of them and waits least (FALCON ATC'25,
  Holmes / Minder NSDI'25);
- ``ep_gaps`` (faultmesh, issue 34): for a rank without a TP group in an expert-parallel (``exp``)
  group, the gap before each of its expert all-to-alls (dispatch / combine; the most frequent of
  all-to-all, all-gather, reduce-scatter on that group, the step's first left out) from the end of
  the previous one: the all-to-alls block the compute and release the group together, so the gap
  is the rank's own compute of that part of the layer (attention, or its experts).

Missing values are 0 (the detectors ignore 0). Memory is bounded: open ranges, the Name/Domain
cache and buffered ranges are capped; evictions are counted.

Fixes of reference quirks (named on purpose):
- *single TP op per step*: the reference skips the first op and averages the next 3, so a step with
  one TP collective gets no ZP value; here the first op is skipped only when more than one exists.
- *host-only producers*: when a range has no device records its host duration stands in for the
  device one (CPU jobs), instead of the row being dropped.
- *step text match*: the host step range is matched by its parsed step number, not by
  ``LIKE '%step N%'`` (which also matched ``step 1x``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from fdol import strictjson

from .reader import Group
from .records import (
    DOMAIN_COMMUNICATION,
    DOMAIN_DEFAULT,
    END_FLAGS,
    SOURCE_DEVICE,
    SOURCE_HOST,
    START_FLAGS,
    BadInput,
    Record,
)

HOST_ONLY_NAMES = frozenset(("dataloader", "save_checkpoint"))
COLUMNS = (
    "step_time",
    "zp_device",
    "zp_host",
    "pp_device",
    "pp_host",
    "dataloader_host",
    "zp_med",
    "fwd_min",
    "compute",
    "comm_wait",
)


@dataclass(slots=True)
class StepMetrics:
    """One step of one rank; durations in ns, 0 = not measured. ``start_ns``/``end_ns``: host step range."""

    rank: int
    step: int
    start_ns: int
    end_ns: int
    step_time: int = 0
    zp_device: int = 0
    zp_host: int = 0
    pp_device: int = 0
    pp_host: int = 0
    dataloader_host: int = 0
    zp_med: int = 0
    fwd_min: int = 0
    compute: int = 0
    comm_wait: int = 0
    tp_ops: tuple[int, ...] = ()
    tp_gaps: tuple[int, ...] = ()
    dp_ops: tuple[int, ...] = ()
    dp_gaps: tuple[int, ...] = ()
    dp_starts: tuple[int, ...] = ()
    ep_gaps: tuple[int, ...] = ()

    def get(self, column: str) -> int:
        """Value of ``column`` (one of :data:`COLUMNS`)."""
        return getattr(self, column)


@dataclass(slots=True)
class _Comm:
    op: str
    group: str
    count: int
    host: tuple[int, int] | None = None
    device: tuple[int, int] | None = None


@dataclass(slots=True)
class _Step:
    rid: int
    host: tuple[int, int] | None = None
    device: tuple[int, int] | None = None
    open_parts: set[int] = field(default_factory=set)


def parse_comm_name(name: str) -> tuple[str, str, int] | None:
    """``{"opName":..,"groupName":..,"count":"4194304",...}`` -> (opName lower-case, groupName, count)."""
    try:
        obj = strictjson.loads(name)
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    op, group, count = obj.get("opName"), obj.get("groupName"), obj.get("count", "0")
    if not isinstance(op, str) or not isinstance(group, str):
        return None
    try:
        n = int(count)
    except (TypeError, ValueError):
        return None
    return op.lower(), group, n


def _suffix_key(name: str) -> tuple[int, str]:
    tail = name.rsplit("_", 1)[-1]
    return (int(tail) if tail.isdigit() else 1 << 62, name)


def rank_group(groups: dict[str, Group] | None, rank: int, kind: str) -> str | None:
    """Comm name of ``rank``'s group of ``kind`` (tp|pp|dp|default_group) with > 1 ranks: the first
    by numeric suffix."""
    if not groups:
        return None
    keys = [
        k
        for k, g in groups.items()
        if g.group_name == kind and len(g.global_ranks) > 1 and rank in g.global_ranks
    ]
    if not keys:
        return None
    return sorted(keys, key=_suffix_key)[0]


def _mean(xs: list[int]) -> int:
    return round(sum(xs) / len(xs)) if xs else 0


RESTART_GAP_NS = 5 * 10**9  # a step number again after this pause: the job restarted


class StepAssembler:
    """Turns one rank's records into :class:`StepMetrics` (see module doc).

    ``groups`` is a callable returning the rank's current parallel groups (or None); ``traffic``
    filters TP ops by element count (§2). ``feed(records)`` returns the steps completed by them;
    ``flush()`` completes what is left (end of input). Rejections are counted in ``bad``.
    A step is complete when a later step has started and its own records are in, or when a step two
    later has started (its missing parts are then counted ``missing_end``).
    A step number at or below the last emitted one is a restart of the job (``restarts``; steps
    number anew; :meth:`_is_restart`), else ``step_out_of_order``.
    """

    def __init__(
        self,
        rank: int,
        groups: Callable[[], dict[str, Group] | None] = lambda: None,
        *,
        traffic: int = 0,
        bad: BadInput | None = None,
        max_open: int = 8192,
        max_buffered: int = 50_000,
        max_step_ns: int = 3600 * 10**9,
    ) -> None:
        self.rank = rank
        self.groups = groups
        self.traffic = traffic
        self.bad = bad if bad is not None else BadInput()
        self.max_open = max_open
        self.max_buffered = max_buffered
        self.max_step_ns = max_step_ns
        self._meta: dict[int, tuple[str, str]] = {}
        self._seen: dict[int, int] = {}  # records consumed per Id (to drop the meta entry)
        self._open: dict[tuple[int, int], int] = {}
        self._steps: dict[int, _Step] = {}
        self._comm: dict[int, _Comm] = {}
        self._other: list[tuple[str, int, int]] = []  # (name, start, end) host ranges
        self.latest_step = -1
        self.last_emitted = -1
        self._last_end = 0
        self.restarts = 0

    # -- records --------------------------------------------------------------------------------
    def feed(self, records: Iterable[Record]) -> list[StepMetrics]:
        """Consume records; return the steps they completed (ascending step number)."""
        out: list[StepMetrics] = []
        for r in records:
            self._record(r, out)
        return out

    def _record(self, r: Record, out: list[StepMetrics]) -> None:
        if r.flag not in START_FLAGS and r.flag not in END_FLAGS:
            return  # instantaneous markers carry no duration
        meta = self._meta.get(r.id)
        if meta is None:
            if r.name:
                meta = (r.name, r.domain)
                if len(self._meta) >= self.max_open:
                    self._meta.pop(next(iter(self._meta)))
                    self.bad.add("buffer_overflow")
                self._meta[r.id] = meta
        name, domain = meta if meta is not None else ("", "")
        key = (r.id, r.source_kind)
        if r.flag in START_FLAGS:
            if len(self._open) >= self.max_open:
                self._open.pop(next(iter(self._open)))
                self.bad.add("missing_end")
            self._open[key] = r.ts
            if domain != DOMAIN_COMMUNICATION and "step" in name:
                n = _step_number(name)
                if n is None:
                    return
                st = self._steps.get(n)
                if st is None and n <= self.last_emitted and self._is_restart(n, r.ts):
                    self._restart(out)
                if st is None:
                    if n <= self.last_emitted:
                        if r.name:  # count once per range (its first record)
                            self.bad.add("step_out_of_order")
                        return
                    st = self._steps[n] = _Step(r.id)
                st.open_parts.add(r.source_kind)
                if n > self.latest_step:
                    self.latest_step = n
                    self._complete(out)
            return
        start = self._open.pop(key, None)
        done = self._seen.get(r.id, 0) + 2
        expected = 2 if name in HOST_ONLY_NAMES else 4
        if done >= expected:
            self._seen.pop(r.id, None)
            self._meta.pop(r.id, None)
        else:
            self._seen[r.id] = done
        if start is None:
            self.bad.add("orphan_end")
            return
        if r.ts < start:
            self.bad.add("negative_duration")
            return
        if not name:
            self.bad.add("unknown_name")
            return
        self._range(name, domain, r.source_kind, start, r.ts, r.id, out)

    def _range(
        self, name: str, domain: str, sk: int, start: int, end: int, rid: int, out: list[StepMetrics]
    ) -> None:
        if domain == DOMAIN_COMMUNICATION:
            parsed = parse_comm_name(name)
            if parsed is None:
                self.bad.add("bad_comm_name")
                return
            c = self._comm.get(rid)
            if c is None:
                if len(self._comm) >= self.max_buffered:
                    self._comm.pop(next(iter(self._comm)))
                    self.bad.add("buffer_overflow")
                c = self._comm[rid] = _Comm(*parsed)
            if sk == SOURCE_DEVICE:
                c.device = (start, end)
            else:
                c.host = (start, end)
            return
        if domain not in (DOMAIN_DEFAULT, ""):
            self.bad.add("unknown_name")
            return
        if "step" in name:
            n = _step_number(name)
            if n is None:
                self.bad.add("bad_step_name")
                return
            st = self._steps.get(n)
            if st is None:
                return  # out of order (counted at its start)
            if sk == SOURCE_DEVICE:
                st.device = (start, end)
            else:
                st.host = (start, end)
            st.open_parts.discard(sk)
            self._complete(out)
            return
        if name in ("forward", "dataloader", "save_checkpoint"):
            if sk == SOURCE_HOST:
                if len(self._other) >= self.max_buffered:
                    del self._other[: len(self._other) // 2]
                    self.bad.add("buffer_overflow")
                self._other.append((name, start, end))
            return
        self.bad.add("unknown_name")

    # -- steps ----------------------------------------------------------------------------------
    def _complete(self, out: list[StepMetrics]) -> None:
        for n in sorted(self._steps):
            st = self._steps[n]
            if n >= self.latest_step:
                break
            ready = not st.open_parts and (st.host or st.device)
            if not ready and self.latest_step < n + 2:
                break
            del self._steps[n]
            if st.open_parts:
                self.bad.add("missing_end", len(st.open_parts))
                for sk in st.open_parts:
                    self._open.pop((st.rid, sk), None)
            if st.host is None and st.device is None:
                continue
            m = self._metrics(n, st)
            if m is not None:
                out.append(m)

    def _is_restart(self, n: int, ts: int) -> bool:
        """A step start numbered at or below the last emitted one is the job restarting when it
        starts after that step ended and is step 0 or 1 (the counter starts over) or comes
        ``RESTART_GAP_NS`` later (a process restart -- spawn, communicator init, checkpoint load
        -- takes longer than that; a re-sent or reordered record does not)."""
        return ts > self._last_end and (n <= 1 or ts - self._last_end >= RESTART_GAP_NS)

    def _restart(self, out: list[StepMetrics]) -> None:
        """The job restarted (its step numbers start over, later in time than the last step
        emitted): complete the old run's steps (what is missing counted as usual), then number
        anew (``restarts`` counts them; the detectors start their baselines again)."""
        out.extend(self.flush())
        self.latest_step = self.last_emitted = -1
        self.restarts += 1

    def flush(self) -> list[StepMetrics]:
        """Complete every buffered step (end of input). Returns them."""
        out: list[StepMetrics] = []
        self.latest_step += 2
        self._complete(out)
        self.latest_step -= 2
        return out

    def _metrics(self, n: int, st: _Step) -> StepMetrics | None:
        host = st.host or st.device
        dev = st.device or st.host
        assert host is not None and dev is not None
        hs, he = host
        ds, de = dev
        if he - hs > self.max_step_ns or de - ds > self.max_step_ns or hs < self._last_end - 1_000_000:
            self.bad.add("clock_jump")
            self._prune(max(he, de))
            return None
        self._last_end = he
        self.last_emitted = n
        m = StepMetrics(self.rank, n, hs, he, step_time=de - ds)
        groups = self.groups()
        tp = rank_group(groups, self.rank, "tp")
        pp = rank_group(groups, self.rank, "pp")
        in_step = []
        for c in self._comm.values():
            if c.device is not None and ds <= c.device[0] <= de:
                in_step.append(c)
            elif c.device is None and c.host is not None and hs <= c.host[0] <= he:
                in_step.append(c)
        m.comm_wait = sum(c.host[1] - c.host[0] for c in in_step if c.host is not None)
        if tp is not None:
            ops = [c for c in in_step if c.group == tp and c.count > self.traffic]
            ar = [c for c in ops if "allreduce" in c.op]
            rs = [c for c in ops if "reducescatter" in c.op]
            chosen = ar if len(ar) >= len(rs) else rs
            chosen.sort(key=lambda c: (c.device or c.host)[0])  # type: ignore[index]
            seq = [(c.device or c.host)[1] - (c.device or c.host)[0] for c in chosen]  # type: ignore[index]
            m.tp_ops, m.tp_gaps = _after_first(
                chosen, seq, [s for name, s, _ in self._other if name == "forward" and hs <= s <= he]
            )
            durs = sorted(seq)
            if durs:
                h = len(durs) // 2
                m.zp_med = durs[h] if len(durs) % 2 else (durs[h - 1] + durs[h]) // 2
            if len(chosen) > 1:
                chosen = chosen[1:]
            chosen = chosen[:3]
            m.zp_device = _mean([(c.device or c.host)[1] - (c.device or c.host)[0] for c in chosen])  # type: ignore[index]
            m.zp_host = _mean([c.host[1] - c.host[0] for c in chosen if c.host is not None])
        dp = None if tp is not None else rank_group(groups, self.rank, "dp")
        if tp is None and dp is None and pp is None:  # a plain DP job (not a pipeline's stages)
            dp = rank_group(groups, self.rank, "default_group")
        if dp is not None:
            mine = [c for c in in_step if c.group == dp and c.count > self.traffic]
            m.dp_ops, m.dp_gaps, m.dp_starts = _per_op(mine, hs, ds, DP_OPS)
        ep = None if tp is not None else rank_group(groups, self.rank, "exp")
        if ep is not None:
            mine = [c for c in in_step if c.group == ep and c.count > self.traffic]
            m.ep_gaps = _per_op(mine, hs, ds, EP_OPS)[1]
        if pp is not None:
            sends = [c for c in in_step if c.group == pp and "send" in c.op]
            sends.sort(key=lambda c: (c.device or c.host)[0])  # type: ignore[index]
            if sends:
                first = sends[0].device or sends[0].host
                m.pp_device = first[1] - first[0]  # type: ignore[index]
                m.pp_host = _mean([c.host[1] - c.host[0] for c in sends if c.host is not None])
        dl = [e - s for name, s, e in self._other if name == "dataloader" and hs <= s <= he]
        m.dataloader_host = _mean(dl)
        fwd = [e - s for name, s, e in self._other if name == "forward" and hs <= s <= he]
        m.compute = sum(fwd)
        m.fwd_min = min(fwd, default=0)
        self._prune(max(he, de))
        return m

    def _prune(self, end: int) -> None:
        self._other = [x for x in self._other if x[1] > end]
        for rid in [rid for rid, c in self._comm.items() if (c.device or c.host or (end + 1, 0))[0] <= end]:
            del self._comm[rid]


def _after_first(
    chosen: list[_Comm], durs: list[int], fwd_starts: list[int]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(``durs`` (of ``chosen``, in start order) without the first op and the first op after each
    forward start (host start times; device when no host record), the gap before each kept op:
    its start minus the previous op's end on the device clock, else host; 0 when negative)."""
    starts = sorted(fwd_starts)
    out = []
    gaps = []
    fi = 0
    for i, (c, d) in enumerate(zip(chosen, durs, strict=True)):
        t = (c.host or c.device)[0]  # type: ignore[index]
        advanced = False
        while fi < len(starts) and starts[fi] <= t:
            fi += 1
            advanced = True
        if i and not advanced:
            out.append(d)
            prev = chosen[i - 1]
            a, b = (c.device, prev.device) if c.device and prev.device else (c.host, prev.host)
            gaps.append(max(0, a[0] - b[1]) if a and b else 0)
    return tuple(out), tuple(gaps)


DP_OPS = ("allreduce", "reducescatter", "allgather")
EP_OPS = ("alltoall", "allgather", "reducescatter")


def _per_op(comms: list[_Comm], hs: int, ds: int, kinds: tuple[str, ...]) -> tuple[tuple[int, ...], ...]:
    """(durations, gaps, starts) of a step's collectives on one group (``dp_*``, ``ep_gaps``:
    module doc; ``hs`` / ``ds``: the step's host / device start, ns): the most frequent of the op
    ``kinds`` (ties: the first), in start order, without the first; device clock, else host; a gap
    is 0 when the op started before the previous one ended (queued)."""
    by_type: dict[str, list[_Comm]] = {}
    for c in comms:
        for op in kinds:
            if op in c.op:
                by_type.setdefault(op, []).append(c)
                break
    if not by_type:
        return (), (), ()
    chosen = max(by_type.values(), key=len)
    spans = sorted((c.device, ds) if c.device else (c.host, hs) for c in chosen)  # type: ignore[misc]
    ops = tuple(e - s for (s, e), _ in spans[1:])
    gaps = tuple(max(0, s - pe) for ((s, _), _), ((_, pe), _) in zip(spans[1:], spans, strict=False))
    return ops, gaps, tuple(max(0, s - base) for (s, _), base in spans[1:])


def _step_number(name: str) -> int | None:
    parts = name.split()
    if len(parts) < 2:
        return None
    try:
        return int(parts[1])
    except ValueError:
        return None
