"""The shape of the services (issue 28): no import cycle inside a service, no class stitched from two of
the project's own classes nor over a mixin (one project class that is no declared base), no component
of clusterd reaching through a held brain or app (``self.brain.``, ``self.b.``, ``self.app.``) or
built with one, no file of services/ over 500 lines but data tables, and a ground floor that holds only the core: no module of ``faultmesh`` imports the
tools package ``fmtools`` (CLI, demo, simulators, trainsim), so no daemon loads them.

The restructure lands in steps. What is still to undo is listed below, exactly: a new breach fails,
and so does a listed one that is gone (take it off the list, so it cannot come back). Counts may only
go down.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from test_layering import FIRST_PARTY, SERVICES, imports, module_name

# -- what is left to undo (issue 28); shrink these, never grow them -------------------------------
KNOWN_CYCLES: set[frozenset[str]] = set()
KNOWN_STITCHED: set[str] = set()
KNOWN_INHERITED: set[str] = set()  # classes over one project class that is no declared base (a mixin's shape)
KNOWN_REACHES: dict[str, int] = {}  # file under services/ -> reaches through a held brain/app
KNOWN_BUILT_WITH_SELF = {  # file -> constructions of a project class handed the builder itself
    "clusterd/auth.py": 1,  # TokenAuth's gRPC interceptor over the TokenAuth itself (one object)
}
KNOWN_LONG: dict[str, int] = {}  # file -> lines (data tables are exempt: DATA_TABLES)
KNOWN_CONFIG_GETATTR = {  # file -> reads of a flag with a default of its own: getattr(args, "x", default)
    "faultmesh/agentconf.py": 5,  # agent_options: the agents' parsers all define these flags
    # the CLI's subcommands share one Namespace, each with its own flags: a missing one is normal there
    "fmtools/cli/__init__.py": 1, "fmtools/cli/common.py": 5, "fmtools/cli/explain.py": 1, "fmtools/cli/jobs.py": 2,
    "fmtools/cli/_grpc.py": 3,  # the gRPC TLS flags: only the gRPC subcommands have them (issue 29)
}  # fmt: skip
KNOWN_NAMESPACE_PARAMS = {  # file -> constructors (``__init__``) given the parsed command line as ``args``
    "clusterd/app.py": 1,  # ClusterD: the wiring, which builds every component's typed section
    "deviced/app.py": 1, "deviced/chipio.py": 1, "faultmesh/kubecm.py": 2, "noded/app.py": 1,
}  # fmt: skip
KNOWN_CONTEXT_CONFIG = {"clusterd/brain/component.py": 1}  # reads of the whole Namespace (``ctx.config``)
CONFIG_GETATTR = re.compile(r"""getattr\(\s*(?:self\.)?(?:args|a|cfg|config|ctx\.config)\s*,\s*f?["']""")
TOOLS = "fmtools"  # the top floor's own package
TOOLS_ENTRY = "faultmesh/__main__.py"  # ``python -m faultmesh``: run, never imported; loads the CLI lazily
DATA_TABLES = {"deviced/tables.py"}  # mostly literal tables
DECLARED_BASES = {  # project classes made to be extended: a subclass is one of their kind, no mixin
    "PushSource",  # faultmesh.source: the sources' contract
    "PolledSource",
    "StorageSource",  # noded: the storage monitors (Dpc, Dtfs set their kind)
    "AgentConfigMapSink",  # faultmesh.kubecm: an agent's one ConfigMap
    "HttpBase",  # faultmesh.httplite: both HTTP servers' settings
    "Store",  # clusterd.store: MirroredStore is a Store
    "MirroredStore",  # clusterd.kube.hastate: HistoryStore is the HA store that also feeds the history mirror
    "KubeState",  # clusterd.kube.hastate: the fenced, retried ConfigMap document (HA state, history mirror)
    "StateMetrics",  # clusterd.kube.hastate: one ConfigMap document's metrics (the history mirror adds two)
    "FaultCodeTable",  # deviced.tables: NvidiaCodeTable is a fault code table
}
MAX_LINES = 500
REACH = re.compile(r"\bself\.(?:b|brain|app)\.")


def service_files() -> dict[str, Path]:
    """Dotted module -> path of every first-party module under services/ (generated code aside)."""
    return {module_name(p): p for p in SERVICES.rglob("*.py") if "_pb" not in p.parts}


def import_graph(files: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the first-party modules it imports (a ``from pkg import submodule`` counts as an
    import of the submodule only)."""
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        tree = ast.parse(path.read_text())
        submodule_lines = {
            n.lineno
            for n in ast.walk(tree)
            if isinstance(n, ast.ImportFrom)
            and n.module
            and not n.level
            and all(f"{n.module}.{a.name}" in files for a in n.names)
        }
        out: set[str] = set()
        for n in ast.walk(tree):
            if isinstance(n, ast.ImportFrom) and n.module and not n.level:
                out |= {f"{n.module}.{a.name}" for a in n.names if f"{n.module}.{a.name}" in files}
        for line, target in imports(path):
            if line in submodule_lines:
                continue
            while target and target not in files:
                target = target.rpartition(".")[0]
            if target:
                out.add(target)
        out.discard(mod)
        graph[mod] = out
    return graph


def cycles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: set[frozenset[str]] = set()
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.add(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    found.add(frozenset(comp))
    return found


def own_names(tree: ast.Module) -> set[str]:
    """Names of ``tree`` that are the project's own: imported from a first-party module, or its classes."""
    own = {
        a.asname or a.name
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and n.module and n.module.split(".")[0] in FIRST_PARTY
        for a in n.names
    }
    return own | {n.name for n in tree.body if isinstance(n, ast.ClassDef)}


def stitched(tree: ast.Module, mod: str) -> set[str]:
    """Classes of ``tree`` with two or more bases that are the project's own classes."""
    own = own_names(tree)
    out = set()
    for n in tree.body:
        if isinstance(n, ast.ClassDef):
            bases = [b.id for b in n.bases if isinstance(b, ast.Name) and b.id in own]
            if len(bases) >= 2:
                out.add(f"{mod}.{n.name}")
    return out


def inherited(tree: ast.Module, mod: str) -> set[str]:
    """Classes of ``tree`` over a project class that is neither a declared base (DECLARED_BASES)
    nor an exception (a name ending in ``Error``): a mixin's shape, a part that should be held."""
    own = own_names(tree)
    return {
        f"{mod}.{n.name}"
        for n in ast.walk(tree)
        if isinstance(n, ast.ClassDef)
        and any(
            isinstance(b, ast.Name)
            and b.id in own
            and b.id not in DECLARED_BASES
            and not b.id.endswith("Error")
            for b in n.bases
        )
    }


def built_with_self(tree: ast.Module) -> int:
    """Calls of a capitalised name (a class) with the bare ``self`` as an argument."""
    return sum(
        1
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Name)
        and n.func.id[:1].isupper()
        and any(isinstance(a, ast.Name) and a.id == "self" for a in n.args)
    )


def tool_imports(tree: ast.Module) -> list[int]:
    """Lines of ``tree`` that import the tools package (at module level or inside a function)."""
    return sorted(
        n.lineno
        for n in ast.walk(tree)
        if (isinstance(n, ast.Import) and any(a.name.split(".")[0] == TOOLS for a in n.names))
        or (isinstance(n, ast.ImportFrom) and not n.level and (n.module or "").split(".")[0] == TOOLS)
    )


def rel(path: Path) -> str:
    return path.relative_to(SERVICES).as_posix()


def test_no_import_cycle_inside_a_service():
    found = cycles(import_graph(service_files()))
    assert found - KNOWN_CYCLES == set(), "new import cycle"
    assert KNOWN_CYCLES - found == set(), "a listed cycle is gone: take it off KNOWN_CYCLES"


def test_no_class_stitched_from_two_project_classes():
    found = set()
    for mod, path in service_files().items():
        found |= stitched(ast.parse(path.read_text()), mod)
    assert found - KNOWN_STITCHED == set(), "new stitched class"
    assert KNOWN_STITCHED - found == set(), "a listed class is no longer stitched: take it off"


def test_no_class_over_a_mixin():
    """A class over one project class that is no declared base is a mixin's shape (issue 28: the
    brain was ``BrainComponent(FaultIntake)``); the part should be a held object."""
    found = set()
    for mod, path in service_files().items():
        found |= inherited(ast.parse(path.read_text()), mod)
    assert found - KNOWN_INHERITED == set(), "new class over a project class that is no declared base"
    assert KNOWN_INHERITED - found == set(), "a listed class no longer inherits: take it off"


def test_no_reach_through_a_held_brain_or_app():
    counts = {}
    for path in (SERVICES / "clusterd").rglob("*.py"):
        n = len(REACH.findall(path.read_text()))
        if n:
            counts[rel(path)] = n
    grown = {f: n for f, n in counts.items() if n > KNOWN_REACHES.get(f, 0)}
    assert grown == {}, "reaches through a held brain/app grew"
    shrunk = {f: n for f, n in KNOWN_REACHES.items() if counts.get(f, 0) < n}
    assert shrunk == {}, "fewer reaches than listed: lower KNOWN_REACHES"


def test_no_component_built_with_its_builder():
    counts = {}
    for path in (SERVICES / "clusterd").rglob("*.py"):
        n = built_with_self(ast.parse(path.read_text()))
        if n:
            counts[rel(path)] = n
    assert counts == KNOWN_BUILT_WITH_SELF


def test_files_stay_short():
    long = {}
    for path in SERVICES.rglob("*.py"):
        if "_pb" in path.parts or rel(path) in DATA_TABLES:
            continue
        n = len(path.read_text().splitlines())
        if n > MAX_LINES:
            long[rel(path)] = n
    grown = {f: n for f, n in long.items() if n > KNOWN_LONG.get(f, MAX_LINES)}
    assert grown == {}, f"files over {MAX_LINES} lines (or longer than listed)"
    gone = {f for f in KNOWN_LONG if f not in long}
    assert gone == set(), "a listed file is short now: take it off KNOWN_LONG"


def test_the_core_never_imports_the_tools():
    """The ground floor holds only the core (issue 28): what every daemon imports loads no CLI, demo,
    simulator or trainsim; the one exception is the ``python -m faultmesh`` entry."""
    found = {
        f"{rel(path)}:{line}"
        for path in (SERVICES / "faultmesh").rglob("*.py")
        if "_pb" not in path.parts and rel(path) != TOOLS_ENTRY
        for line in tool_imports(ast.parse(path.read_text()))
    }
    assert found == set(), "the core imports the tools package"
    assert tool_imports(ast.parse((SERVICES / TOOLS_ENTRY).read_text())), "the entry no longer runs the CLI"
    assert not any(p.stem in ("cli", "demo", "sims", "trainsim") for p in (SERVICES / "faultmesh").iterdir())


def namespace_params(tree: ast.Module) -> int:
    """Constructors (``__init__``) with a parameter named ``args``: a component given the whole
    parsed command line instead of its typed section (:func:`faultmesh.config.section`)."""
    return sum(
        1
        for n in ast.walk(tree)
        if isinstance(n, ast.FunctionDef)
        and n.name == "__init__"
        and any(a.arg == "args" for a in n.args.args + n.args.kwonlyargs)
    )


def shrink_only(counts: dict[str, int], known: dict[str, int], what: str) -> None:
    """``counts`` may not grow past ``known`` per file, and a file that shrank must be listed lower."""
    grown = {f: n for f, n in counts.items() if n > known.get(f, 0)}
    assert grown == {}, f"{what} grew"
    shrunk = {f: counts.get(f, 0) for f, n in known.items() if counts.get(f, 0) < n}
    assert shrunk == {}, f"fewer {what} than listed: lower the known counts"


def test_flags_are_read_from_typed_sections():
    """Issue 28: a component reads its typed configuration section, built once from the parser (the
    one source of defaults), not ``getattr(args, "x", default)`` on the whole Namespace (a default in
    two places), and is not constructed with the Namespace; the counts left may only shrink."""
    getattrs, params, context = {}, {}, {}
    for path in SERVICES.rglob("*.py"):
        if "_pb" in path.parts:
            continue
        text = path.read_text()
        if n := len(CONFIG_GETATTR.findall(text)):
            getattrs[rel(path)] = n
        if n := namespace_params(ast.parse(text)):
            params[rel(path)] = n
        if (n := text.count("ctx.config")) and path.is_relative_to(SERVICES / "clusterd"):
            context[rel(path)] = n
    shrink_only(getattrs, KNOWN_CONFIG_GETATTR, 'getattr(args, "flag", default) reads')
    shrink_only(params, KNOWN_NAMESPACE_PARAMS, "constructors given the whole Namespace")
    shrink_only(context, KNOWN_CONTEXT_CONFIG, "reads of ctx.config")


def test_the_checks_catch_each_breach():
    graph = {"a.x": {"a.y"}, "a.y": {"a.z"}, "a.z": {"a.x"}, "a.w": {"a.x"}}
    assert cycles(graph) == {frozenset({"a.x", "a.y", "a.z"})}
    tree = ast.parse(
        "from clusterd.brain.jobs import A\nclass B: ...\nclass C(A, B): ...\nclass D(A, dict): ...\n"
        "class E:\n    def f(self):\n        return Servicer(self), helper(self), Other(self.x)\n"
    )
    assert stitched(tree, "m") == {"m.C"}
    assert inherited(tree, "m") == {"m.C", "m.D"}
    mixed = ast.parse(
        "from clusterd.brain.intake import FaultIntake\nfrom faultmesh.source import PushSource\n"
        "from faultmesh.kube import KubeError\nclass BrainComponent(FaultIntake): ...\n"
        "class Src(PushSource): ...\nclass Gone(KubeError): ...\nclass Plain(dict): ...\n"
    )
    assert inherited(mixed, "m") == {"m.BrainComponent"}
    assert built_with_self(tree) == 1
    flags = 'getattr(args, "x", 1); getattr(self.args, f"{k}_file"); getattr(a, "y"); getattr(obj, "z", 0)'
    assert len(CONFIG_GETATTR.findall(flags)) == 3
    assert (
        namespace_params(
            ast.parse("class A:\n    def __init__(self, args, b): ...\n    def f(self, args): ...")
        )
        == 1
    )
    tools = ast.parse(
        "import fmtools.cli\ndef f():\n    from fmtools import demo\nfrom faultmesh import fmtools_x\n"
    )
    assert tool_imports(tools) == [1, 3]
    assert REACH.findall("self.brain.jobs; self.b.x; self.app.y; self.bx.z") == [
        "self.brain.",
        "self.b.",
        "self.app.",
    ]
