"""Chart checks (issue 8 "Chart checks in make test"): render with several values files, lint,
validate every object with kubernetes-validate (strict) for Kubernetes 1.28 and 1.33, and check
what an operator relies on: privileges, mounts, flags, RBAC, sizing, schema errors.
"""

from __future__ import annotations

import json

import pytest
import yaml
from chart.chartkit import (
    CHART,
    NAMESPACE,
    VALUES_FILES,
    find,
    load_values,
    parse_container,
    pod_containers,
    render_objects,
    render_text,
)

KUBE_VERSIONS = ("1.28.0", "1.33.0")
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}  # no bundled schema; checked by the tests below


def _container(objs: list[dict], kind: str, suffix: str, name: str) -> dict:
    pod = find(objs, kind, suffix)["spec"]["template"]["spec"]
    return next(c for c in pod["containers"] if c["name"] == name)


def _cpu_m(q: str) -> float:
    return float(q[:-1]) if q.endswith("m") else float(q) * 1000


def _mem_mi(q: str) -> float:
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024}
    return float(q[:-2]) * units[q[-2:]]


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_chart_lints_clean(helm, kube_version):
    report = helm.lint(str(CHART), strict=True, kube_version="v" + kube_version)
    assert report["errors"] == []
    assert report["messages"] == [], report["messages"]


@pytest.mark.parametrize("values_name", ["default", *VALUES_FILES])
def test_every_rendered_object_validates_strict(chart, values_name):
    kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate not installed")
    objs = render_objects(chart, load_values(values_name))
    assert objs
    checked = 0
    for obj in objs:
        if obj["kind"] in CRD_KINDS:
            continue
        for version in KUBE_VERSIONS:
            try:
                kv.validate(obj, version, strict=True)
            except kv.ValidationError as e:
                pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} invalid for {version}: {e.message}")
        checked += 1
    assert checked >= 5


def test_agents_daemonset_defaults(chart):
    objs = render_objects(chart, {})
    ds = find(objs, "DaemonSet", "-agents")
    pod = ds["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert pod["automountServiceAccountToken"] is False  # agents never call the API server
    assert pod["nodeSelector"] == {"workerselector": "dls-worker-node"}
    assert {"operator": "Exists"} in pod["tolerations"]
    names = [c["name"] for c in pod["containers"]]
    assert names == ["noded", "deviced"]
    total_cpu = sum(_cpu_m(c["resources"]["requests"]["cpu"]) for c in pod["containers"])
    total_mem = sum(_mem_mi(c["resources"]["requests"]["memory"]) for c in pod["containers"])
    assert total_cpu <= 100 and total_mem <= 128
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["driver"]["hostPath"]["path"] == "/usr/local/Ascend/driver"
    assert volumes["pingmesh-result"]["hostPath"]["path"] == "/user/mind-cluster/pingmesh"
    assert volumes["profiling"]["hostPath"]["path"] == "/user/cluster-info/profiling"
    for c in pod["containers"]:
        mounts = {m["name"]: m for m in c["volumeMounts"]}
        assert mounts["driver"].get("readOnly") is True, c["name"]
        env = {e["name"]: e for e in c["env"]}
        assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
        assert env["NODE_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"  # --node-ip
        assert "--node-name=$(NODE_NAME)" in c["args"]
        assert "--clusterd=clusterd-grpc-svc.faultmesh.svc:8899" in c["args"]
        # Live-updated ConfigMaps must not use subPath (kubelet never refreshes subPath mounts).
        for m in c["volumeMounts"]:
            if m["name"] in ("fault-tables", "pingmesh-config"):
                assert "subPath" not in m
    noded = _container(objs, "DaemonSet", "-agents", "noded")
    assert "--http-addr=$(NODE_IP):11255" in noded["args"]
    deviced = _container(objs, "DaemonSet", "-agents", "deviced")
    assert "--backend=dcmi" in deviced["args"]
    assert {m["name"] for m in deviced["volumeMounts"]} >= {"dev", "driver", "reset-config"}


def test_bmc_credentials_come_from_a_secret_never_argv(chart):
    values = load_values("full.yaml")
    objs = render_objects(chart, values)
    noded = _container(objs, "DaemonSet", "-agents", "noded")
    assert "--bmc-host=$(NODE_NAME)-bmc.mgmt.example.com" in noded["args"]
    assert "--bmc-password-file=/etc/faultmesh/bmc/password" in noded["args"]
    assert not any("not-a-real-password" in a for a in noded["args"])
    env = {e["name"]: e for e in noded["env"]}
    secret = find(objs, "Secret", "-bmc")
    assert env["FAULTMESH_BMC_USER"]["valueFrom"]["secretKeyRef"] == {
        "name": secret["metadata"]["name"],
        "key": "username",
    }
    assert secret["stringData"]["password"] == "not-a-real-password"
    # An existing Secret is used as is and the chart creates none (only the generated token's).
    objs = render_objects(chart, load_values("minimal.yaml"))
    assert [o["metadata"]["name"] for o in objs if o["kind"] == "Secret"] == ["fm-faultmesh-token"]
    pod = find(objs, "DaemonSet", "-agents")["spec"]["template"]["spec"]
    bmc = next(v for v in pod["volumes"] if v["name"] == "bmc")
    assert bmc["secret"]["secretName"] == "bmc-credentials"
    noded = next(c for c in pod["containers"] if c["name"] == "noded")
    assert noded["securityContext"]["privileged"] is False


def test_clusterd_deployment_service_and_state(chart):
    objs = render_objects(chart, {})
    dep = find(objs, "Deployment", "-clusterd")
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"]["type"] == "Recreate"
    c = _container(objs, "Deployment", "-clusterd", "clusterd")
    assert {
        "--grpc-addr=0.0.0.0:8899",
        "--http-addr=0.0.0.0:8080",
        "--state-dir=/var/lib/faultmesh",
        "--kube",
    } <= set(c["args"])
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"]["drop"] == ["ALL"] and sc["allowPrivilegeEscalation"] is False
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    pod = dep["spec"]["template"]["spec"]
    state = next(v for v in pod["volumes"] if v["name"] == "state")
    pvc = find(objs, "PersistentVolumeClaim", "-clusterd-state")
    assert state["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    svc = find(objs, "Service", "clusterd-grpc-svc")
    assert {p["name"]: p["port"] for p in svc["spec"]["ports"]} == {"grpc": 8899, "http": 8080}
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    # emptyDir when persistence is off, and no PVC.
    objs = render_objects(chart, load_values("minimal.yaml"))
    pod = find(objs, "Deployment", "-clusterd")["spec"]["template"]["spec"]
    assert next(v for v in pod["volumes"] if v["name"] == "state") == {"name": "state", "emptyDir": {}}
    assert not [o for o in objs if o["kind"] == "PersistentVolumeClaim"]


def _grants(role: dict) -> set[tuple[str, str, str]]:
    return {
        (g, res, v)
        for r in role["rules"]
        for g in r["apiGroups"]
        for res in r["resources"]
        for v in r["verbs"]
    }


def _roles(objs: list[dict], suffix: str) -> dict[str, set]:
    """namespace -> grants of the chart's Roles named ``*<suffix>`` (each bound to its SA)."""
    out = {}
    for role in (o for o in objs if o["kind"] == "Role" and o["metadata"]["name"].endswith(suffix)):
        ns = role["metadata"]["namespace"]
        binding = next(
            o for o in objs if o["kind"] == "RoleBinding" and o["metadata"]["namespace"] == ns
            and o["metadata"]["name"] == role["metadata"]["name"]
        )  # fmt: skip
        assert binding["roleRef"]["name"] == role["metadata"]["name"]
        out[ns] = _grants(role)
    return out


def test_rbac_is_least_privilege(chart):
    objs = render_objects(chart, {})
    granted = _grants(find(objs, "ClusterRole", "-clusterd"))
    resources = {res for _, res, _ in granted}
    assert resources == {"configmaps", "nodes", "nodes/status", "pods", "podgroups"}
    # cluster-wide: read, node patch, pod / podgroup patch (labels), ConfigMap patch (reset-config in any
    # job namespace: jobNamespaces is empty by default) and create/delete (data-trace-<job>, issue 29)
    # -- no other create/update/delete anywhere
    cm_read = {"get", "list", "watch"}
    assert {v for _, res, v in granted if res == "configmaps"} == cm_read | {"patch", "create", "delete"}
    assert {v for _, res, v in granted if res == "pods"} == {"get", "list", "watch", "patch"}
    assert {v for _, res, v in granted if res == "nodes/status"} == {"patch"}
    assert ("scheduling.volcano.sh", "podgroups", "patch") in granted
    writes = {"create", "update", "delete", "deletecollection", "*"}
    assert not {v for _, res, v in granted if res != "configmaps"} & writes
    assert {v for _, res, v in granted if res == "configmaps"} & writes == {"create", "delete"}
    c = _container(objs, "Deployment", "-clusterd", "clusterd")
    assert "--kube-data-trace-configmaps=on" in c["args"]
    # without the data-trace writes: ConfigMap patch only (reset-config), the flag off
    off = render_objects(chart, {"clusterd": {"kube": {"dataTraceConfigMaps": False}}})
    granted_off = _grants(find(off, "ClusterRole", "-clusterd"))
    assert {v for _, res, v in granted_off if res == "configmaps"} == cm_read | {"patch"}
    assert (
        "--kube-data-trace-configmaps=off" in _container(off, "Deployment", "-clusterd", "clusterd")["args"]
    )
    assert not any(res == "*" for _, res, _ in granted)
    binding = find(objs, "ClusterRoleBinding", "-clusterd")
    sa = find(objs, "ServiceAccount", "-clusterd")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": NAMESPACE}
    ]
    # writes only where the reference writes: cluster-info-* in mindx-dl, events (one replica: no
    # Lease, no state ConfigMap; see test_clusterd_replicas_elect_a_leader)
    roles = _roles(objs, "-clusterd")
    assert roles == {
        "mindx-dl": {("", "configmaps", v) for v in ("create", "update", "patch")},
        "default": {("", "events", "create"), ("", "events", "patch")},
        # fault-job-info; pingmesh-fault-<node> and super-pod-<id> (deleted when the super pod's last node left)
        "cluster-system": {("", "configmaps", v) for v in ("create", "patch", "delete")},
    }
    fji = next(
        o for o in objs
        if o["kind"] == "Role" and o["metadata"]["name"].endswith("-clusterd")
        and o["metadata"]["namespace"] == "cluster-system"
    )  # fmt: skip
    # patch: fault-job-info by name, and (pingmesh on) the per-node pingmesh-fault-<node> ConfigMaps
    assert [r.get("resourceNames") for r in fji["rules"] if "patch" in r["verbs"]] == [
        ["fault-job-info"],
        None,
    ]
    c = _container(objs, "Deployment", "-clusterd", "clusterd")
    assert "--kube-fault-job-info-namespace=cluster-system" in c["args"]
    # the agents have no API access by default
    assert not [
        o
        for o in objs
        if o["metadata"]["name"].endswith("-agents") and o["kind"] in ("Role", "ServiceAccount")
    ]
    pod = find(objs, "DaemonSet", "-agents")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False and "serviceAccountName" not in pod
    # Without Kubernetes mode: no RBAC and no API token in the clusterd pod.
    objs = render_objects(chart, load_values("minimal.yaml"))
    assert not [o for o in objs if o["kind"] in ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")]
    pod = find(objs, "Deployment", "-clusterd")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert "--kube" not in pod["containers"][0]["args"]


def test_rbac_with_job_namespaces_and_agent_kube_mode(chart):
    objs = render_objects(chart, load_values("full.yaml"))
    granted = _grants(find(objs, "ClusterRole", "-clusterd"))
    assert {v for _, res, v in granted if res == "configmaps"} == {
        "get",
        "list",
        "watch",
    }  # no cluster-wide write
    # the job hand-off's patches (reset-config, fault-type pod label, PodGroup) only in the job namespaces
    assert {v for _, res, v in granted if res in ("pods", "podgroups")} == {"get", "list", "watch"}
    roles = _roles(objs, "-clusterd")
    assert (
        roles["train"]
        == roles["research"]
        == {
            ("", "configmaps", "patch"),
            ("", "configmaps", "create"),  # data-trace-<job>: created, deleted with the job
            ("", "configmaps", "delete"),
            ("", "pods", "patch"),
            ("scheduling.volcano.sh", "podgroups", "patch"),
        }
    )
    c = _container(objs, "Deployment", "-clusterd", "clusterd")
    assert {"--kube-taint=on", "--kube-taint-max-share=0.05", "--kube-podgroups=on"} <= set(c["args"])
    # agents: their own ServiceAccount, ConfigMap rights in mindx-dl (noded) and kube-system (deviced) only
    agent_roles = _roles(objs, "-agents")
    assert set(agent_roles) == {"mindx-dl", "kube-system"}
    assert all({res for _, res, _ in g} == {"configmaps"} for g in agent_roles.values())
    assert not [o for o in objs if o["kind"] == "ClusterRole" and o["metadata"]["name"].endswith("-agents")]
    pod = find(objs, "DaemonSet", "-agents")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is True
    assert pod["serviceAccountName"] == find(objs, "ServiceAccount", "-agents")["metadata"]["name"]
    noded = _container(objs, "DaemonSet", "-agents", "noded")
    deviced = _container(objs, "DaemonSet", "-agents", "deviced")
    assert {"--kube", "--kube-namespace=mindx-dl", "--kube-fault-config=on"} <= set(noded["args"])
    assert "--kube-fault-config-namespace=mindx-dl" in noded["args"]
    assert {"--kube", "--kube-namespace=kube-system", "--kube-fault-config=on"} <= set(deviced["args"])
    assert "--kube-fault-config-namespace=kube-system" in deviced["args"]
    # the fault-table ConfigMaps: list/watch by name only, never every ConfigMap of the namespace
    for ns in ("mindx-dl", "kube-system"):
        role = next(
            o for o in objs
            if o["kind"] == "Role" and o["metadata"]["name"].endswith("-agents") and o["metadata"]["namespace"] == ns
        )  # fmt: skip
        watch = [r for r in role["rules"] if "watch" in r["verbs"]]
        assert watch == [
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "watch"],
             "resourceNames": ["mindx-dl-fault-config", "mindx-dl-node-fault-config"]}
        ]  # fmt: skip


@pytest.mark.parametrize(
    ("scale", "cpu", "memory"), [("1k", "100m", "256Mi"), ("4k", "250m", "512Mi"), ("16k", "500m", "1536Mi")]
)
def test_clusterd_sizing_presets(chart, scale, cpu, memory):
    c = _container(
        render_objects(chart, {"clusterd": {"scale": scale}}), "Deployment", "-clusterd", "clusterd"
    )
    assert c["resources"]["requests"] == {"cpu": cpu, "memory": memory}
    custom = _container(
        render_objects(chart, load_values("custom-scale.yaml")), "Deployment", "-clusterd", "clusterd"
    )
    assert custom["resources"]["requests"] == {"cpu": "3", "memory": "4Gi"}


def test_config_maps_carry_tables_and_pingmesh_config(chart):
    objs = render_objects(chart, load_values("full.yaml"))
    tables = find(objs, "ConfigMap", "-fault-tables")
    assert json.loads(tables["data"]["faultCode.json"])["SeparateNPUCodes"] == ["80E01801"]
    assert json.loads(tables["data"]["publicFaultConfiguration.json"])["publicFaultResource"] == ["CCAE"]
    ping = find(objs, "ConfigMap", "-pingmesh-config")
    assert ping["metadata"]["labels"]["app"] == "pingmesh"
    assert list(ping["data"]) == ["pingmesh-config.yaml"]
    cfg = find(objs, "ConfigMap", "faultmesh-config")
    assert yaml.safe_load(cfg["data"]["noded.yaml"]) == {"log-file": "/tmp/noded.log"}
    assert yaml.safe_load(cfg["data"]["clusterd.yaml"]) == {}
    # Default: an empty fault-table ConfigMap exists so operators can add files with kubectl edit.
    tables = find(render_objects(chart, {}), "ConfigMap", "-fault-tables")
    assert tables["data"] == {}


def test_flag_config_change_rolls_pods_but_table_change_does_not(chart):
    def checksums(values):
        objs = render_objects(chart, values)
        return [
            find(objs, k, s)["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
            for k, s in (("DaemonSet", "-agents"), ("Deployment", "-clusterd"))
        ]

    base = checksums({})
    assert checksums({"faultTables": {"faultCode.json": "{}"}}) == base
    assert checksums({"noded": {"config": {"poll-interval": 10}}}) != base


def test_tls_and_token_mounts(chart):
    objs = render_objects(chart, load_values("full.yaml"))
    c = _container(objs, "Deployment", "-clusterd", "clusterd")
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["FAULTMESH_TLS_CERT"] == "/etc/faultmesh/tls/tls.crt"
    assert "--token-file=/etc/faultmesh/token/token" in c["args"]
    assert "--kube-publicfault-namespace=faultmesh" in c["args"]
    for name in ("noded", "deviced"):
        ac = _container(objs, "DaemonSet", "-agents", name)
        assert {e["name"]: e.get("value") for e in ac["env"]}[
            "FAULTMESH_TLS_CA"
        ] == "/etc/faultmesh/tls/ca.crt"
        assert any(m["name"] == "tls" and m["readOnly"] for m in ac["volumeMounts"])


def test_agents_only_install_points_at_existing_clusterd(chart):
    objs = render_objects(chart, load_values("agents-only.yaml"))
    kinds = {o["kind"] for o in objs}
    assert "Deployment" not in kinds and "ClusterRole" not in kinds
    deviced = _container(objs, "DaemonSet", "-agents", "deviced")
    assert "--backend=sim" in deviced["args"] and not any(a.startswith("--dcmi-lib") for a in deviced["args"])
    pod = find(objs, "DaemonSet", "-agents")["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is False and pod["dnsPolicy"] == "ClusterFirst"


def test_service_monitor_targets_named_ports(chart):
    objs = render_objects(chart, load_values("full.yaml"))
    sm = find(objs, "ServiceMonitor", "")
    ports = {e["port"] for e in sm["spec"]["endpoints"]}
    service_ports = {p["name"] for o in objs if o["kind"] == "Service" for p in o["spec"]["ports"]}
    assert ports <= service_ports
    assert sm["metadata"]["labels"]["release"] == "prometheus"
    rule = find(objs, "PrometheusRule", "")
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}
    assert {
        "FaultmeshNodeUnhealthy",
        "FaultmeshSlowNodeConfirmed",
        "FaultmeshAgentDisconnected",
        "FaultmeshClusterdRejectingRequests",
    } <= set(alerts)
    assert alerts["FaultmeshAgentDisconnected"]["for"] == "10m"
    assert not [o for o in render_objects(chart, {}) if o["kind"] in CRD_KINDS]


@pytest.mark.parametrize(
    ("values", "path", "want"),
    [
        ({"noded": {"pollInterval": "fast"}}, "/noded/pollInterval", "want integer"),
        ({"clusterd": {"replicas": "1"}}, "/clusterd/replicas", "want integer"),
        ({"logFormat": "xml"}, "/logFormat", "value must be one of"),
        ({"agents": {"hostNetwork": "yes"}}, "/agents/hostNetwork", "want boolean"),
        ({"clusterd": {"scale": "huge"}}, "/clusterd/scale", "value must be one of"),
        (
            {"pingmesh": {"config": {"global": {"activate": "on", "task_interval": 0}}}},
            "/pingmesh/config/global/task_interval",
            "minimum",
        ),
        ({"noded": {"pollIntervall": 5}}, "/noded", "pollIntervall"),
    ],
)
def test_bad_value_fails_render_with_readable_message(helm, chart, values, path, want):
    with pytest.raises(helm.HelmError) as err:
        render_text(chart, values)
    msg = str(err.value)
    assert path in msg and want in msg, msg
    assert "schema" in msg


def test_tls_without_secret_name_fails_render(helm, chart):
    with pytest.raises(helm.HelmError, match="tls.secretName is required"):
        render_text(chart, {"tls": {"enabled": True}})


@pytest.mark.parametrize("values_name", ["default", *VALUES_FILES])
def test_rendered_command_lines_parse_with_the_daemons_parsers(chart, values_name, tmp_path, monkeypatch):
    """Every flag the chart sets is one the daemon really has, with a valid value (the variables:
    test_chart_contract.py)."""
    objs = render_objects(chart, load_values(values_name))
    parsed = {c["name"]: parse_container(objs, c, monkeypatch, tmp_path)[1] for _, c in pod_containers(objs)}
    if "noded" in parsed:
        n = parsed["noded"]
        assert n.node_name == "node-1" and n.http_addr == "10.0.0.1:11255"
        assert n.clusterd.endswith(".svc:8899")
    if "deviced" in parsed:
        assert parsed["deviced"].node_name == "node-1" and parsed["deviced"].http_addr == "10.0.0.1:11251"
    if "clusterd" in parsed:
        assert parsed["clusterd"].state_dir == "/var/lib/faultmesh"
    if values_name == "full.yaml":
        assert parsed["noded"].bmc_host == "node-1-bmc.mgmt.example.com"
        assert parsed["noded"].token_file == parsed["deviced"].token_file == "/etc/faultmesh/token/token"
        assert parsed["noded"].tls_ca == parsed["deviced"].tls_ca == "/etc/faultmesh/tls/ca.crt"
        assert parsed["clusterd"].tls_cert == "/etc/faultmesh/tls/tls.crt"
        assert parsed["clusterd"].token_file == "/etc/faultmesh/token/token"
        assert parsed["deviced"].fault_code_file == "/etc/faultmesh/fault-tables/faultCode.json"
        assert (
            parsed["deviced"].dcmi_lib
            == parsed["noded"].pingmesh_dcmi_lib
            == ("/usr/local/Ascend/driver/lib64/driver/libdcmi.so")
        )
        assert (
            parsed["clusterd"].public_fault_config
            == "/etc/faultmesh/fault-tables/publicFaultConfiguration.json"
        )
        assert parsed["noded"].log_level == parsed["clusterd"].log_level == "DEBUG"
        assert parsed["clusterd"].kube and parsed["clusterd"].kube_publicfault_namespace == NAMESPACE
    if values_name == "default":
        assert parsed["noded"].pingmesh_config_file == parsed["clusterd"].slownet_config
        assert parsed["deviced"].dcmi_lib is None  # deviced searches the driver's library folders
        assert parsed["clusterd"].kube is True


def test_pingmesh_config_file_parses_as_the_reference_format(chart):
    from faultmesh.config import load_document
    from fdol.slownet.config import parse_config

    ping = find(render_objects(chart, load_values("full.yaml")), "ConfigMap", "-pingmesh-config")
    cfg = parse_config(load_document(ping["data"]["pingmesh-config.yaml"]))
    assert cfg["global"].activate is True and cfg["global"].task_interval == 5
    assert cfg["1"].activate is False and cfg["1"].task_interval == 60


def test_log_format_reaches_every_daemon(chart):
    """``logFormat: json`` sets FAULTMESH_LOG_FORMAT (the daemons' --log-format) on all three."""
    for fmt in ("text", "json"):
        objs = render_objects(chart, {} if fmt == "text" else {"logFormat": fmt})
        for kind, suffix, name in (
            ("Deployment", "-clusterd", "clusterd"),
            ("DaemonSet", "-agents", "noded"),
            ("DaemonSet", "-agents", "deviced"),
        ):
            env = {e["name"]: e.get("value") for e in _container(objs, kind, suffix, name)["env"]}
            assert env["FAULTMESH_LOG_FORMAT"] == fmt, (name, fmt)


def test_clusterd_replicas_elect_a_leader(chart):
    """replicas > 1 (issue 15 HA): leader election on, state in a ConfigMap (no PVC), Lease and
    state-ConfigMap rights by name in the release namespace only, replicas spread over nodes."""
    objs = render_objects(chart, {"clusterd": {"replicas": 2}})
    dep = find(objs, "Deployment", "-clusterd")
    assert dep["spec"]["replicas"] == 2 and dep["spec"]["strategy"]["type"] == "RollingUpdate"
    c = _container(objs, "Deployment", "-clusterd", "clusterd")
    assert {
        "--kube-leader-elect=on",
        f"--kube-lease-namespace={NAMESPACE}",
        "--kube-lease-s=8",
        "--kube-state-name=faultmesh-clusterd-state",
    } <= set(c["args"])
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"  # a follower is not ready
    pod = dep["spec"]["template"]["spec"]
    assert next(v for v in pod["volumes"] if v["name"] == "state") == {"name": "state", "emptyDir": {}}
    assert not [o for o in objs if o["kind"] == "PersistentVolumeClaim"]
    assert pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    role = next(
        o for o in objs
        if o["kind"] == "Role" and o["metadata"]["namespace"] == NAMESPACE and o["metadata"]["name"].endswith("-clusterd")
    )  # fmt: skip
    named = {
        (r["resources"][0], v, tuple(r.get("resourceNames", ()))) for r in role["rules"] for v in r["verbs"]
    }
    state = "faultmesh-clusterd-state"  # and the history mirror beside it (issue 30)
    HA_CMS = (state, f"{state}-rejected", f"{state}-history", f"{state}-history-rejected")  # noqa: N806
    assert named == {
        ("leases", "create", ()),
        ("leases", "get", ("faultmesh-clusterd",)),
        ("leases", "patch", ("faultmesh-clusterd",)),
        ("configmaps", "create", ()),
        ("configmaps", "get", HA_CMS),
        ("configmaps", "patch", HA_CMS),
    }
    assert not [
        o
        for o in render_objects(chart, {})
        if o["kind"] == "Role" and o["metadata"]["namespace"] == NAMESPACE
    ]
    with pytest.raises(Exception, match="kube.enabled"):
        render_objects(chart, {"clusterd": {"replicas": 2, "kube": {"enabled": False}}})
