"""Helpers for the Helm chart checks: the chart path, values files and a renderer.

The renderer is helm-python-sdk (Helm v4 Go SDK through ctypes, reference ecosystem.md §4.3):
``render(values) -> list[dict]`` of every object, parsed from the rendered YAML.
"""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "faultmesh"
VALUES_DIR = Path(__file__).resolve().parent / "values"
VALUES_FILES = sorted(p.name for p in VALUES_DIR.glob("*.yaml"))
NAMESPACE = "faultmesh"
RELEASE = "fm"


def load_values(name: str) -> dict:
    """The values file ``tests/chart/values/<name>`` as a dict ({} for "default")."""
    if name == "default":
        return {}
    return yaml.safe_load((VALUES_DIR / name).read_text()) or {}


def render_text(chart, values: dict) -> dict[str, str]:
    """Template path -> rendered text (like ``helm template``)."""
    return chart.render(values, name=RELEASE, namespace=NAMESPACE)


def render_objects(chart, values: dict) -> list[dict]:
    """Every Kubernetes object the chart renders with ``values`` (NOTES.txt excluded)."""
    objs = []
    for path, text in sorted(render_text(chart, values).items()):
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                objs.append(doc)
    return objs


def find(objs: list[dict], kind: str, name_suffix: str = "") -> dict:
    """The single object of ``kind`` whose name ends with ``name_suffix``. Fails when not exactly one."""
    hits = [o for o in objs if o["kind"] == kind and o["metadata"]["name"].endswith(name_suffix)]
    assert len(hits) == 1, f"expected one {kind} *{name_suffix}, got {[o['metadata']['name'] for o in hits]}"
    return hits[0]


# -- the rendered pods as the daemons see them (test_chart_render, test_chart_contract) -------------
DOWNWARD = {"spec.nodeName": "node-1", "status.hostIP": "10.0.0.1", "status.podIP": "10.1.0.2"}
"""Downward API field -> the value a test pod gets (node-1 at 10.0.0.1)."""
SECRET_VALUE = "admin"  # every secretKeyRef variable (FAULTMESH_BMC_USER)
PLAIN_ENV = ("NODE_NAME", "NODE_IP", "XDL_IP", "POD_NAMESPACE")  # read by the parsers without a prefix


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion of ``text`` with ``env`` (unknown names stay as they are)."""
    import re

    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), text)


def container_env(c: dict) -> dict[str, str]:
    """The environment of rendered container ``c`` as the kubelet sets it (:data:`DOWNWARD` for
    fieldRefs, :data:`SECRET_VALUE` for secretKeyRefs, ``$(VAR)`` of earlier entries expanded)."""
    env: dict[str, str] = {}
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = expand(str(e["value"]), env)
        elif "fieldRef" in e.get("valueFrom", {}):
            env[e["name"]] = DOWNWARD[e["valueFrom"]["fieldRef"]["fieldPath"]]
        elif "secretKeyRef" in e.get("valueFrom", {}):
            env[e["name"]] = SECRET_VALUE
    return env


def daemon_parser(command: str):
    """The argparse parser of daemon ``command`` (clusterd, noded, deviced), built in-process (it
    reads its env defaults, such as ``NODE_IP``, now)."""
    if command == "clusterd":
        from clusterd.app import _load_component_classes, build_parser

        return build_parser(_load_component_classes())
    if command == "noded":
        from noded.app import build_parser

        return build_parser()
    from deviced.app import build_parser

    return build_parser()


def pod_containers(objs: list[dict]) -> list[tuple[dict, dict]]:
    """(pod spec, container) of every daemon container the chart renders (agents, clusterd)."""
    out = []
    for kind, suffix in (("DaemonSet", "-agents"), ("Deployment", "-clusterd")):
        if [o for o in objs if o["kind"] == kind]:
            pod = find(objs, kind, suffix)["spec"]["template"]["spec"]
            out += [(pod, c) for c in pod["containers"]]
    return out


def parse_container(objs: list[dict], c: dict, monkeypatch, tmp_path: Path):
    """(parser, args namespace) of container ``c`` parsed as the daemon would in the pod: its env set
    (every ``FAULTMESH_*`` and :data:`PLAIN_ENV` variable of the test process cleared first), its
    config file from the rendered ConfigMap, its ``$(VAR)``-expanded args. Fails the test when the
    daemon would exit at parse."""
    import os

    import pytest

    from faultmesh import config

    env = container_env(c)
    for name in [k for k in os.environ if k.startswith("FAULTMESH_") or k in PLAIN_ENV]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    conf = tmp_path / f"{c['name']}.yaml"
    conf.write_text(find(objs, "ConfigMap", "faultmesh-config")["data"][f"{c['name']}.yaml"])
    monkeypatch.setenv("FAULTMESH_CONFIG", str(conf))
    args = [expand(a, env) for a in c["args"]]
    parser = daemon_parser(c["command"][0])
    try:
        return parser, config.parse(parser, args)
    except SystemExit:
        pytest.fail(f"{c['name']} rejects its command line {args} / env {sorted(env)}")
