"""A realistic tensor/pipeline/data-parallel training simulator that writes lightweight-profiling records.

Used by ``bench/slownode_realistic.py`` and by ``tests/fdol/slownode/test_realistic.py``. It is
independent of the detectors: it models how Megatron-style training behaves and writes the
*same* marker records the reader parses (reference fdol.md §1.3: ``step <N>``, ``forward``,
``dataloader``, ``save_checkpoint`` and communication ranges, host + device records, only the first
record of an Id carrying Name/Domain) plus each rank's ``parallel_group.json`` (§1.5).

Layout (Megatron order): ``rank = pp * (DP * TP) + dp * TP + tp`` — TP is the fastest index and
lives inside one node of ``node_size`` cards, PP stages across nodes, DP the rest.

Timing of one step (ns, all ranks):

- *data loader*: each rank loads for ``dl`` (host range ``dataloader``); its TP group starts its
  first forward when its last member is ready;
- *1F1B pipeline* over ``micro`` micro-batches and ``pp`` stages: stage s runs
  ``min(pp - s - 1, micro)`` warm-up forwards, then one-forward-one-backward, then the cool-down
  backwards; a forward of micro-batch m on stage s > 0 starts when the activation sent by stage
  s - 1 arrived (per TP rank: each TP rank receives its own shard, so a slow PP link delays one rank);
- *per-operation TP barriers inside the forward range*: a forward is ``k_ops`` segments of compute
  (``t_seg`` x the card's speed factor x per-op noise), each followed by a TP all-reduce that
  completes ``t_tp`` after the last member arrived. A member's all-reduce range runs from its own
  arrival to the completion, so a slow card arrives last and *waits least*, its peers wait more,
  and every member shows the same forward time. Backward is ``2 x`` the compute with the same
  barriers (not recorded, as in the reference producer, which has no backward marker);
- *PP send*: after each forward (backward) a stage sends activations (gradients) to the next
  (previous) stage: ``t_pp`` x link factor (``HcclSend`` ranges on the PP group);
- *DP sync*: every rank ends the step with an all-reduce over its DP group; the step of every rank
  ends at the same time (``max`` over ranks of the last backward + ``t_dp``) — optimizer step and
  global gradient norm synchronize the job;
- *cards differ*: each card's sustained speed is its own (``card_sd``, 1 % standard deviation cut
  at 2.5 of them, as bench/trainsim_dp.py: GPUs of one model differ by a few percent under their
  power and thermal limits, Sinha et al., SC'22; acceptance tests screen out the cards beyond);
  drawn from its own random stream, so the other draws stay those of a job without the spread;
- *noise*: per-op compute noise, per-step noise, OS hiccups (a rank loses ``hiccup_ms`` in one
  segment with probability ``hiccup_p`` per step), a checkpoint (``save_checkpoint`` host range)
  every ``ckpt_every`` steps;
- *shared CPUs* (``preempt_p`` > 0, :data:`SHARED_BOX`): more ranks than cores — every segment
  and data load may lose an exponential ``preempt_ms`` to preemption, each rank's speed follows a
  persistent regime (AR(1), ``regime_sd``/``regime_rho``) and the whole box's load drifts
  (``load_sd``/``load_rho``), as measured on the real 4-rank torch job on a 2-core box.

Faults (:class:`Fault`, from ``onset`` on): ``card`` (one rank's compute x factor), ``thermal``
(one rank ramps linearly to factor over ``ramp`` steps), ``host`` (a node's host side x factor:
communication launch, data loading, a little compute), ``dataloader`` (one rank's loader + ms),
``pp_link`` (one rank's PP sends x factor), ``tp_domain`` (one TP group's all-reduce x factor),
``node`` (every card of a node x factor), ``intermittent`` (one rank x factor on steps where
``(step - onset) % period < on``), cluster-wide ``all_compute`` / ``all_network`` / ``all_storage``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

MS = 1_000_000

_TEMPLATE = (
    '{"Kind":1,"Flag":%d,"SourceKind":%d,"Timestamp":%d,"Id":%d,'
    '"MsptiObjectId":{"Pt":{"ProcessId":%d,"ThreadId":1},"Ds":{"DeviceId":%d,"StreamId":0}},'
    '"Name":%s,"Domain":"%s"}\n'
)


@dataclass
class Layout:
    """TP x PP x DP with TP inside a node of ``node_size`` cards."""

    tp: int
    pp: int
    dp: int
    node_size: int = 8

    @property
    def n(self) -> int:
        return self.tp * self.pp * self.dp

    def rank(self, p: int, d: int, t: int) -> int:
        return p * self.dp * self.tp + d * self.tp + t

    def coords(self, r: int) -> tuple[int, int, int]:
        p, rest = divmod(r, self.dp * self.tp)
        d, t = divmod(rest, self.tp)
        return p, d, t

    def node_of(self, r: int) -> int:
        return r // self.node_size

    @property
    def nodes(self) -> int:
        return -(-self.n // self.node_size)

    def node_ranks(self, node: int) -> list[int]:
        return list(range(node * self.node_size, min(self.n, (node + 1) * self.node_size)))

    def groups(self) -> dict[str, tuple[str, list[int]]]:
        """comm name -> (kind, global ranks) for the tp, pp and dp groups."""
        out: dict[str, tuple[str, list[int]]] = {}
        i = 0
        for p in range(self.pp):
            for d in range(self.dp):
                out[f"tp_{i}"] = ("tp", [self.rank(p, d, t) for t in range(self.tp)])
                i += 1
        for d in range(self.dp):
            for t in range(self.tp):
                out[f"pp_{i}"] = ("pp", [self.rank(p, d, t) for p in range(self.pp)])
                i += 1
        for p in range(self.pp):
            for t in range(self.tp):
                out[f"dp_{i}"] = ("dp", [self.rank(p, d, t) for d in range(self.dp)])
                i += 1
        return out


def layout_for(n: int) -> Layout:
    """The layout used for a job size (8 -> TP 4 x DP 2 on one node; larger: TP 8, PP up to 8)."""
    if n <= 8:
        return Layout(tp=4, pp=1, dp=max(1, n // 4))
    nodes = n // 8
    pp = 2 if nodes <= 2 else 4 if nodes <= 32 else 8
    return Layout(tp=8, pp=pp, dp=nodes // pp)


RESTART_S = 60  # seconds from a failure to the first step of the restarted job (MegaScale NSDI'24)
RESTART_WARM = 3  # warm-up steps after a restart


@dataclass
class Fault:
    """A fault injected from ``onset`` (see module doc for the kinds). ``target``: rank, node or TP
    group index, by kind."""

    kind: str = "none"
    target: int = 0
    factor: float = 1.2
    onset: int = 30
    ramp: int = 20
    add_ms: float = 25.0
    period: int = 4
    on: int = 2


@dataclass
class SimConf:
    """Timing (ms) and noise of the simulated job."""

    micro: int = 4
    k_ops: int = 4
    t_seg: float = 3.5
    t_tp: float = 1.0
    t_pp: float = 1.5
    t_dp: float = 15.0
    dl: float = 5.0
    op_noise: float = 0.02
    step_noise: float = 0.01
    card_sd: float = 0.01
    hiccup_p: float = 0.005
    hiccup_ms: float = 20.0
    ckpt_every: int = 0
    ckpt_ms: float = 300.0
    launch_ms: float = 0.05
    seed: int = 0
    bwd_mult: float = 2.0
    preempt_p: float = 0.0
    preempt_ms: float = 5.0
    regime_sd: float = 0.0
    regime_rho: float = 0.97
    load_sd: float = 0.0
    load_rho: float = 0.99


# The 4-rank PyTorch job of faultmesh.profiler.example_job on a 2-core box (4 ranks share 2 cores),
# calibrated on its recorded profiling (bench/slownode_torch.py --records prints both side by
# side): one micro-batch whose forward range also holds the backward (the job's ``forward`` range
# spans forward + backward: ``bwd_mult`` small), 4 per-layer TP all-reduces, a gloo DP all-reduce;
# wall time ~2.5x the CPU time; a rank is preempted in ~35 % of its segments for an exponential
# few ms (per-op waits of healthy TP members spread 0.4x-2x); per-rank slowness regimes that last
# a few to tens of steps (the scheduler keeps one member of a pair behind); the box's load drifts
# (other tenants). The regimes' persistence is set on how far a healthy TP pair's mean gap excess
# drifts over 40 and over 160 steps (the gap rule's window and long horizon, fdol/slownode/peers.py):
# 8 pairs of 6 recorded 400-step runs of the real job (2 and 4 ranks, box load 3-9) drifted at
# most 0.05-0.18 (median 0.1) over 40 steps and 0.02-0.06 (median 0.03) over 160; the former
# regime_rho 0.96 / regime_sd 0.05 drifted 0.14 / 0.07 (medians, 8 seeds), these 0.09 / 0.04.
SHARED_BOX = dict(
    card_sd=0.0,  # CPU cores of one box: the regimes below are their differences
    micro=1,
    k_ops=4,
    t_seg=20.0,
    t_tp=2.0,
    t_dp=5.0,
    dl=3.0,
    bwd_mult=0.05,
    op_noise=0.08,
    step_noise=0.02,
    hiccup_p=0.0,
    preempt_p=0.35,
    preempt_ms=7.0,
    regime_sd=0.06,
    regime_rho=0.7,
    load_sd=0.02,
    load_rho=0.99,
)


def shared_box_layout() -> Layout:
    """The example job's layout: TP 2 x DP 2, two "nodes" of 2 ranks."""
    return Layout(tp=2, pp=1, dp=2, node_size=2)


@dataclass
class Sim:
    """Generates steps of one job and writes their records (see module doc)."""

    layout: Layout
    conf: SimConf = field(default_factory=SimConf)
    fault: Fault = field(default_factory=Fault)
    second: int = -1  # kind ``card``: a second slow rank (two faults at once)
    restart_at: int = 0  # the job restarts at this step (:meth:`step_number`); 0: never

    def step_number(self, i: int) -> int:
        """The step number recorded for the ``i``-th step run: from 1 again after a restart (the
        restarted processes count anew) -- after ``RESTART_S`` seconds away and ``RESTART_WARM``
        warm-up steps (every rank's compute x1.5: autotuning, communicator set-up)."""
        return i - self.restart_at + 1 if 0 < self.restart_at <= i else i

    def truth(self) -> dict:
        """:func:`truth` of this job, with :attr:`second`."""
        t = truth(self)
        return {"ranks": sorted({*t["ranks"], self.second})} if self.second >= 0 and "ranks" in t else t

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.conf.seed)
        lay0 = self.layout
        self._regime = np.zeros((lay0.pp, lay0.dp, lay0.tp))  # log slowness per rank (AR(1))
        self._load = 0.0  # log load of the box (AR(1))
        self.t = 1_700_000_000 * 10**9
        self.next_id = 1
        self.step = 0
        lay = self.layout
        self._coords = np.array([lay.coords(r) for r in range(lay.n)])
        sd = self.conf.card_sd  # the cards' own speeds, from a stream of their own
        speed = np.random.default_rng(self.conf.seed + 7777).normal(0, sd, (lay.pp, lay.dp, lay.tp))
        self._speed = 1 + np.clip(speed, -2.5 * sd, 2.5 * sd)
        self._groups = lay.groups()
        self._tp_name = {}
        self._pp_name = {}
        self._dp_name = {}
        for name, (kind, ranks) in self._groups.items():
            for r in ranks:
                if kind == "tp":
                    self._tp_name[r] = name
                elif kind == "pp":
                    self._pp_name[r] = name
                else:
                    self._dp_name[r] = name

    # -- factors --------------------------------------------------------------------------------
    def _factors(self, step: int):
        """Per-rank arrays in [pp, dp, tp] shape: compute, host, link, tp-domain factor; dl add (ms)."""
        lay, f = self.layout, self.fault
        shape = (lay.pp, lay.dp, lay.tp)
        comp = np.ones(shape)
        host = np.ones(shape)
        link = np.ones(shape)
        tpf = np.ones((lay.pp, lay.dp))
        dl_add = np.zeros(shape)
        net = 1.0
        store = 1.0
        if step >= f.onset and f.kind != "none":
            k = f.kind

            def at(r: int):
                return tuple(lay.coords(r))

            if k == "card":
                comp[at(f.target)] *= f.factor
                if self.second >= 0:
                    comp[at(self.second)] *= f.factor
            elif k == "thermal":
                x = min(1.0, (step - f.onset + 1) / max(1, f.ramp))
                comp[at(f.target)] *= 1 + (f.factor - 1) * x
            elif k == "intermittent":
                if (step - f.onset) % f.period < f.on:
                    comp[at(f.target)] *= f.factor
            elif k == "host":
                for r in lay.node_ranks(f.target):
                    host[at(r)] *= f.factor
                    comp[at(r)] *= 1 + 0.03 * (f.factor - 1)
            elif k == "dataloader":
                dl_add[at(f.target)] += f.add_ms
            elif k == "pp_link":
                link[at(f.target)] *= f.factor
            elif k == "tp_domain":
                p, d, _ = at(f.target * lay.tp)
                tpf[p, d] *= f.factor
            elif k == "node":
                for r in lay.node_ranks(f.target):
                    comp[at(r)] *= f.factor
            elif k == "all_compute":
                comp *= f.factor
            elif k == "all_network":
                net = f.factor
            elif k == "all_storage":
                store = f.factor
        return comp, host, link, tpf * net, dl_add, net, store

    # -- one step -------------------------------------------------------------------------------
    def run_step(self, comm: bool = True, emit: str = "records"):
        """Simulate one step. ``emit="records"``: the record lines per rank ({rank: [bytes]});
        ``emit="metrics"``: the :class:`StepMetrics` per rank the reader would compute from those
        records (the fast path for large jobs; tests check both agree). ``comm``: communication
        markers on."""
        c, lay, rng = self.conf, self.layout, self.rng
        P, D, T, M, K = lay.pp, lay.dp, lay.tp, c.micro, c.k_ops
        step = self.step
        comp, host, link, tpf, dl_add, net, store = self._factors(step)
        comp = comp * self._speed
        if self.restart_at and step == self.restart_at:
            self.t += RESTART_S * 10**9
        if self.restart_at and 0 <= step - self.restart_at < RESTART_WARM:
            comp = comp * 1.5
        if c.regime_sd or c.load_sd:  # shared-CPU host: persistent per-rank regimes, box load
            self._regime = c.regime_rho * self._regime + rng.normal(
                0, c.regime_sd * np.sqrt(1 - c.regime_rho**2), self._regime.shape
            )
            self._load = c.load_rho * self._load + rng.normal(0, c.load_sd)
            comp = comp * np.exp(self._regime + min(0.7, max(-0.3, self._load)))
        step_f = 1 + rng.normal(0, c.step_noise)
        t0 = self.t
        out: dict[int, list[bytes]] = {r: [] for r in range(lay.n)}
        # data loader (host range), starting 0.1 ms into the step
        dl = (c.dl * host * store * (1 + rng.normal(0, 0.05, (P, D, T))) + dl_add) * MS
        if c.preempt_p:
            dl = dl + self._preempt((P, D, T))
        ready = t0 + int(0.1 * MS) + dl  # [P, D, T]
        free = ready.copy()  # per rank: when it can start its next op
        hic = rng.random((P, D, T, 2 * M)) < c.hiccup_p
        # schedule per stage: list of ("F"|"B", m)
        sched = []
        for s in range(P):
            w = min(P - s - 1, M)
            ops = [("F", m) for m in range(w)]
            for m in range(M - w):
                ops += [("F", w + m), ("B", m)]
            ops += [("B", m) for m in range(M - w, M)]
            sched.append(ops)
        f_arr = np.zeros((P, M, D, T))  # forward activation arrival at the next stage
        b_arr = np.zeros((P, M, D, T))  # gradient arrival at the previous stage
        done = [0] * P
        fwd_rec: list = []  # (p, m, start[D,T], end[D,T], arrive[K,D,T], complete[K,D,T])
        sends: list = []  # (p, start[D,T], end[D,T])
        remaining = sum(len(s) for s in sched)
        while remaining:
            progressed = False
            for s in range(P):
                if done[s] >= len(sched[s]):
                    continue
                kind, m = sched[s][done[s]]
                if kind == "F":
                    if s > 0 and not f_arr[s - 1, m].any():
                        continue
                    dep = f_arr[s - 1, m] if s > 0 else 0
                    mult = 1.0
                else:
                    if s < P - 1 and not b_arr[s + 1, m].any():
                        continue
                    dep = b_arr[s + 1, m] if s < P - 1 else 0
                    mult = c.bwd_mult
                start = np.maximum(free[s], dep)
                cur = start.astype(float)
                arrive = np.zeros((K, D, T))
                complete = np.zeros((K, D, T))
                for k in range(K):
                    seg = c.t_seg * mult * comp[s] * (1 + rng.normal(0, c.op_noise, (D, T))) * MS
                    if k == 0:
                        seg = seg + hic[s, :, :, done[s]] * c.hiccup_ms * MS
                    if c.preempt_p:
                        seg = seg + self._preempt((D, T))
                    a = cur + seg
                    arrive[k] = a
                    fin = a.max(axis=1) + c.t_tp * tpf[s] * (1 + rng.normal(0, 0.03, D)) * MS
                    done_at = np.repeat(fin[:, None], T, axis=1)
                    if c.preempt_p:  # a waiting member must be scheduled again to leave the op
                        done_at = done_at + self._preempt((D, T))
                    complete[k] = done_at
                    cur = done_at
                end = cur
                send_t = c.t_pp * net * link[s] * (1 + rng.normal(0, 0.05, (D, T))) * MS
                if kind == "F":
                    fwd_rec.append((s, m, start, end, arrive, complete))
                    if s < P - 1:
                        sends.append((s, end, end + send_t))
                        f_arr[s, m] = end + send_t
                        end = end + send_t
                else:
                    if s > 0:
                        sends.append((s, end, end + send_t))
                        b_arr[s, m] = end + send_t
                        end = end + send_t
                free[s] = end
                done[s] += 1
                remaining -= 1
                progressed = True
            assert progressed, "1F1B schedule deadlock"
        last = free.max()
        dp_t = c.t_dp * net * (1 + rng.normal(0, 0.03)) * MS
        dp_start = free
        step_end = max(int((last + dp_t - t0) * step_f) + t0, int(last) + MS)
        ckpt = c.ckpt_every and step > 0 and step % c.ckpt_every == 0
        if ckpt:
            step_end += int(c.ckpt_ms * store * MS)
        if emit == "metrics":
            res = self._metrics(
                self.step_number(step), t0, step_end, ready, fwd_rec, sends, host, comm, ckpt, store
            )
            self.t = step_end + int(0.2 * MS)
            self.step += 1
            return res
        # -- records ---------------------------------------------------------------------------
        coords = self._coords
        for r in range(lay.n):
            p, d, t = coords[r]
            o = out[r]
            dev = int(r % 8)
            sid = self._rng4(
                o, r, dev, f'"step {self.step_number(step)}"', "default", t0, step_end, open_only=True
            )
            self._rng2(o, r, dev, '"dataloader"', t0 + int(0.1 * MS), int(ready[p, d, t]))
            for s, _m, start, end, arrive, complete in fwd_rec:
                if s != p:
                    continue
                self._rng4(o, r, dev, '"forward"', "default", int(start[d, t]), int(end[d, t]))
                if comm:
                    name = self._comm_name("HcclAllReduce", self._tp_name[r], 4194304)
                    for k in range(K):
                        a, e = int(arrive[k, d, t]), int(complete[k, d, t])
                        self._rng4(
                            o,
                            r,
                            dev,
                            name,
                            "communication",
                            a,
                            e,
                            host_end=a + int(c.launch_ms * host[p, d, t] * MS),
                        )
            if comm and P > 1:
                name = self._comm_name("HcclSend", self._pp_name[r], 1048576)
                for s, a, e in sends:
                    if s == p:
                        ai, ei = int(a[d, t]), int(e[d, t])
                        self._rng4(
                            o,
                            r,
                            dev,
                            name,
                            "communication",
                            ai,
                            ei,
                            host_end=ai + int(c.launch_ms * host[p, d, t] * MS),
                        )
            if comm and D > 1:
                name = self._comm_name("HcclAllReduce", self._dp_name[r], 16777216)
                a = int(dp_start[p, d, t])
                self._rng4(
                    o, r, dev, name, "communication", a, step_end - 1, host_end=a + int(c.launch_ms * MS)
                )
            if ckpt:
                self._rng2(
                    o, r, dev, '"save_checkpoint"', step_end - int(c.ckpt_ms * store * MS), step_end - 1
                )
            o.append((_TEMPLATE % (32, 1, step_end, sid, r, dev, '"NULL"', "NULL")).encode())
            o.append((_TEMPLATE % (32, 0, step_end, sid, r, dev, '"NULL"', "NULL")).encode())
        self.t = step_end + int(0.2 * MS)
        self.step += 1
        return out

    def _metrics(self, step, t0, step_end, ready, fwd_rec, sends, host, comm, ckpt, store):
        """Per-rank :class:`StepMetrics` equal to what the reader computes from the records."""
        from fdol.slownode.metrics import StepMetrics

        c, lay = self.conf, self.layout
        P, D, T, K = lay.pp, lay.dp, lay.tp, c.k_ops
        dl0 = t0 + int(0.1 * MS)
        launch = (c.launch_ms * host * MS).astype(np.int64)  # [P, D, T]
        out: dict[int, StepMetrics] = {}
        for p in range(P):
            recs = [x for x in fwd_rec if x[0] == p]
            durs = [x[3].astype(np.int64) - x[2].astype(np.int64) for x in recs]
            comp = sum(durs)
            fmin = np.min(np.stack(durs), axis=0)
            ops = np.stack(
                [x[5][k].astype(np.int64) - x[4][k].astype(np.int64) for x in recs for k in range(K)]
            )  # [ops, D, T] chronological
            rest = [i for i in range(len(ops)) if i % K]  # not the first op of a forward (metrics.py)
            gaps = (
                np.stack(
                    [
                        x[4][k].astype(np.int64) - x[5][k - 1].astype(np.int64)
                        for x in recs
                        for k in range(1, K)
                    ]
                )
                if K > 1
                else None
            )  # [ops, D, T]: own compute between TP collectives
            sel = ops[1:4] if len(ops) > 1 else ops[:1]
            zp = np.round(sel.mean(axis=0)).astype(np.int64)
            srt = np.sort(ops, axis=0)
            h = len(ops) // 2
            med = srt[h] if len(ops) % 2 else (srt[h - 1] + srt[h]) // 2
            my_sends = [(a.astype(np.int64), e.astype(np.int64)) for s, a, e in sends if s == p]
            for d in range(D):
                for t in range(T):
                    r = lay.rank(p, d, t)
                    lt = int(launch[p, d, t])
                    m = StepMetrics(r, step, t0, step_end, step_time=step_end - t0)
                    m.dataloader_host = int(ready[p, d, t]) - dl0
                    m.compute = int(comp[d, t])
                    m.fwd_min = int(fmin[d, t])
                    if comm:
                        m.tp_ops = tuple(int(x) for x in ops[:, d, t][rest])
                        if gaps is not None:
                            m.tp_gaps = tuple(max(0, int(x)) for x in gaps[:, d, t])
                        m.zp_device = int(zp[d, t])
                        m.zp_med = int(med[d, t])
                        m.zp_host = lt
                        wait = lt * len(ops)
                        if P > 1 and my_sends:
                            a, e = my_sends[0]
                            m.pp_device = int(e[d, t] - a[d, t])
                            m.pp_host = lt
                            wait += lt * len(my_sends)
                        if D > 1:
                            wait += int(c.launch_ms * MS)
                        m.comm_wait = wait
                    out[r] = m
        return out

    def _preempt(self, shape) -> np.ndarray:
        """ns lost to preemption per rank: with probability ``preempt_p`` an exponential
        ``preempt_ms``-mean delay (a timeslice given to another process of the shared cores)."""
        c = self.conf
        hit = self.rng.random(shape) < c.preempt_p
        return hit * self.rng.exponential(c.preempt_ms, shape) * MS

    # -- record helpers -------------------------------------------------------------------------
    def _comm_name(self, op: str, group: str, count: int) -> str:
        return json.dumps(
            json.dumps(
                {"streamId": "0", "count": str(count), "dataType": "bfp16", "opName": op, "groupName": group},
                separators=(",", ":"),
            )
        )

    def _rng4(self, o, r, dev, name, domain, a, e, open_only=False, host_end=None) -> int:
        rid = self.next_id
        self.next_id += 1
        tpl = _TEMPLATE
        o.append((tpl % (16, 0, a, rid, r, dev, name, domain)).encode())
        o.append((tpl % (16, 1, a, rid, r, dev, '"NULL"', "NULL")).encode())
        if not open_only:
            o.append((tpl % (32, 1, e, rid, r, dev, '"NULL"', "NULL")).encode())
            o.append(
                (tpl % (32, 0, e if host_end is None else host_end, rid, r, dev, '"NULL"', "NULL")).encode()
            )
        return rid

    def _rng2(self, o, r, dev, name, a, e) -> None:
        rid = self.next_id
        self.next_id += 1
        o.append((_TEMPLATE % (2, 0, a, rid, r, dev, name, "default")).encode())
        o.append((_TEMPLATE % (4, 0, e, rid, r, dev, '"NULL"', "NULL")).encode())

    # -- files ----------------------------------------------------------------------------------
    def write_groups(self, job_dir: Path) -> None:
        """Each rank's parallel_group.json (its tp/pp/dp groups and the default group)."""
        lay = self.layout
        for r in range(lay.n):
            d = Path(job_dir) / str(r)
            d.mkdir(parents=True, exist_ok=True)
            mine = {
                name: {"group_name": kind, "group_rank": ranks.index(r), "global_ranks": ranks}
                for name, (kind, ranks) in self._groups.items()
                if r in ranks
            }
            mine["0"] = {"group_name": "default_group", "group_rank": r, "global_ranks": list(range(lay.n))}
            (d / "parallel_group.json").write_text(json.dumps(mine))

    def write_steps(self, job_dir: Path, n_steps: int, comm: bool = True) -> None:
        """Simulate ``n_steps`` steps and append their records to each rank's data file."""
        job_dir = Path(job_dir)
        buf: dict[int, list[bytes]] = {r: [] for r in range(self.layout.n)}
        for _ in range(n_steps):
            for r, lines in self.run_step(comm).items():
                buf[r] += lines
        for r, lines in buf.items():
            with open(job_dir / str(r) / "1700000000", "ab") as fh:
                fh.write(b"".join(lines))

    def placement(self) -> dict[str, list[int]]:
        """node name -> its global ranks."""
        return {f"node-{i}": self.layout.node_ranks(i) for i in range(self.layout.nodes)}


def truth(sim: Sim) -> dict:
    """What a correct detector names for the sim's fault: {"ranks": [...]} for compute kinds,
    or {"domain"|"send"|"host"|"io": ...}; {} when nobody should be named."""
    f, lay = sim.fault, sim.layout
    if f.kind in ("card", "thermal", "intermittent"):
        return {"ranks": [f.target]}
    if f.kind == "node":
        return {"ranks": lay.node_ranks(f.target)}
    if f.kind == "tp_domain":
        return {"domain": list(range(f.target * lay.tp, (f.target + 1) * lay.tp))}
    if f.kind == "pp_link":
        return {"send": f.target}
    if f.kind == "host":
        return {"host": f"node-{f.target}"}
    if f.kind == "dataloader":
        return {"io": f.target}
    return {}


__all__ = [
    "MS",
    "SHARED_BOX",
    "Fault",
    "Layout",
    "Sim",
    "SimConf",
    "layout_for",
    "shared_box_layout",
    "truth",
]
