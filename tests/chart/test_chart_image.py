"""The Dockerfile and the chart agree (issue 8 "one image, entrypoints per service, non-root").

No Docker engine runs here, so the image itself is not built in tests; these checks catch the
mistakes that would only show on a cluster: a chart command with no console script, a non-root uid
that differs between image and chart, a build context that ships the venv.
"""

from __future__ import annotations

import re
import tomllib

from chart.chartkit import CHART, find, render_objects

ROOT = CHART.parents[1]


def _dockerfile() -> str:
    return (ROOT / "Dockerfile").read_text()


def test_every_chart_command_is_a_console_script_of_the_image(chart):
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    objs = render_objects(chart, {})
    commands = set()
    for kind, suffix in (("DaemonSet", "-agents"), ("Deployment", "-clusterd")):
        for c in find(objs, kind, suffix)["spec"]["template"]["spec"]["containers"]:
            commands.add(c["command"][0])
    assert commands == {"noded", "deviced", "clusterd"}
    assert commands <= set(scripts)
    # The image installs the project (so the console scripts exist) and puts them on PATH.
    text = _dockerfile()
    assert re.search(r"pip install \.\s*$", text, re.M)
    assert "ENV PATH=/opt/faultmesh/bin:$PATH" in text


def test_image_user_is_non_root_and_matches_the_chart(chart):
    text = _dockerfile()
    users = re.findall(r"^USER (\d+):(\d+)$", text, re.M)
    assert users == [("10001", "10001")]
    c = find(render_objects(chart, {}), "Deployment", "-clusterd")["spec"]["template"]["spec"]["containers"][
        0
    ]
    assert c["securityContext"]["runAsUser"] == 10001 and c["securityContext"]["runAsNonRoot"] is True
    assert "tini" in text.split("ENTRYPOINT", 1)[1].splitlines()[0]


def test_build_context_excludes_local_state():
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()}
    assert {".venv", ".git", "tests"} <= ignored
    copied = re.findall(r"^COPY (?!--from)(.+?) \S+$", _dockerfile(), re.M)
    sources = {s for line in copied for s in line.split()}
    assert sources == {"pyproject.toml", "README.md", "services", "proto"}
