"""Every reference fault code, injected through the simulated DCMI backend (chip codes) and the
simulated lingqu switch (switch codes), reaches clusterd's fault center with the level of the
reference's own tables (../shared/data/fault-tables; issue 13 "Done when"). The fast test takes a
random sample (seed in the failure message; ``FAULTMESH_SAMPLE_SEED`` repeats one), the slow one
every code. The escalation rules are switched off (empty faultCustomization.json and
relationFaultCustomization.json) so the level seen is the table's; 8C2FA009 (reset finished) is
never reported (reference deviced.md §1.1: it only triggers a re-poll)."""

from __future__ import annotations

import json
import os
import random
import time

import pytest
from support import until

from clusterd.app import ClusterD
from deviced.app import DeviceD
from deviced.app import build_parser as deviced_parser
from deviced.backends import SimBackend
from deviced.engine import FaultEngine
from deviced.simapi import PEERS
from deviced.tables import RESET_FINISHED, Customization, FaultCodeTable, SwitchFaultTable, parse_code

CHIPS = 8


def reference_codes(fault_tables) -> tuple[dict[int, str], dict[str, str]]:
    """(chip code -> level name, switch code -> switch level) from the reference's tables."""
    ref = FaultCodeTable.load(fault_tables / "faultCode.json")
    eng = FaultEngine(ref, Customization.from_obj({}))
    raw = json.loads((fault_tables / "faultCode.json").read_text())
    chip = {parse_code(c) for codes in raw.values() for c in codes} - {RESET_FINISHED}
    sw = SwitchFaultTable.load(fault_tables / "SwitchFaultCode.json")
    return {c: eng.base_level(c, 2)[0].name for c in chip}, dict(sw.levels)


def switch_args(code: str) -> tuple[int, int, int]:
    alarm, fid, peer, _ = code.strip("[]").split(",")
    return int(alarm, 16), 0xFFFFFFFF if fid == "na" else int(fid), PEERS[peer.lower()]


async def check(tmp_path, chip: dict[int, str], switch: dict[str, str], what: str) -> None:
    from support import make_clusterd

    cd: ClusterD = await make_clusterd(tmp_path)
    (tmp_path / "custom.json").write_text("{}")
    (tmp_path / "relations.json").write_text("[]")
    args = deviced_parser().parse_args(
        ["--node-name", "node-all", "--backend", "sim", "--clusterd", f"127.0.0.1:{cd.grpc_port}",
         "--probe-interval", "0", "--link-check-interval", "0", "--list-watch-period", "3",
         "--callback-rate-limit", "1000000", "--fault-customization-file", str(tmp_path / "custom.json"),
         "--relation-fault-file", str(tmp_path / "relations.json")]
    )  # fmt: skip
    sim = SimBackend(1, CHIPS)
    dv = DeviceD(args, sim)
    await dv.start()
    try:
        await until(lambda: dv.cycles >= 1)
        for i, code in enumerate(sorted(chip)):
            sim.inject(i % CHIPS, code, 1)
        for i, code in enumerate(sorted(switch)):  # one switch chip each: no 16-L2-ports rule
            alarm, fid, peer = switch_args(code)
            sim.switch.fire(alarm, fid, peer, 0, i, 0, 2, 1)
        want_chip = {(i % CHIPS, code): lvl for i, (code, lvl) in enumerate(sorted(chip.items()))}
        want_sw = {(i, code): lvl for i, (code, lvl) in enumerate(sorted(switch.items()))}

        def seen():
            fs = cd.center.faults("node-all")
            got_chip = {(f.device_id, parse_code(f.code)): f.level for f in fs if f.source == "dcmi"}
            got_sw = {(f.device_id, f.code): f.level for f in fs if f.source == "lingqu"}
            return got_chip, got_sw

        try:
            await until(lambda: seen() == (want_chip, want_sw), timeout_s=60)
        except AssertionError:
            got_chip, got_sw = seen()
            bad = {k: (v, got_chip.get(k)) for k, v in want_chip.items() if got_chip.get(k) != v}
            bad_sw = {k: (v, got_sw.get(k)) for k, v in want_sw.items() if got_sw.get(k) != v}
            raise AssertionError(
                f"{what}: (want, got) differ: {dict(list(bad.items())[:10])} {bad_sw}"
            ) from None
    finally:
        await dv.stop()
        await cd.stop()


async def test_random_sample_of_reference_codes_reaches_clusterd(tmp_path, fault_tables):
    seed = int(os.environ.get("FAULTMESH_SAMPLE_SEED") or time.time())
    rnd = random.Random(seed)
    chip, switch = reference_codes(fault_tables)
    sample = dict(rnd.sample(sorted(chip.items()), 40))
    sample_sw = dict(rnd.sample(sorted(switch.items()), 8))
    await check(tmp_path, sample, sample_sw, f"FAULTMESH_SAMPLE_SEED={seed}")


@pytest.mark.slow
async def test_every_reference_code_reaches_clusterd(tmp_path, fault_tables):
    chip, switch = reference_codes(fault_tables)
    assert len(chip) == 801 and len(switch) == 30  # 802 codes but the reset-finished notice
    await check(tmp_path, chip, switch, "all codes")
