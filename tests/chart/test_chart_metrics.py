"""The daemons' live metrics (issues 8, 17): ``promtool check metrics`` passes on each scrape, every
series carries the one prefix, the chart's alert rules only use series the daemons really export,
and docs/metrics.md names every exported series (the scrape: chart/livescrape.py)."""

from __future__ import annotations

import asyncio
import re
import shutil
from pathlib import Path

import pytest
import yaml
from chart.livescrape import exported, metric_names

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "charts" / "faultmesh" / "files" / "prometheus-rules.yaml"
DOCS = ROOT / "docs" / "metrics.md"


async def _promtool_check(promtool: str, text: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        promtool,
        "check",
        "metrics",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(text.encode()), 60)
    return proc.returncode, out.decode()


async def test_daemon_metrics_pass_promtool(scrapes):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (apt-get install prometheus)")
    for name, text in scrapes.items():
        rc, out = await _promtool_check(promtool, text)
        assert rc == 0, f"{name}: promtool check metrics:\n{out}"
        # issue 17: process_* and build_info on every daemon, no *_created series
        assert "\nprocess_cpu_seconds_total " in text, name
        assert re.search(rf'^faultmesh_build_info{{.*service="{name}".*}} 1.0$', text, re.M), name
        assert "_created" not in text, name


def test_every_series_has_the_faultmesh_prefix(scrapes):
    """issue 17: one prefix; noded's own series are faultmesh_noded_* (no bare noded_*)."""
    for name, text in scrapes.items():
        odd = {m for m in metric_names(text) if not m.startswith(("faultmesh_", "process_"))}
        assert not odd, f"{name} exports series without the faultmesh_ prefix: {sorted(odd)}"
    assert "faultmesh_noded_bmc_polls_total" in metric_names(scrapes["noded"])
    assert "faultmesh_deviced_poll_duration_seconds" in metric_names(scrapes["deviced"])


def test_alert_rules_use_exported_series(scrapes):
    """Every rule reads exported series, directly or through the recording rules it names
    (``faultmesh:<metric>:<op>``, issue 31's held series), and every recording rule it names exists."""
    names = exported(scrapes)
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    records = {r["record"]: r for r in rules if "record" in r}

    def used(rule: dict, seen: frozenset = frozenset()) -> set[str]:
        out = set(re.findall(r"\b(faultmesh_[a-z_]+)", rule["expr"]))
        for rec in set(re.findall(r"\b(faultmesh:[a-z_]+:[a-z_]+)", rule["expr"])) - seen:
            assert rec in records, f"{rule.get('alert') or rule['record']} names an unknown record {rec}"
            out |= used(records[rec], seen | {rec})
        return out

    for rule in rules:
        got = used(rule)
        name = rule.get("alert") or rule["record"]
        assert got or re.match(r"max by \(job, instance\) \(up\{", rule["expr"]), name
        missing = got - names
        assert not missing, f"{name} uses metrics no daemon exports: {missing}"


def test_docs_name_every_exported_series(scrapes):
    """docs/metrics.md is the operator's list: a series a daemon exports and the page leaves out fails."""
    documented = set(re.findall(r"`((?:faultmesh|process)_[a-z_]+)", DOCS.read_text()))
    for name, text in scrapes.items():
        missing = {m for m in metric_names(text) if m not in documented and m + "_total" not in documented}
        assert not missing, f"docs/metrics.md does not name {name}'s {sorted(missing)}"


def test_docs_give_one_series_name_one_label_set():
    """A series name is one label set, whichever daemon exports it (Prometheus aggregates by name:
    ``faultmesh_kube_writes_total`` was ``{kind,result}`` in clusterd and ``{configmap,result}`` in
    the agents). Read from the tables of docs/metrics.md, which name every exported series."""
    seen: dict[str, tuple[str, str]] = {}
    row = re.compile(r"^\|\s*(`[^|]+`)\s*\|\s*[a-z]+\s*\|\s*([^|]*)\|", re.M)
    for names, labels in row.findall(DOCS.read_text()):
        got = ",".join(sorted(x.strip() for x in labels.split(",") if x.strip()))
        for name in re.findall(r"`((?:faultmesh|process)_[a-z_]+)", names):
            first = seen.setdefault(name, (got, names))
            assert first[0] == got, f"{name}: labels {{{first[0]}}} and {{{got}}} in docs/metrics.md"
    assert seen["faultmesh_kube_writes_total"][0] == "kind,result"
