"""Find and load the DCMI shared libraries with ctypes; map return codes to typed exceptions.

Source: reference deviced.md §1 (dlopen of ``libdcmi.so`` from the driver lib dirs; -8012 device not
ready, -8255 not supported, -99998 missing symbol, -99999 missing library) and §7 (``liblingqu-dcmi.so``).

How to add a binding (e.g. in ``faultmesh/dcmi/hccsping.py``)::

    import ctypes
    from faultmesh.dcmi.loader import load_dcmi

    lib = load_dcmi(path_or_None)                      # Library; raises LibraryMissing
    stop = lib.function("dcmi_stop_hccsping_mesh",     # name, then C argument types
                        ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_uint)
    stop(card_id, device_id, port_id, task_id)         # returns None; rc != 0 raises DcmiError
                                                       # (DeviceNotReady, NotSupported, ...)

``Library.function`` never fails at bind time: a symbol the library does not export raises
:class:`SymbolMissing` when called, so one old driver without an optional call does not stop the
rest. Every bound call is blocking C code: run it through ``faultmesh.runtime.BlockingPool`` (never on
the event loop). Struct layouts live in :mod:`faultmesh.dcmi.structs` (declared once, size-checked by
the tests against the C compiler).
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

# Return codes (reference deviced.md §1).
RC_OK = 0
RC_DEVICE_NOT_READY = -8012
RC_NOT_SUPPORTED = -8255
RC_SYMBOL_MISSING = -99998
RC_LIBRARY_MISSING = -99999

DCMI_LIB_NAME = "libdcmi.so"
LINGQU_LIB_NAME = "liblingqu-dcmi.so"

# Where the Ascend driver installs its libraries; searched in this order after an explicit path and
# the FAULTMESH_DCMI_LIB_DIR / LD_LIBRARY_PATH directories.
DRIVER_LIB_DIRS = (
    "/usr/local/Ascend/driver/lib64/driver",
    "/usr/local/Ascend/driver/lib64/common",
    "/usr/local/Ascend/driver/lib64",
    "/usr/local/dcmi",
    "/usr/lib64",
    "/usr/lib",
)


class DcmiError(RuntimeError):
    """A DCMI call returned a non-zero code. ``rc`` is the code, ``func`` the C function name."""

    def __init__(self, rc: int, func: str, msg: str | None = None) -> None:
        self.rc = rc
        self.func = func
        super().__init__(msg or f"{func} returned {rc}")


class DeviceNotReady(DcmiError):
    """rc -8012: the device is not ready; deviced treats it as a card drop (code 40F84E00)."""


class NotSupported(DcmiError):
    """rc -8255: the driver or chip does not support this call."""


class SymbolMissing(DcmiError):
    """The loaded library does not export the function (the reference's -99998)."""

    def __init__(self, func: str, lib: str) -> None:
        super().__init__(RC_SYMBOL_MISSING, func, f"{lib} does not export {func}")


class LibraryMissing(DcmiError):
    """The shared library was not found or failed to load (the reference's -99999)."""

    def __init__(self, name: str, detail: str) -> None:
        super().__init__(RC_LIBRARY_MISSING, "dlopen", f"cannot load {name}: {detail}")


_BY_RC: dict[int, type[DcmiError]] = {RC_DEVICE_NOT_READY: DeviceNotReady, RC_NOT_SUPPORTED: NotSupported}


def check(rc: int, func: str) -> None:
    """Raise the typed :class:`DcmiError` for a non-zero DCMI return code ``rc`` of C function ``func``."""
    if rc != RC_OK:
        raise _BY_RC.get(rc, DcmiError)(rc, func)


def candidate_paths(
    name: str, explicit: str | os.PathLike | None = None, env_var: str | None = None
) -> list[Path]:
    """The paths tried for library ``name``, in order.

    ``explicit`` (a file, or a directory holding ``name``) comes first and is the only candidate when
    given; else ``$env_var`` (file path), ``$FAULTMESH_DCMI_LIB_DIR``, the ``LD_LIBRARY_PATH`` entries
    and :data:`DRIVER_LIB_DIRS`.
    """
    if explicit:
        p = Path(explicit)
        return [p / name if p.is_dir() else p]
    out: list[Path] = []
    if env_var and os.environ.get(env_var):
        out.append(Path(os.environ[env_var]))
    dirs: list[str] = []
    if os.environ.get("FAULTMESH_DCMI_LIB_DIR"):
        dirs.append(os.environ["FAULTMESH_DCMI_LIB_DIR"])
    dirs += [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    dirs += DRIVER_LIB_DIRS
    out += [Path(d) / name for d in dirs]
    return out


class BoundFunction:
    """One C function bound with its argument types; calling it raises on a non-zero return code.

    ``restype`` is always ``int`` (DCMI's convention). When the symbol is missing, calls raise
    :class:`SymbolMissing`. ``raw(*args)`` returns the code instead of raising.
    """

    __slots__ = ("_fn", "argtypes", "lib_name", "name")

    def __init__(self, lib: ctypes.CDLL | None, lib_name: str, name: str, argtypes: Iterable[Any]) -> None:
        self.name = name
        self.lib_name = lib_name
        self.argtypes = list(argtypes)
        fn = getattr(lib, name, None) if lib is not None else None
        if fn is not None:
            fn.restype = ctypes.c_int
            fn.argtypes = self.argtypes
        self._fn = fn

    @property
    def available(self) -> bool:
        """True when the library exports the symbol."""
        return self._fn is not None

    def raw(self, *args: Any) -> int:
        """Call and return the C return code. Raises :class:`SymbolMissing` when not exported."""
        if self._fn is None:
            raise SymbolMissing(self.name, self.lib_name)
        return int(self._fn(*args))

    def __call__(self, *args: Any) -> None:
        """Call; raise the typed :class:`DcmiError` when the code is not 0."""
        check(self.raw(*args), self.name)


class Library:
    """A loaded shared library (``path``) whose functions are bound with :meth:`function`."""

    def __init__(self, cdll: ctypes.CDLL, path: Path) -> None:
        self.cdll = cdll
        self.path = path
        self._bound: dict[str, BoundFunction] = {}
        self._lock = threading.Lock()

    def function(self, name: str, *argtypes: Any) -> BoundFunction:
        """Bind C function ``name`` (returning int) with ctypes ``argtypes``; cached per name."""
        with self._lock:
            fn = self._bound.get(name)
            if fn is None:
                fn = BoundFunction(self.cdll, self.path.name, name, argtypes)
                self._bound[name] = fn
            return fn

    def has(self, name: str) -> bool:
        """True when the library exports ``name``."""
        return getattr(self.cdll, name, None) is not None

    def symbol(self, name: str, restype: Any, *argtypes: Any) -> Callable[..., Any]:
        """A raw ctypes function (any return type) for helpers that do not follow the rc convention.

        Raises :class:`SymbolMissing` now when not exported.
        """
        fn = getattr(self.cdll, name, None)
        if fn is None:
            raise SymbolMissing(name, self.path.name)
        fn.restype = restype
        fn.argtypes = list(argtypes)
        return fn


_cache: dict[str, Library] = {}
_cache_lock = threading.Lock()


def load_library(name: str, explicit: str | os.PathLike | None = None, env_var: str | None = None) -> Library:
    """Load library ``name`` from the first candidate path that exists (see :func:`candidate_paths`).

    Loading the same resolved path twice returns the same :class:`Library`. Raises
    :class:`LibraryMissing` with every path tried when none loads.
    """
    tried: list[str] = []
    for p in candidate_paths(name, explicit, env_var):
        if not p.is_file():
            tried.append(f"{p} (absent)")
            continue
        key = str(p.resolve())
        with _cache_lock:
            if key in _cache:
                return _cache[key]
            try:
                cdll = ctypes.CDLL(key, mode=ctypes.RTLD_GLOBAL)
            except OSError as e:
                tried.append(f"{p} ({e})")
                continue
            lib = Library(cdll, Path(key))
            _cache[key] = lib
            return lib
    raise LibraryMissing(name, "; ".join(tried) or "no candidate path")


def load_dcmi(path: str | os.PathLike | None = None) -> Library:
    """Load ``libdcmi.so`` (``path`` from ``--dcmi-lib``, else ``$FAULTMESH_DCMI_LIB``, else the driver dirs)."""
    return load_library(DCMI_LIB_NAME, path, "FAULTMESH_DCMI_LIB")


def load_lingqu(path: str | os.PathLike | None = None) -> Library:
    """Load ``liblingqu-dcmi.so`` (``--lingqu-lib``, else ``$FAULTMESH_LINGQU_LIB``, else the driver dirs)."""
    return load_library(LINGQU_LIB_NAME, path, "FAULTMESH_LINGQU_LIB")
