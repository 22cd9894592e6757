"""faultmesh.profiler writes the record format that fdol reads back; switch; never breaks training."""

from __future__ import annotations

import json
import os
import time

import orjson

from faultmesh.profiler import Profiler
from fdol.slownode.metrics import StepAssembler
from fdol.slownode.reader import JobReader
from fdol.slownode.switch import HEAVY, LIGHT


def run_steps(p: Profiler, first: int, n: int, comm_group="tp_g") -> None:
    for s in range(first, first + n):
        with p.step(s):
            with p.dataloader():
                time.sleep(0.0005)
            with p.forward():
                time.sleep(0.002)
            with p.comm("AllReduce", comm_group, count=4096, dtype="float32"):
                time.sleep(0.001)


def test_round_trip_through_reader_and_metrics(tmp_path):
    p = Profiler(0, base_dir=tmp_path, task_id="job1", flush_interval_s=0)
    assert p.dump_group_info({"tp_g": ("tp", 0, [0, 1]), "0": ("default_group", 0, [0, 1])})
    run_steps(p, 0, 5)
    p.close()
    rank_dir = tmp_path / "job1" / "0"
    names = sorted(os.listdir(rank_dir))
    assert "parallel_group.json" in names and any(n.isdigit() and len(n) == 10 for n in names)
    groups = json.loads((rank_dir / "parallel_group.json").read_text())
    assert groups["tp_g"] == {"group_name": "tp", "group_rank": 0, "global_ranks": [0, 1]}
    jr = JobReader(tmp_path / "job1", [0])
    recs = jr.poll()[0]
    assert len(recs) == 5 * (4 + 2 + 4 + 4)
    assert sum(jr.bad.values()) == 0
    a = StepAssembler(0, lambda: jr.groups(0))
    steps = a.feed(recs) + a.flush()
    assert [m.step for m in steps] == [0, 1, 2, 3, 4]
    for m in steps:
        assert 1_000_000 <= m.zp_device < 50_000_000  # ~1 ms all-reduce measured
        assert 2_000_000 <= m.compute < 60_000_000
        assert 400_000 <= m.dataloader_host < 50_000_000
        assert m.step_time >= m.compute + m.zp_device


def test_switch_gates_domains(tmp_path):
    sw = tmp_path / "profilingSwitch"
    p = Profiler(1, base_dir=tmp_path, task_id="j", switch_path=sw, flush_interval_s=0, switch_poll_s=0)
    run_steps(p, 0, 2)  # no switch file: everything off
    p.flush()
    assert p.written_records == 0
    sw.write_bytes(orjson.dumps(LIGHT))
    run_steps(p, 2, 2)
    p.flush()
    assert p.written_records == 2 * (4 + 2 + 4)  # no communication records
    sw.write_bytes(orjson.dumps(HEAVY) + b" ")
    run_steps(p, 4, 1)
    p.flush()
    assert p.written_records == 2 * 10 + 14
    sw.write_text("not json")
    run_steps(p, 5, 1)
    p.flush()
    assert p.written_records == 34


def test_disk_errors_never_raise_and_are_counted(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    p = Profiler(0, base_dir=blocker, task_id="j", flush_interval_s=0)  # base is a file: mkdir fails
    run_steps(p, 0, 2)
    p.flush()
    assert p.write_errors >= 1 and p.dropped_records > 0 and p.written_records == 0
    assert p.dump_group_info({}) is False
    q = Profiler(0, base_dir=tmp_path / "ok", task_id="j", flush_interval_s=0)
    run_steps(q, 0, 1)
    q.flush()
    import shutil

    shutil.rmtree(tmp_path / "ok")  # the directory vanishes mid-job: recreated at the next flush
    run_steps(q, 1, 1)
    q.flush()
    assert q.write_errors == 0 and q.written_records == 28


def test_rotation_by_size(tmp_path):
    p = Profiler(0, base_dir=tmp_path, task_id="j", flush_interval_s=0, max_file_bytes=2000)
    for s in range(6):
        run_steps(p, s, 1)
        p.flush()
    files = [n for n in os.listdir(tmp_path / "j" / "0") if n.isdigit()]
    assert len(files) >= 2
    jr = JobReader(tmp_path / "j", [0])
    a = StepAssembler(0, lambda: None)
    steps = a.feed(jr.poll()[0]) + a.flush()
    assert [m.step for m in steps] == list(range(6))
