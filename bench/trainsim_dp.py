"""A data-parallel / FSDP / mixture-of-experts training simulator that writes lightweight-profiling
records (the same record format and ``parallel_group.json`` as bench/trainsim_tp.py, whose record
helpers it borrows). Used by bench/slownode_dp.py; independent of the detectors.

How such jobs run (modelled, not fitted to any detector):

- *No TP group.* Every rank holds a whole model replica (DDP; PyTorch Distributed, Li et al.,
  VLDB'20) or a shard of it (FSDP / ZeRO-3; Zhao et al., VLDB'23; Rajbhandari et al., SC'20).
- *Collectives on their own stream, in issue order.* A collective starts on a rank when that rank
  issued it and its communication stream is free; it completes for every member of its group when
  the last member has started, plus its transfer time (NCCL: a kernel spins until its peers join).
  So the rank that is late arrives last and *waits least*; the others wait for it (FALCON /
  Greyhound, ATC'25: fail-slow GPUs in hybrid-parallel training show as peers' waits at the
  collectives; Holmes, NSDI'25; Minder, NSDI'25: a slow machine shows in its peers' communication).
- *DDP*: the backward produces gradient buckets (``bucket_layers`` layers each, ~25 MB); each
  bucket's all-reduce is issued when its gradients are ready and overlaps the rest of the backward
  (the compute stream never waits for it); the optimizer step waits for the last bucket.
- *FSDP (full shard)*: before each layer's forward and backward its parameters are all-gathered;
  the next layer's all-gather is issued when the current layer starts computing (forward /
  backward prefetch under the rate limiter: at most one all-gather ahead), and a layer cannot
  compute before its all-gather completed; after each layer's backward its gradients are
  reduce-scattered (own stream, overlapped). The parameter-server-free sync means every rank
  advances at the pace of the slowest.
- *MoE (expert parallel over the ranks of a node, ``ep``)*: each layer's compute is attention
  (``1 - expert_share``) then the expert FFN between a dispatch and a combine all-to-all over the
  EP group (GShard, Lepikhin et al., ICLR'21; Switch Transformer, Fedus et al., JMLR'22;
  DeepSpeed-MoE, Rajbhandari et al., ICML'22). The all-to-alls block the compute: every EP member
  leaves one when the last has arrived. Token routing is uneven and changes every iteration and
  every layer (FasterMoE, He et al., PPoPP'22; Tutel, Hwang et al., MLSys'23): per layer and step
  each rank is hot with probability ``moe_p`` and then computes its experts ``moe_lo``–``moe_hi``
  times longer (a capacity factor of 1.25–2 bounds the load of a hot expert: Switch Transformer),
  the others' load is scaled so that the mean load is 1 (the tokens are conserved). The same skew
  hits the backward of the experts.
- *Noise*: persistent per-card speed spread (``card_sd``; GPUs of one model differ by a few
  percent in sustained speed under their power and thermal limits: Sinha et al., SC'22, "Not All
  GPUs Are Created Equal"; 1 % standard deviation, cut at 2.5 of them: a fleet's acceptance tests
  screen out the cards beyond), per-layer compute noise, per-step noise, OS hiccups.

Faults (:class:`trainsim_tp.Fault`, from ``onset``): ``card`` (one rank's compute x factor; with
``second`` >= 0 that rank's too: two slow cards at once) and ``none``.

Restart (``restart_at`` > 0): at that step the job restarts from its checkpoint on a new placement
(MegaScale, Jiang et al., NSDI'24; Gemini, Wang et al., SOSP'23: a failed job is restarted, often on
other machines): the ranks land on other cards (their speeds are permuted), the first
``RESTART_WARM`` steps are a warm-up (kernel autotuning, NCCL communicators and data-loader workers
starting: every rank's compute x1.5, its data loader x5) after ``RESTART_S`` seconds (detection,
rescheduling, checkpoint load: minutes in MegaScale), and the step numbers start over from 1
(:meth:`DPSim.step_number`: the profiler's step counter restarts with the process). Layout: ``n`` ranks, ``node_size`` per node, one DP group of all ranks (DDP: the default
group only, as a plain ``DistributedDataParallel`` job records it; FSDP: a labelled ``dp`` group),
MoE: one ``exp`` group per node.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from trainsim_tp import _TEMPLATE, MS, RESTART_S, RESTART_WARM, Fault, Layout, Sim


@dataclass
class DPLayout:
    """``n`` ranks, ``node_size`` per node; ``mode`` "ddp" | "fsdp"; ``moe``: EP groups per node."""

    n: int
    mode: str = "ddp"
    moe: bool = False
    node_size: int = 8

    # placement on nodes as the TP simulator's layout has it (they use n and node_size)
    node_of = Layout.node_of
    nodes = Layout.nodes
    node_ranks = Layout.node_ranks

    def groups(self) -> dict[str, tuple[str, list[int]]]:
        """comm name -> (kind, global ranks): the default group, the DP group (see module doc), EP
        groups with MoE."""
        out: dict[str, tuple[str, list[int]]] = {"0": ("default_group", list(range(self.n)))}
        if self.mode == "fsdp":
            out["dp_1"] = ("dp", list(range(self.n)))
        if self.moe:
            for i in range(self.nodes):
                out[f"ep_{i + 2}"] = ("exp", self.node_ranks(i))
        return out

    def dp_comm(self) -> str:
        return "dp_1" if self.mode == "fsdp" else "0"


@dataclass
class DPConf:
    """Timing (ms) and noise of the simulated job (module doc)."""

    layers: int = 8
    bucket_layers: int = 2
    t_layer: float = 8.0
    bwd_mult: float = 2.0
    t_ar: float = 3.0
    t_ag: float = 2.5
    t_rs: float = 3.0
    t_a2a: float = 1.0
    t_opt: float = 4.0
    dl: float = 5.0
    expert_share: float = 0.6
    moe_p: float = 0.2
    moe_lo: float = 1.2
    moe_hi: float = 1.8
    card_sd: float = 0.01
    op_noise: float = 0.02
    step_noise: float = 0.01
    hiccup_p: float = 0.005
    hiccup_ms: float = 20.0
    launch_ms: float = 0.05
    seed: int = 0


@dataclass
class DPSim:
    """Generates steps of one DP / FSDP / MoE job and writes their records (module doc)."""

    layout: DPLayout
    conf: DPConf = field(default_factory=DPConf)
    fault: Fault = field(default_factory=Fault)
    second: int = -1
    restart_at: int = 0

    def step_number(self, i: int) -> int:
        """The step number the profiler records for the ``i``-th step run (from 1 after a restart)."""
        return i - self.restart_at + 1 if 0 < self.restart_at <= i else i

    def truth(self) -> dict:
        """The ranks a correct detector names ({} when nobody should be)."""
        if self.fault.kind != "card":
            return {}
        return {"ranks": sorted({self.fault.target} | ({self.second} if self.second >= 0 else set()))}

    # the record helpers and file writers of the TP simulator (they use next_id / _groups / layout)
    _comm_name = Sim._comm_name
    _rng4 = Sim._rng4
    _rng2 = Sim._rng2
    write_groups = Sim.write_groups
    write_steps = Sim.write_steps
    placement = Sim.placement

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.conf.seed)
        self.t = 1_700_000_000 * 10**9
        self.next_id = 1
        self.step = 0
        self._groups = self.layout.groups()
        sd = self.conf.card_sd
        self.speed = np.clip(1 + self.rng.normal(0, sd, self.layout.n), 1 - 2.5 * sd, 1 + 2.5 * sd)

    def _collective(self, issue: np.ndarray, free: np.ndarray, t: float) -> tuple[np.ndarray, np.ndarray]:
        """A collective over all ranks: (start, end) per rank (module doc)."""
        start = np.maximum(issue, free)
        end = np.full(len(start), start.max() + t * (1 + self.rng.normal(0, 0.03)) * MS)
        return start, end

    def _a2a(self, cur: np.ndarray, comms: list, idx: int) -> np.ndarray:
        """An all-to-all over each node's EP group: everyone leaves when its last member arrived."""
        lay = self.layout
        end = cur.copy()
        for node in range(lay.nodes):
            rs = lay.node_ranks(node)
            end[rs] = cur[rs].max() + self.conf.t_a2a * (1 + self.rng.normal(0, 0.03)) * MS
        comms.append(("HcclAlltoAll", "ep", cur.copy(), end.copy()))
        return end

    def run_step(self, comm: bool = True) -> dict[int, list[bytes]]:
        """Simulate one step -> the record lines per rank ({rank: [bytes]})."""
        c, lay, rng = self.conf, self.layout, self.rng
        n, L, step = lay.n, c.layers, self.step
        f = self.fault
        if self.restart_at and step == self.restart_at:  # a new placement: other cards
            self.speed = self.speed[rng.permutation(n)]
            self.t += RESTART_S * 10**9  # the restart itself
        warm = 0 <= step - self.restart_at < RESTART_WARM if self.restart_at else False
        comp = self.speed * (1.5 if warm else 1.0)
        if f.kind == "card" and step >= f.onset:
            comp[f.target] *= f.factor
            if self.second >= 0:
                comp[self.second] *= f.factor
        t0 = self.t
        ready = t0 + 0.1 * MS + c.dl * (5 if warm else 1) * (1 + rng.normal(0, 0.05, n)) * MS
        cur = ready.copy()
        hic = np.where(rng.random(n) < c.hiccup_p, rng.integers(0, 2 * L, n), -1)
        comms: list[tuple[str, str, np.ndarray, np.ndarray]] = []  # (op, group kind, start, end)

        def layer(idx: int, mult: float) -> None:
            nonlocal cur
            base = c.t_layer * mult * comp * (1 + rng.normal(0, c.op_noise, n)) * MS
            base = base + (hic == idx) * c.hiccup_ms * MS
            if not lay.moe:
                cur = cur + base
                return
            load = np.ones(n)
            hot = rng.random(n) < c.moe_p
            load[hot] = rng.uniform(c.moe_lo, c.moe_hi, int(hot.sum()))
            for node in range(lay.nodes):  # tokens are conserved within an EP group: mean load 1
                rs = lay.node_ranks(node)
                cold = [r for r in rs if not hot[r]]
                if cold:
                    load[cold] = max(0.2, (len(rs) - load[rs][hot[rs]].sum()) / len(cold))
            if mult == 1.0:  # forward: attention, dispatch, experts, combine
                cur = cur + base * (1 - c.expert_share)
                cur = self._a2a(cur, comms, idx)
                cur = self._a2a(cur + base * c.expert_share * load, comms, idx)
            else:  # backward: combine's backward, experts, dispatch's backward, attention
                cur = self._a2a(cur, comms, idx)
                cur = self._a2a(cur + base * c.expert_share * load, comms, idx)
                cur = cur + base * (1 - c.expert_share)

        ag_free = np.full(n, float(t0))
        red_free = np.full(n, float(t0))
        fsdp = lay.mode == "fsdp"
        ag_end = None
        if fsdp:
            s, ag_end = self._collective(cur, ag_free, c.t_ag)
            ag_free = ag_end
            comms.append(("HcclAllGather", "dp", s, ag_end))
        fwd_start = cur.copy()
        order = [1.0] * L + [c.bwd_mult] * L  # forward layers, then backward in reverse
        fwd_end = cur
        for k, mult in enumerate(order):
            if fsdp:
                cur = np.maximum(cur, ag_end)
                if k + 1 < len(order):  # prefetch the next layer's parameters
                    s, e = self._collective(cur, ag_free, c.t_ag)
                    ag_free = ag_end = e
                    comms.append(("HcclAllGather", "dp", s, e))
            layer(k, mult)
            if k == L - 1:
                fwd_end = cur.copy()
            if mult != 1.0:
                done = k - L + 1  # backward layers done
                if fsdp or done % c.bucket_layers == 0 or done == L:
                    op, t = ("HcclReduceScatter", c.t_rs) if fsdp else ("HcclAllReduce", c.t_ar)
                    s, e = self._collective(cur, red_free, t)
                    red_free = e
                    comms.append((op, "dp", s, e))
        last = max(cur.max(), red_free.max())
        step_f = 1 + rng.normal(0, c.step_noise)
        step_end = int(t0 + (last + c.t_opt * MS - t0) * step_f)
        step_end = max(step_end, int(last) + MS)
        out: dict[int, list[bytes]] = {}
        dp_name = lay.dp_comm()
        for r in range(n):
            o: list[bytes] = []
            dev = r % 8
            sid = self._rng4(
                o, r, dev, f'"step {self.step_number(step)}"', "default", t0, step_end, open_only=True
            )
            self._rng2(o, r, dev, '"dataloader"', t0 + int(0.1 * MS), int(ready[r]))
            self._rng4(o, r, dev, '"forward"', "default", int(fwd_start[r]), int(fwd_end[r]))
            if comm:
                for op, kind, s, e in comms:
                    group = dp_name if kind == "dp" else f"ep_{lay.node_of(r) + 2}"
                    size = 16777216 if kind == "dp" else 4194304
                    a = int(s[r])
                    name = self._comm_name(op, group, size)
                    self._rng4(
                        o, r, dev, name, "communication", a, int(e[r]), host_end=a + int(c.launch_ms * MS)
                    )
            o.append((_TEMPLATE % (32, 1, step_end, sid, r, dev, '"NULL"', "NULL")).encode())
            o.append((_TEMPLATE % (32, 0, step_end, sid, r, dev, '"NULL"', "NULL")).encode())
            out[r] = o
        self.t = step_end + int(0.2 * MS)
        self.step += 1
        return out


__all__ = ["DPConf", "DPLayout", "DPSim"]
