"""The Grafana dashboard shipped in the chart (issue 17 "Metrics and alerts").

A user turns on ``metrics.grafanaDashboard.enabled`` and the Grafana sidecar loads the ConfigMap
labelled ``grafana_dashboard: "1"``; every query on it must draw a series faultmesh really exports
(names parsed out of the PromQL and compared with a live scrape of clusterd, noded and deviced) and
be valid PromQL (``promtool check rules`` on the queries as recording rules).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
import yaml
from chart.chartkit import CHART, NAMESPACE, find, render_objects
from chart.livescrape import exported

DASHBOARD = CHART / "files" / "grafana-dashboard.json"
# PromQL words that are not metric names (functions are told apart by their "(")
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "inf", "nan"}
_GRAFANA_VARS = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h", "$node": ".*"}


def promql_metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: strings, label matchers, ranges and the label
    lists of by/without/on/ignoring/group_left/group_right are cut away, then every identifier that
    is not a function call, a keyword or a number is a metric name."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)
    s = re.sub(r"\{[^}]*\}", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    names = set()
    for m in re.finditer(r"(?<![\w$.])([a-zA-Z_:][\w:]*)(\s*\()?", s):
        word, call = m.group(1), m.group(2)
        if not call and word.lower() not in _KEYWORDS:
            names.add(word)
    return names


def test_metric_name_parser():
    expr = (
        "histogram_quantile(0.99, sum by (le) (rate(faultmesh_store_commit_seconds_bucket[$__rate_interval])))"
        ' + on (job, instance) group_left (service) faultmesh_build_info{service="a b", x=~"$node"}'
        " - time() > bool 1e3 or process_open_fds offset 5m"
    )
    assert promql_metric_names(expr) == {
        "faultmesh_store_commit_seconds_bucket",
        "faultmesh_build_info",
        "process_open_fds",
    }


def _queries(dash: dict) -> list[tuple[str, str]]:
    out = []
    for p in dash["panels"]:
        for t in p.get("targets", []):
            out.append((p["title"], t["expr"]))
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            out.append((f"variable {v['name']}", re.sub(r"^label_values\((.*),\s*\w+\)$", r"\1", q)))
    return out


def test_every_dashboard_query_names_exported_series(scrapes):
    dash = json.loads(DASHBOARD.read_text())
    names = exported(scrapes)
    queries = _queries(dash)
    assert len(queries) >= 30
    for title, expr in queries:
        used = promql_metric_names(expr)
        assert used, f"{title}: {expr!r} selects no series"
        missing = used - names
        assert not missing, f"panel {title!r} queries series no faultmesh daemon exports: {sorted(missing)}"
    # every faultmesh daemon and the BMC / DCMI polling have panels
    drawn = set().union(*(promql_metric_names(e) for _, e in queries))
    for must in (
        "faultmesh_node_health",
        "faultmesh_noded_bmc_errors_total",
        "faultmesh_deviced_dcmi_errors_total",
    ):
        assert must in drawn


def test_dashboard_queries_are_valid_promql(tmp_path):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (apt-get install prometheus)")
    rules = []
    for i, (_, expr) in enumerate(_queries(json.loads(DASHBOARD.read_text()))):
        for var, val in _GRAFANA_VARS.items():
            expr = expr.replace(var, val)
        rules.append({"record": f"faultmesh:dashboard_query_{i}", "expr": expr})
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    r = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_dashboard_is_a_grafana_dashboard():
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] and dash["title"] == "faultmesh"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert {"datasource", "node"} <= variables
    for p in dash["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(refs) == len(set(refs)), p["title"]


def test_chart_ships_the_dashboard_for_the_grafana_sidecar(chart):
    assert not [
        o
        for o in render_objects(chart, {})
        if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-dashboard")
    ]
    values = {
        "metrics": {
            "grafanaDashboard": {
                "enabled": True,
                "namespace": "monitoring",
                "annotations": {"grafana_folder": "faultmesh"},
            }
        }
    }
    cm = find(render_objects(chart, values), "ConfigMap", "-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "faultmesh"}
    assert json.loads(cm["data"]["faultmesh.json"]) == json.loads(DASHBOARD.read_text())
    cm = find(
        render_objects(chart, {"metrics": {"grafanaDashboard": {"enabled": True}}}), "ConfigMap", "-dashboard"
    )
    assert cm["metadata"]["namespace"] == NAMESPACE
