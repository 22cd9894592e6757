"""ctypes handles on the control API of the test DCMI / lingqu libraries (tests/native/*.c), shared by
the deviced tests and the source contract test."""

from __future__ import annotations

import ctypes

from faultmesh.dcmi.loader import load_dcmi, load_lingqu


class Ctl:
    """ctypes handles on the test library's control API."""

    def __init__(self, libs) -> None:
        lib = load_dcmi(libs.dcmi)
        s = lib.symbol
        i, u, cp = ctypes.c_int, ctypes.c_uint, ctypes.c_char_p
        self.reset = s("dcmitest_reset", None, i, i)
        self.set_phy = s("dcmitest_set_phy", i, i, i)
        self._set_codes = s("dcmitest_set_codes", i, i, ctypes.POINTER(u), i)
        self.set_rc = s("dcmitest_set_rc", i, cp, i, i)
        self.set_hang = s("dcmitest_set_hang", i, cp, i)
        self.calls = s("dcmitest_calls", ctypes.c_long, cp)
        self.fire = s("dcmitest_fire", i, i, u, i, i, i, i)
        self.set_network = s("dcmitest_set_network", i, i, i)
        self.set_procs = s("dcmitest_set_procs", i, i, i)
        self.resets = s("dcmitest_resets", i, i)
        self.set_boot = s("dcmitest_set_boot", i, i, i, i)
        self.storm_start = s("dcmitest_storm_start", i, i, i, i, i, u)
        self.storm_wait = s("dcmitest_storm_wait", ctypes.c_long)
        self.errorcode_list = s(
            "dcmi_get_device_errorcode_v2", i, i, i, ctypes.POINTER(i), ctypes.POINTER(u), u
        )
        lq = load_lingqu(libs.lingqu)
        self.lq_reset = lq.symbol("lqtest_reset", None)
        self.lq_fire = lq.symbol("lqtest_fire", i, i, u, i, i, i, i, i, i, i)
        self.lq_set_rc = lq.symbol("lqtest_set_rc", i, cp, i)

    def set_codes(self, logic: int, codes: list[int]) -> None:
        arr = (ctypes.c_uint * max(1, len(codes)))(*codes)
        assert self._set_codes(logic, arr, len(codes)) == 0

    def live_codes(self, card: int, dev: int) -> set[int]:
        n = ctypes.c_int(0)
        arr = (ctypes.c_uint * 128)()
        assert self.errorcode_list(card, dev, ctypes.byref(n), arr, 128) == 0
        return {arr[k] for k in range(n.value)}
