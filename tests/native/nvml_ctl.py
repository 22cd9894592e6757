"""The NVML test double (tests/native/nvml_test_lib.c): build it as ``libnvidia-ml.so.1`` and drive it
through its control file (the ``struct ctl`` of the C file, mapped by both sides).

Use::

    lib_dir = build_nvml()                    # a directory holding libnvidia-ml.so.1
    ctl = NvmlCtl.create(tmp_path / "nvml.ctl", ngpu=8)
    env = {"LD_LIBRARY_PATH": str(lib_dir), **ctl.env()}   # for the deviced subprocess
    ctl.fire(3, XID_EVENT, 79); ctl.gpu(3).lost = 1; ctl.hang("nvmlDeviceGetTemperature", 10_000)

nvidia-ml-py loads the library by its own lookup (``CDLL("libnvidia-ml.so.1")``), so LD_LIBRARY_PATH of
the process that imports it is what points it here.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import shutil
import tempfile
from pathlib import Path

from native.build import HERE, _compile, _digest

MAXG, NLINK, RING = 16, 4, 4096
MAGIC = 0x4E564D4C
XID_EVENT = 0x8  # nvmlEventTypeXidCriticalError
DBE_EVENT = 0x2  # nvmlEventTypeDoubleBitEccError
LIB_NAME = "libnvidia-ml.so.1"


class Gpu(ctypes.Structure):
    _fields_ = [
        ("lost", ctypes.c_uint32),
        ("events_unsupported", ctypes.c_uint32),
        ("retired_pending", ctypes.c_uint32),
        ("remap_pending", ctypes.c_uint32),
        ("remap_failure", ctypes.c_uint32),
        ("remap_unsupported", ctypes.c_uint32),
        ("temp", ctypes.c_uint32),
        ("temp_slowdown", ctypes.c_uint32),
        ("temp_shutdown", ctypes.c_uint32),
        ("pcie_replay", ctypes.c_uint32),
        ("nvlink_active_mask", ctypes.c_uint32),
        ("nvlink_count", ctypes.c_uint32),
        ("throttle", ctypes.c_uint64),
        ("ecc", (ctypes.c_uint64 * 2) * 2),
        ("nvlink_err", ctypes.c_uint64 * NLINK),
        ("procs", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
    ]


class Ev(ctypes.Structure):
    _fields_ = [
        ("gpu", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
        ("type", ctypes.c_uint64),
        ("data", ctypes.c_uint64),
    ]


class Ctl(ctypes.Structure):
    _fields_ = [
        ("magic", ctypes.c_uint32),
        ("ngpu", ctypes.c_uint32),
        ("hang_ms", ctypes.c_uint32),
        ("hang_gpu", ctypes.c_uint32),
        ("hang_call", ctypes.c_char * 64),
        ("ev_head", ctypes.c_uint64),
        ("ev_tail", ctypes.c_uint64),
        ("calls", ctypes.c_uint64),
        ("g", Gpu * MAXG),
        ("ring", Ev * RING),
    ]


def build_nvml(base: str | os.PathLike | None = None) -> Path:
    """Compile nvml_test_lib.c (once per source hash) into ``<dir>/libnvidia-ml.so.1``; returns the dir.
    Raises ``FileNotFoundError`` without gcc, ``RuntimeError`` with gcc's output on a failed build."""
    gcc = shutil.which(os.environ.get("CC", "gcc"))
    if gcc is None:
        raise FileNotFoundError("gcc not found (set CC or install gcc)")
    src = [HERE / "nvml_test_lib.c"]
    root = Path(base or tempfile.gettempdir())
    out = root / f"faultmesh-nvml-{_digest(src, gcc)}"
    if (out / LIB_NAME).is_file():
        return out
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".build-nvml-", dir=root))
    try:
        _compile(gcc, src, tmp / LIB_NAME)
        try:
            os.rename(tmp, out)
        except OSError:  # a parallel build won
            if not (out / LIB_NAME).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


class NvmlCtl:
    """The control file of one NVML double, mapped here (the deviced process maps the same file)."""

    def __init__(self, path: Path, mm: mmap.mmap) -> None:
        self.path = path
        self._mm = mm
        self.c = Ctl.from_buffer(mm)

    @classmethod
    def create(cls, path: str | os.PathLike, ngpu: int = 8, nvlinks: int = 4) -> NvmlCtl:
        """A fresh control file: ``ngpu`` healthy GPUs at 40 C (slowdown 90, shutdown 95) with ``nvlinks``
        active NVLinks each (0..4)."""
        p = Path(path)
        p.write_bytes(b"\0" * ctypes.sizeof(Ctl))
        with open(p, "r+b") as f:
            mm = mmap.mmap(f.fileno(), ctypes.sizeof(Ctl))
        ctl = cls(p, mm)
        ctl.c.ngpu = ngpu
        ctl.c.hang_gpu = 0xFFFFFFFF
        for i in range(ngpu):
            g = ctl.c.g[i]
            g.temp, g.temp_slowdown, g.temp_shutdown = 40, 90, 95
            g.nvlink_count = nvlinks
            g.nvlink_active_mask = (1 << nvlinks) - 1
        ctl.c.magic = MAGIC
        return ctl

    def env(self) -> dict[str, str]:
        """The environment entry the library reads."""
        return {"FMNVML_CTL": str(self.path)}

    def gpu(self, i: int) -> Gpu:
        """GPU ``i``'s fields (writes take effect on the library's next call)."""
        return self.c.g[i]

    def fire(self, gpu: int, etype: int, data: int) -> None:
        """Append one event (e.g. ``XID_EVENT``, 79); ``nvmlEventSetWait_v2`` hands it out."""
        head = self.c.ev_head
        if head - self.c.ev_tail >= RING:
            raise OverflowError("event ring full")
        e = self.c.ring[head % RING]
        e.gpu, e.type, e.data = gpu, etype, data
        self.c.ev_head = head + 1

    def hang(self, call: str, ms: int, gpu: int | None = None) -> None:
        """Make ``call`` ("*" = every call) sleep ``ms`` first (0 = stop), on one GPU or all."""
        self.c.hang_call = call.encode()
        self.c.hang_gpu = 0xFFFFFFFF if gpu is None else gpu
        self.c.hang_ms = ms

    def consumed(self) -> int:
        """Events handed out so far."""
        return self.c.ev_tail
