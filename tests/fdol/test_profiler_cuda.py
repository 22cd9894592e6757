"""faultmesh.profiler with a device timer (issue 33): device ranges carry the device's own times from
timing events (CUDA events on a GPU; here a stand-in with the same calls whose device clock the test
drives), written once the events completed, read back by FD-OL; without a timer nothing changes."""

from __future__ import annotations

import time

from faultmesh.profiler import Profiler
from faultmesh.profiler.device import EventTimer
from fdol.slownode.metrics import StepAssembler
from fdol.slownode.reader import JobReader

MS = 1_000_000


class Device:
    """A fake GPU: ``now_ms`` is its clock; events complete when the device clock passes them."""

    def __init__(self) -> None:
        self.now_ms = 0.0
        self.done_ms = 0.0  # the device has executed everything recorded before this time

    def event(self):
        dev = self

        class Event:
            t_ms: float | None = None

            def record(self) -> None:
                self.t_ms = dev.now_ms

            def query(self) -> bool:
                return self.t_ms is not None and self.t_ms <= dev.done_ms

            def synchronize(self) -> None:
                dev.done_ms = max(dev.done_ms, self.t_ms)

            def elapsed_time(self, other) -> float:
                return other.t_ms - self.t_ms

        return Event()


def test_device_ranges_carry_event_times_and_fdol_reads_them(tmp_path):
    dev = Device()
    timer = EventTimer(dev.event)
    p = Profiler(0, base_dir=tmp_path, task_id="gpu", flush_interval_s=0, device_timer=timer)
    assert p.dump_group_info({"tp": ("tp", 0, [0, 1])})
    for s in range(3):
        with p.step(s):
            with p.forward():  # host launch takes ~0; the device runs 30 ms of kernels
                dev.now_ms += 30
            with p.comm("AllReduce", "tp", count=1024, dtype="float16"):
                dev.now_ms += 12
            dev.now_ms += 1
        assert timer.pending() >= 3  # nothing completed yet: nothing written, the loop never waited
    dev.done_ms = dev.now_ms - 43  # the device finished steps 0 and 1
    with p.step(3):
        dev.now_ms += 43
    assert timer.pending() == 3 + 1  # step 2's three ranges and step 3 wait for the device
    p.close()  # synchronizes the rest
    assert timer.pending() == 0 and timer.fallbacks == 0
    jr = JobReader(tmp_path / "gpu", [0])
    recs = jr.poll()[0]
    assert sum(jr.bad.values()) == 0
    a = StepAssembler(0, lambda: jr.groups(0))
    steps = a.feed(recs) + a.flush()
    assert [m.step for m in steps][:3] == [0, 1, 2]
    for m in steps[:3]:
        assert m.step_time == 43 * MS  # the device's step, not the ~µs of host launches
        assert m.zp_device == 12 * MS  # the collective's device duration
    # the forward ranges' device records span the device's 30 ms (FD-OL's `compute` reads the host
    # records of forward by design, so it is checked on the records themselves)
    fwd_ids = {r.id for r in recs if r.name == "forward"}
    dev = {}
    for r in recs:
        if r.id in fwd_ids and r.source_kind == 1:  # SOURCE_DEVICE
            dev.setdefault(r.id, []).append(r.ts)
    assert len(dev) == 3 and all(max(ts) - min(ts) == 30 * MS for ts in dev.values())


def test_without_a_timer_device_times_are_host_times(tmp_path):
    p = Profiler(0, base_dir=tmp_path, task_id="cpu", flush_interval_s=0)
    with p.step(0):
        with p.forward():
            time.sleep(0.002)
    p.close()
    recs = JobReader(tmp_path / "cpu", [0]).poll()[0]
    by_id: dict[int, set[int]] = {}
    for r in recs:
        by_id.setdefault(r.id, set()).add(r.ts)
    assert all(len(ts) == 2 for ts in by_id.values())  # start and end: host and device the same


def test_pending_is_bounded_and_falls_back_to_host_times(tmp_path):
    dev = Device()
    timer = EventTimer(dev.event, max_pending=2)
    p = Profiler(0, base_dir=tmp_path, task_id="b", flush_interval_s=3600, device_timer=timer)
    for _ in range(3):
        with p.forward():
            dev.now_ms += 1
    assert timer.pending() == 2 and timer.fallbacks == 1
    assert len(p._buf) == 4  # the third range was written at once with host times
