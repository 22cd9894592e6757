"""External linters on the chart (issue 8 "Chart checks"): yamllint on values and rendered output,
``promtool check rules`` on the alert rules (raw file and the rendered PrometheusRule) and
``promtool test rules`` with expected alerts. Tools that are missing skip with the install line.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from chart.chartkit import CHART, VALUES_DIR, find, load_values, render_objects, render_text

RULES = CHART / "files" / "prometheus-rules.yaml"
YAMLLINT_CONFIG = (
    "{extends: default, rules: {line-length: {max: 120}, document-start: disable, "
    "comments: {min-spaces-from-content: 1}, indentation: {spaces: consistent, indent-sequences: whatever}}}"
)


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool not installed (apt-get install prometheus)")
    return path


def _yamllint(paths: list[Path]) -> subprocess.CompletedProcess:
    try:
        import yamllint  # noqa: F401

        cmd = [sys.executable, "-m", "yamllint"]
    except ImportError:
        exe = shutil.which("yamllint")
        if exe is None:
            pytest.skip("yamllint not installed (pip install '.[dev]' or apt-get install yamllint)")
        cmd = [exe]
    return subprocess.run(
        [*cmd, "-s", "-d", YAMLLINT_CONFIG, *map(str, paths)], capture_output=True, text=True, timeout=60
    )


def test_yamllint_values_chart_and_rules():
    files = [CHART / "Chart.yaml", CHART / "values.yaml", RULES, *sorted(VALUES_DIR.glob("*.yaml"))]
    files.append(CHART / "files" / "alertmanager-inhibit.yaml")
    res = _yamllint(files)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("values_name", ["default", "full.yaml"])
def test_yamllint_rendered_output(chart, tmp_path, values_name):
    out = tmp_path / "rendered.yaml"
    # What `helm template` prints: every template's output, as one multi-document stream.
    docs = [
        t.strip("\n")
        for p, t in sorted(render_text(chart, load_values(values_name)).items())
        if not p.endswith("NOTES.txt") and t.strip()
    ]
    out.write_text("".join(f"---\n{d}\n" for d in docs))
    res = _yamllint([out])
    assert res.returncode == 0, res.stdout + res.stderr


def test_yamllint_detects_a_broken_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: 1\na: 2\nb:   [1,2\n")
    assert _yamllint([bad]).returncode != 0


def test_promtool_check_rules_raw_and_rendered(chart, tmp_path):
    promtool = _promtool()
    res = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS: 19 rules found" in res.stdout
    rule = find(render_objects(chart, load_values("full.yaml")), "PrometheusRule", "")
    rendered = tmp_path / "rendered-rules.yaml"
    rendered.write_text(yaml.safe_dump(rule["spec"]))
    res = subprocess.run(
        [promtool, "check", "rules", str(rendered)], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_promtool_rejects_a_broken_rule(tmp_path):
    promtool = _promtool()
    bad = tmp_path / "bad.yaml"
    bad.write_text("groups:\n  - name: x\n    rules:\n      - alert: X\n        expr: sum(rate(x[5m])\n")
    res = subprocess.run([promtool, "check", "rules", str(bad)], capture_output=True, text=True, timeout=60)
    assert res.returncode != 0


def test_promtool_unit_tests_fire_the_expected_alerts(tmp_path):
    promtool = _promtool()
    shutil.copy(RULES, tmp_path / "rules.yaml")
    spec = (Path(__file__).with_name("rules_test.yaml")).read_text().replace("RULES", "rules.yaml")
    (tmp_path / "rules_test.yaml").write_text(spec)
    res = subprocess.run(
        [promtool, "test", "rules", "rules_test.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout
