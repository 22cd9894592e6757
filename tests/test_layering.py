"""The floors of faultmesh (issue 12, docs/architecture.md "What may import what").

- core (``faultmesh`` except the top floor) imports no service, no fdol and nothing of the top floor;
- fdol is a pure library: it imports nothing of faultmesh and no service;
- a service (noded, deviced, clusterd) imports core and fdol, never another service or the top floor;
- the top floor (``fmtools``: CLI, simulators, demo, trainsim; the training-side profiler and
  ``python -m faultmesh``) may import anything;
- and fdol needs nothing outside the standard library but numpy.

Every import is read from the source (module level and inside functions), so a lazy import counts.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

SERVICES = Path(__file__).resolve().parents[1] / "services"
FIRST_PARTY = ("faultmesh", "fmtools", "fdol", "noded", "deviced", "clusterd")
TOP = ("fmtools", "faultmesh.__main__", "faultmesh.profiler")
SERVICE_NAMES = ("noded", "deviced", "clusterd")


def floor(module: str) -> str:
    """The floor of a dotted module name: top, core, fdol, or the service's name."""
    if any(module == t or module.startswith(t + ".") for t in TOP):
        return "top"
    root = module.split(".")[0]
    return "core" if root == "faultmesh" else root


def allowed(src: str, dst: str) -> bool:
    """May a module on floor ``src`` import one on floor ``dst``?"""
    if src == "top":
        return True
    if src == "core":
        return dst == "core"
    if src == "fdol":
        return dst == "fdol"
    return dst in ("core", "fdol", src)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SERVICES).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) for every import in ``path`` (relative ones resolved)."""
    mod = module_name(path)
    pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out.append((node.lineno, target))
    return out


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) for every first-party import in ``path``."""
    return [(ln, m) for ln, m in all_imports(path) if m.split(".")[0] in FIRST_PARTY]


def sources() -> list[Path]:
    return sorted(p for p in SERVICES.rglob("*.py") if "_pb" not in p.parts and "egg-info" not in str(p))


def test_floors_are_known():
    """Every package under services/ is on a floor this test knows."""
    roots = {module_name(p).split(".")[0] for p in sources()}
    assert roots == set(FIRST_PARTY)


@pytest.mark.parametrize("path", sources(), ids=lambda p: str(p.relative_to(SERVICES)))
def test_imports_respect_floors(path: Path):
    src = floor(module_name(path))
    bad = [
        f"{path.relative_to(SERVICES)}:{ln} imports {m} ({src} -> {floor(m)})"
        for ln, m in imports(path)
        if not allowed(src, floor(m))
    ]
    assert not bad, "\n".join(bad)


def test_rules_catch_each_kind_of_breach():
    """The rule itself: each forbidden direction is refused, each allowed one accepted."""
    assert not allowed("core", "clusterd") and not allowed("core", "fdol") and not allowed("core", "top")
    assert not allowed("fdol", "core") and not allowed("noded", "deviced") and not allowed("clusterd", "top")
    assert allowed("noded", "core") and allowed("clusterd", "fdol") and allowed("top", "clusterd")


def test_fdol_needs_only_the_standard_library_and_numpy():
    """fdol is a pure library (issue 12): stdlib and numpy, nothing else installed."""
    ok = set(sys.stdlib_module_names) | {"__future__", "fdol", "numpy"}
    bad = [
        f"{p.relative_to(SERVICES)}:{ln} imports {m}"
        for p in sources()
        if module_name(p).split(".")[0] == "fdol"
        for ln, m in all_imports(p)
        if m.split(".")[0] not in ok
    ]
    assert not bad, "\n".join(bad)
