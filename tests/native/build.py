"""Build the test DCMI libraries with gcc: every ``tests/native/*.c`` into one ``libdcmi.so``, except
``lingqu*.c`` files, which build ``liblingqu-dcmi.so``, and ``nvml*.c`` (the NVML double, built by
``tests/native/nvml_ctl.py``).

The output directory is keyed by a hash of the sources and flags (``$TMPDIR/faultmesh-native-<hash>``),
so a session builds at most once and parallel sessions share the result (build in a temp dir, then an
atomic rename). Use from tests::

    from native.build import build_libs      # tests/ is on sys.path (rootdir conftest)
    libs = build_libs()                      # -> NativeLibs(dir, dcmi, lingqu) (Paths)

or the session fixture ``native_libs`` defined in ``tests/native/conftest.py`` and re-exported by
``tests/deviced/conftest.py``. CLI: ``python tests/native/build.py`` prints the library paths.
Raises ``RuntimeError`` with gcc's output when compilation fails; ``FileNotFoundError`` when gcc is
missing.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

HERE = Path(__file__).resolve().parent
CFLAGS = ["-shared", "-fPIC", "-O2", "-g", "-pthread", "-Wall", "-std=gnu11"]
LDLIBS = ["-lpthread"]


class NativeLibs(NamedTuple):
    """Where the built libraries are: ``dir``, ``dcmi`` (libdcmi.so), ``lingqu`` (liblingqu-dcmi.so or None)."""

    dir: Path
    dcmi: Path
    lingqu: Path | None


def _sources() -> tuple[list[Path], list[Path]]:
    files = sorted(HERE.glob("*.c"))
    lingqu = [f for f in files if f.name.startswith("lingqu")]
    dcmi = [f for f in files if f not in lingqu and not f.name.startswith("nvml")]
    return dcmi, lingqu


def _digest(files: list[Path], gcc: str) -> str:
    h = hashlib.sha256()
    h.update(" ".join(CFLAGS + LDLIBS + [gcc]).encode())
    for f in files:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def _compile(gcc: str, sources: list[Path], out: Path) -> None:
    cmd = [gcc, *CFLAGS, "-o", str(out), *map(str, sources), *LDLIBS]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"gcc failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr}")


def build_libs(base: str | os.PathLike | None = None) -> NativeLibs:
    """Compile (once per source hash) and return the library paths. ``base`` defaults to ``$TMPDIR``."""
    gcc = shutil.which(os.environ.get("CC", "gcc"))
    if gcc is None:
        raise FileNotFoundError("gcc not found (set CC or install gcc)")
    dcmi_src, lingqu_src = _sources()
    if not dcmi_src:
        raise RuntimeError(f"no DCMI test sources in {HERE}")
    root = Path(base or tempfile.gettempdir())
    out = root / f"faultmesh-native-{_digest(dcmi_src + lingqu_src, gcc)}"
    libs = NativeLibs(out, out / "libdcmi.so", (out / "liblingqu-dcmi.so") if lingqu_src else None)
    if libs.dcmi.is_file():
        return libs
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".faultmesh-native.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if libs.dcmi.is_file():
            return libs
        tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=root))
        try:
            _compile(gcc, dcmi_src, tmp / "libdcmi.so")
            if lingqu_src:
                _compile(gcc, lingqu_src, tmp / "liblingqu-dcmi.so")
            os.rename(tmp, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return libs


if __name__ == "__main__":
    libs = build_libs(sys.argv[1] if len(sys.argv) > 1 else None)
    print(libs.dcmi)
    if libs.lingqu:
        print(libs.lingqu)
