"""ctypes binding to Huawei DCMI (``libdcmi.so``) and the lingqu switch library, shared by deviced and
noded's pingmesh. Loader and typed errors: :mod:`faultmesh.dcmi.loader`; struct layouts:
:mod:`faultmesh.dcmi.structs`; device calls: :mod:`faultmesh.dcmi.api`.
"""

from faultmesh.dcmi.loader import (
    DcmiError,
    DeviceNotReady,
    LibraryMissing,
    NotSupported,
    SymbolMissing,
    check,
    load_dcmi,
    load_lingqu,
)

__all__ = [
    "DcmiError",
    "DeviceNotReady",
    "LibraryMissing",
    "NotSupported",
    "SymbolMissing",
    "check",
    "load_dcmi",
    "load_lingqu",
]
