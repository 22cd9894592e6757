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
