"""The chart <-> code contract (issue 29): what the rendered pods pass, each daemon really reads, and
what each daemon reads or writes on the host by default is mounted into its container.

- every ``--flag`` of a container's args is an option of that daemon's parser (built in-process:
  ``clusterd.app`` / ``noded.app`` / ``deviced.app`` ``build_parser``), every key of its config file
  is one of its flags;
- every environment variable is read by the daemon: ``FAULTMESH_<FLAG>`` names one of its flags
  (:func:`faultmesh.config.parse` ignores any other silently), a plain one (``NODE_IP``) changes a
  default of its parser, or the args expand it (``$(NODE_NAME)``). The chart once passed ``HOST_IP``,
  which nothing read, so every node's IP was empty;
- every absolute path the daemon's configuration holds (the rendered flags over the parser's
  defaults) and every driver directory the DCMI loader searches lies under a mount of that
  container; host directories come from a ``hostPath`` volume, and a path the daemon writes is not
  mounted read-only;
- each agent keeps its restart state (deviced ``--state-file``, noded ``--bmc-state-file``, issue 30)
  on a ``hostPath``, which outlives the pod: a rollout that loses it makes an active fault a second
  occurrence; deviced's restart grace (``--restart-grace-s``) and graceful tolerance
  (``--grace-tolerance``) follow their values.
"""

from __future__ import annotations

import os
import re

import pytest
import yaml
from chart.chartkit import (
    VALUES_FILES,
    container_env,
    daemon_parser,
    find,
    load_values,
    parse_container,
    pod_containers,
    render_objects,
)

from faultmesh import config
from faultmesh.dcmi.loader import DRIVER_LIB_DIRS

DRIVER_ROOT = "/usr/local/Ascend/driver"
"""The DCMI loader's search dirs below this are the host driver's (mounted); the others
(``/usr/local/dcmi``, ``/usr/lib64``, ``/usr/lib``) are the image's own, searched last."""
WRITES = {
    "pingmesh_dir",
    "reset_config_dir",
    "node_info_file",
    "state_file",
    "bmc_state_file",
    "slownode_data_trace_dir",
    "state_dir",
}
"""Path flags whose target the daemon writes (the rest it reads)."""
HOST_DIRS = {
    "pingmesh_dir",
    "profiling_dir",
    "reset_config_dir",
    "hccn_tool",
    "dcmi_lib",
    "slownode_data_trace_dir",
}
"""Path flags that name the host's files (shared with the driver or the training containers)."""

RESTART_STATE = {"deviced": "state_file", "noded": "bmc_state_file"}
"""Agent -> the path flag of the state it keeps across its restarts (issue 30)."""

VALUES = ["default", *VALUES_FILES]


def _under(path: str, mounts: list[dict]) -> dict | None:
    """The deepest mount of ``mounts`` holding ``path``."""
    hits = [m for m in mounts if path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")]
    return max(hits, key=lambda m: len(m["mountPath"]), default=None)


def _defaults(command: str, name: str, value: str | None, monkeypatch) -> dict:
    if value is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, value)
    return {a.dest: a.default for a in daemon_parser(command)._actions}


@pytest.mark.parametrize("values_name", VALUES)
def test_every_flag_and_variable_a_pod_passes_is_read_by_its_daemon(
    chart, values_name, tmp_path, monkeypatch
):
    values = load_values(values_name)
    objs = render_objects(chart, values)
    cfg = find(objs, "ConfigMap", "faultmesh-config")["data"]
    checked = 0
    for _, c in pod_containers(objs):
        command, name = c["command"][0], c["name"]
        parser, _ = parse_container(objs, c, monkeypatch, tmp_path)  # config.parse adds --config, --version
        dests = {a.dest for a in parser._actions if a.option_strings}
        for arg in c["args"]:
            assert arg.startswith("--"), f"{name}: positional {arg!r}"
            assert arg.split("=", 1)[0] in parser._option_string_actions, (
                f"{name}: {arg} is not a {command} flag"
            )
        for key in yaml.safe_load(cfg[f"{name}.yaml"]) or {}:
            assert str(key).replace("-", "_") in dests, f"{name}: config key {key} is not a {command} flag"
        env = container_env(c)
        expanded = {m for a in c["args"] for m in re.findall(r"\$\((\w+)\)", a)}
        own = {e["name"] for e in values.get(name, {}).get("extraEnv", [])}  # the user's, not the chart's
        for var, value in env.items():
            if var in own:
                continue
            if var.startswith("FAULTMESH_"):
                assert any(config.env_name(d) == var for d in dests), f"{name}: {var} names no {command} flag"
            elif var not in expanded:
                with monkeypatch.context() as mp:
                    read = _defaults(command, var, value, mp) != _defaults(command, var, None, mp)
                assert read, f"{name}: {command} never reads {var}"
            checked += 1
    assert checked >= 3


@pytest.mark.parametrize("values_name", VALUES)
def test_every_host_path_a_daemon_uses_by_default_is_mounted(chart, values_name, tmp_path, monkeypatch):
    objs = render_objects(chart, load_values(values_name))
    for pod, c in pod_containers(objs):
        name = c["name"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = c.get("volumeMounts", [])
        _, args = parse_container(objs, c, monkeypatch, tmp_path)
        paths = [
            (dest, p)
            for dest, value in vars(args).items()
            if dest != "config"  # the rendered config file, a ConfigMap mount (checked below)
            for p in (value if isinstance(value, list) else [value])
            if isinstance(p, str) and p.startswith("/")
        ]
        if getattr(args, "backend", None) == "dcmi" or getattr(args, "pingmesh_backend", "off") != "off":
            paths += [("dcmi library search", d) for d in DRIVER_LIB_DIRS if d.startswith(DRIVER_ROOT)]
        paths.append(
            ("config", os.environ["FAULTMESH_CONFIG"].replace(str(tmp_path), "/etc/faultmesh/config"))
        )
        assert paths, name
        for dest, path in paths:
            mount = _under(path, mounts)
            assert mount is not None, f"{name}: {dest}={path} is not under any mount of the container"
            if dest in HOST_DIRS or dest == "dcmi library search":
                assert "hostPath" in volumes[mount["name"]], f"{name}: {dest}={path} is not the host's"
            if dest in WRITES:
                assert not mount.get("readOnly"), f"{name}: {dest}={path} is written but mounted read-only"


def test_the_contract_finds_what_it_is_for(chart, tmp_path, monkeypatch):
    """The checks above fail for the faults they are for: a variable nothing reads (the chart's
    old ``HOST_IP``), a FAULTMESH_ variable of no flag, an unmounted default host path."""
    objs = render_objects(chart, {})
    _, noded = next((p, c) for p, c in pod_containers(objs) if c["name"] == "noded")
    with monkeypatch.context() as mp:
        assert _defaults("noded", "HOST_IP", "10.0.0.1", mp) == _defaults("noded", "HOST_IP", None, mp)
        assert _defaults("noded", "NODE_IP", "10.0.0.1", mp) != _defaults("noded", "NODE_IP", None, mp)
    parser, args = parse_container(objs, noded, monkeypatch, tmp_path)
    dests = {a.dest for a in parser._actions if a.option_strings}
    assert not any(config.env_name(d) == "FAULTMESH_HOST_IP" for d in dests)
    assert _under(args.profiling_dir, noded["volumeMounts"]) is not None
    assert _under(args.profiling_dir, [m for m in noded["volumeMounts"] if m["name"] != "profiling"]) is None


@pytest.mark.parametrize("values_name", VALUES)
def test_each_agent_keeps_its_restart_state_on_the_host(chart, values_name, tmp_path, monkeypatch):
    values = load_values(values_name)
    objs = render_objects(chart, values)
    agents = 0
    for pod, c in pod_containers(objs):
        dest = RESTART_STATE.get(c["command"][0])
        if dest is None:
            continue
        _, args = parse_container(objs, c, monkeypatch, tmp_path)
        path = getattr(args, dest)
        assert path, f"{c['name']}: no --{dest.replace('_', '-')}: a restart would forget the active faults"
        mount = _under(path, c["volumeMounts"])
        assert mount is not None and not mount.get("readOnly"), f"{c['name']}: {path} not writable"
        volume = {v["name"]: v for v in pod["volumes"]}[mount["name"]]
        assert "hostPath" in volume, f"{c['name']}: {path} is on {volume}, lost with the pod"
        assert path.startswith(
            values.get("agents", {}).get("hostPaths", {}).get("state", "/var/lib/faultmesh")
        )
        if c["command"][0] == "deviced":
            assert args.restart_grace_s == values.get("deviced", {}).get("restartGraceSeconds", 10)
            assert args.grace_tolerance is values.get("deviced", {}).get("graceTolerance", False)
        agents += 1
    assert agents == 2  # every values file here runs both agents


def test_deviced_restart_grace_and_graceful_tolerance_values(chart, tmp_path, monkeypatch):
    """The values reach deviced's flags, and graceful tolerance renders a command line deviced
    accepts (it needs --reset-config-dir and excludes --hot-reset: deviced.grace.check_arguments)."""
    from deviced.grace import check_arguments

    values = {"deviced": {"restartGraceSeconds": 25, "graceTolerance": True}}
    objs = render_objects(chart, values)
    c = next(c for _, c in pod_containers(objs) if c["name"] == "deviced")
    parser, args = parse_container(objs, c, monkeypatch, tmp_path)
    assert (args.restart_grace_s, args.grace_tolerance, args.reset_config_dir) == (
        25,
        True,
        "/user/restore/reset",
    )
    check_arguments(parser, args)  # exits on a bad combination
