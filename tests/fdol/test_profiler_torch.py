"""faultmesh.profiler.torch on a one-process gloo group: collectives recorded with their group name,
parallel_group.json written, forward hooks and the dataloader wrapper (needs faultmesh[torch])."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch", reason="needs the faultmesh[torch] extra (torch==2.13.0)")

pytestmark = pytest.mark.torch


def test_instrumented_collectives_and_groups(tmp_path, port):
    import torch.distributed as dist

    from faultmesh.profiler import Profiler
    from faultmesh.profiler import torch as fpt
    from fdol.slownode.metrics import StepAssembler
    from fdol.slownode.reader import JobReader

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        prof = Profiler(0, base_dir=tmp_path, task_id="t", flush_interval_s=0)
        fpt.instrument_distributed(prof)
        g = fpt.new_group([0], "tp")
        model = torch.nn.Linear(8, 2)
        fpt.instrument_forward(model, prof)
        batches = fpt.profiled_loader([torch.randn(4, 8) for _ in range(3)], prof)
        for n in range(3):
            with prof.step(n):
                x = next(batches)
                model(x).sum().backward()
                t = torch.ones(16)
                dist.all_reduce(t, group=g)
                dist.all_reduce(t)
                assert t[0].item() == 1.0  # the wrapped collective still works
        assert fpt.dump_group_info(prof)
        prof.close()
    finally:
        fpt.uninstrument_distributed()
        dist.destroy_process_group()
    groups = json.loads((tmp_path / "t" / "0" / "parallel_group.json").read_text())
    kinds = sorted(v["group_name"] for v in groups.values())
    assert kinds == ["default_group", "tp"]
    jr = JobReader(tmp_path / "t", [0])
    recs = jr.poll()[0]
    names = [r.name for r in recs if r.name]
    comm = [json.loads(n) for n in names if n.startswith("{")]
    assert len(comm) == 6 and {c["opName"] for c in comm} == {"AllReduce"}
    assert {c["count"] for c in comm} == {"16"} and {c["dataType"] for c in comm} == {"float32"}
    tp_name = next(k for k, v in groups.items() if v["group_name"] == "tp")
    assert sum(c["groupName"] == tp_name for c in comm) == 3
    assert names.count("forward") == 3 and names.count("dataloader") == 3
    steps = StepAssembler(0, lambda: jr.groups(0)).feed(recs)
    assert [m.step for m in steps] == [0, 1] and all(m.compute > 0 and m.dataloader_host > 0 for m in steps)
    assert sum(jr.bad.values()) == 0


def test_ddp_buckets_recorded_from_launch_to_completion(tmp_path, port):
    """record_ddp_buckets: every gradient bucket's all-reduce is one AllReduce record on the DDP
    group (count: the bucket's elements), the gradients are DDP's (averaged: here, one rank, the
    local ones), and ``before_bucket`` runs before each launch with the bucket's index."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from faultmesh.profiler import Profiler
    from faultmesh.profiler import torch as fpt
    from fdol.slownode.reader import JobReader

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        prof = Profiler(0, base_dir=tmp_path, task_id="d", flush_interval_s=0)
        fpt.instrument_distributed(prof)
        g = fpt.new_group([0], "dp")
        torch.manual_seed(0)
        model = torch.nn.Sequential(*(torch.nn.Linear(256, 256) for _ in range(6)))
        ref = [p.detach().clone() for p in model.parameters()]
        ddp = DistributedDataParallel(model, process_group=g, bucket_cap_mb=0.25)
        seen: list[int] = []
        fpt.record_ddp_buckets(ddp, prof, g, seen.append)
        x = torch.randn(4, 256)
        for n in range(3):
            with prof.step(n):
                for p in model.parameters():
                    p.grad = None
                ddp(x).sum().backward()
        local = torch.nn.Sequential(*(torch.nn.Linear(256, 256) for _ in range(6)))
        with torch.no_grad():
            for p, r in zip(local.parameters(), ref, strict=True):
                p.copy_(r)
        local(x).sum().backward()
        for p, q in zip(model.parameters(), local.parameters(), strict=True):
            assert torch.allclose(p.grad, q.grad)
        assert fpt.dump_group_info(prof)
        prof.close()
    finally:
        fpt.uninstrument_distributed()
        dist.destroy_process_group()
    groups = json.loads((tmp_path / "d" / "0" / "parallel_group.json").read_text())
    dp_name = next(k for k, v in groups.items() if v["group_name"] == "dp")
    recs = JobReader(tmp_path / "d", [0]).poll()[0]
    comm = [json.loads(r.name) for r in recs if r.name and r.name.startswith("{")]
    assert {c["opName"] for c in comm} == {"AllReduce"} and {c["groupName"] for c in comm} == {dp_name}
    # the first step: one bucket (DDP's first-bucket cap, 1 MB); then DDP rebuilt them in the
    # backward's order, 0.25 MB each: one layer's weight and bias per bucket
    layer = 256 * 256 + 256
    assert [int(c["count"]) for c in comm] == [6 * layer] + [layer] * 12
    assert seen == [0] + list(range(6)) * 2


def test_fsdp2_all_gathers_and_reduce_scatters_recorded_on_the_dp_group(tmp_path):
    """The example job's ``--parallel fsdp`` (FSDP2, ``fully_shard`` over a ``dp`` group, 2 gloo
    ranks): torch 2.13's FSDP2 calls ``all_gather_single`` / ``reduce_scatter_single``, which the
    profiler records as AllGather / ReduceScatter on the dp group -- each of the 5 sharded layers
    all-gathers in the forward and again in the backward and reduce-scatters once -- and the parse
    stage gives each step the data-parallel arrivals (the all-gathers, the step's first left out)."""
    import subprocess
    import sys
    from collections import Counter

    from fdol.slownode.replay import load_steps

    argv = [
        sys.executable, "-m", "faultmesh.profiler.example_job", "--parallel", "fsdp", "--ranks", "2",
        "--steps", "6", "--warmup", "3", "--base-dir", str(tmp_path), "--task-id", "f",
    ]  # fmt: skip
    r = subprocess.run(argv, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    groups = json.loads((tmp_path / "f" / "0" / "parallel_group.json").read_text())
    dp = next(k for k, v in groups.items() if v["group_name"] == "dp")
    steps, bad = load_steps(tmp_path / "f", [0, 1])
    assert not bad
    from fdol.slownode.reader import JobReader

    recs = JobReader(tmp_path / "f", [0, 1]).poll()
    for rank in (0, 1):
        comm = Counter(
            (c["opName"], c["groupName"])
            for c in (json.loads(x.name) for x in recs[rank] if x.name and x.name.startswith("{"))
        )
        assert comm[("AllGather", dp)] == 6 * 10 and comm[("ReduceScatter", dp)] == 6 * 5, comm
        assert [len(m.dp_starts) for m in steps[rank]] == [9] * len(steps[rank]) and len(steps[rank]) >= 5
