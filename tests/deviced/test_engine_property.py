"""Property: whatever the order and timing of callback events, once every event is due the chip's
active codes are exactly the codes whose latest event (by time, then arrival) is an occur."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from deviced.engine import OCCUR, RECOVER, DeviceEvent, FaultEngine
from deviced.tables import Customization, FaultCodeTable
from faultmesh.dcmi.api import DeviceIds

CODES = [0x80E18008, 0x80C98009, 0x81078603, 0xDEAD0001]

events = st.lists(
    st.tuples(
        st.sampled_from(CODES),
        st.sampled_from([OCCUR, RECOVER]),
        st.integers(min_value=0, max_value=3000),  # event time offset (ms)
        st.integers(min_value=0, max_value=3000),  # when it is submitted (ms)
        st.sampled_from(["poll", "callback"]),  # callback recovers are applied 1 s late
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(events)
def test_active_codes_follow_the_latest_event(evs):
    clock = [1_000_000]
    eng = FaultEngine(FaultCodeTable.load(), Customization.from_obj({}), clock=lambda: clock[0])
    eng.set_devices([DeviceIds(0, 0, 0, 0)])
    eng.apply_poll(0, [])
    eng.cycle()
    base = clock[0]
    latest: dict[int, tuple[tuple[int, int], int]] = {}
    for arrival, (code, assertion, t_off, submit_off, origin) in enumerate(sorted(evs, key=lambda e: e[3])):
        clock[0] = max(clock[0], base + submit_off)
        eng.submit(DeviceEvent(0, code, assertion, 1, base + t_off, origin))
        key = (base + t_off, arrival)
        if code not in latest or key > latest[code][0]:
            latest[code] = (key, assertion)
        if arrival % 3 == 0:
            eng.cycle()
    clock[0] = base + 10_000
    eng.cycle()
    want = {c for c, (_k, a) in latest.items() if a == OCCUR}
    assert set(eng.devices[0].chip) | set(eng.devices[0].network) == want
