"""Secure by default and node identity in the chart (issue 29): a bearer token Secret is generated
when none is given, wired into clusterd (``--token-file``) and every agent
(``--clusterd-token-file``), and kept by ``helm upgrade`` (Helm's own ``lookup`` against an
emulated API server); clusterd has a PodDisruptionBudget; the agents' Role grants only the verbs
their writes use; the agents get ``NODE_IP`` from the Downward API."""

from __future__ import annotations

import asyncio
import base64
import re

import pytest
import yaml
from chart.chartkit import CHART, NAMESPACE, RELEASE, find, load_values, render_objects

TOKEN_PATH = "/etc/faultmesh/token/token"


def _pod(objs: list[dict], kind: str, suffix: str) -> dict:
    return find(objs, kind, suffix)["spec"]["template"]["spec"]


def _token_wiring(objs: list[dict]) -> dict[str, str | None]:
    """container -> the Secret its token file comes from (None: no token flag)."""
    out: dict[str, str | None] = {}
    for kind, suffix, flag in (
        ("Deployment", "-clusterd", "--token-file"),
        ("DaemonSet", "-agents", "--clusterd-token-file"),
    ):
        if not [o for o in objs if o["kind"] == kind]:
            continue
        pod = _pod(objs, kind, suffix)
        volumes = {v["name"]: v for v in pod["volumes"]}
        for c in pod["containers"]:
            if f"{flag}={TOKEN_PATH}" not in c["args"]:
                assert not any(a.startswith(flag) for a in c["args"]), c["name"]
                out[c["name"]] = None
                continue
            mount = next(m for m in c["volumeMounts"] if TOKEN_PATH.startswith(m["mountPath"] + "/"))
            assert mount["readOnly"] is True
            secret = volumes[mount["name"]]["secret"]
            assert secret["items"] == [{"key": "token", "path": "token"}] and secret["defaultMode"] == 0o400
            out[c["name"]] = secret["secretName"]
    return out


def _generated_token(objs: list[dict]) -> str:
    secret = find(objs, "Secret", "-token")
    return base64.b64decode(secret["data"]["token"]).decode()


def test_a_token_is_generated_and_wired_into_every_component(chart):
    objs = render_objects(chart, {})
    token = _generated_token(objs)
    assert re.fullmatch(r"[A-Za-z0-9]{48}", token)
    name = find(objs, "Secret", "-token")["metadata"]["name"]
    assert _token_wiring(objs) == {"clusterd": name, "noded": name, "deviced": name}
    assert _generated_token(render_objects(chart, {})) != token  # a fresh one per install


def test_a_given_token_secret_is_used_and_none_is_generated(chart):
    objs = render_objects(chart, {"clusterd": {"tokenSecret": "my-token"}})
    assert not [o for o in objs if o["kind"] == "Secret" and o["metadata"]["name"].endswith("-token")]
    assert _token_wiring(objs) == {"clusterd": "my-token", "noded": "my-token", "deviced": "my-token"}
    # opting out is explicit, and then no component is told about a token
    objs = render_objects(chart, {"security": {"generateToken": False}})
    assert not [o for o in objs if o["kind"] == "Secret"]
    assert _token_wiring(objs) == {"clusterd": None, "noded": None, "deviced": None}


def test_clusterd_may_read_named_tokens_from_another_key(chart):
    """issue 31: clusterd.tokenKey points clusterd's --token-file at a key of `name:token` lines (the
    operators' named tokens and the agents' one); the agents keep reading the one token of `token`."""
    objs = render_objects(chart, {"clusterd": {"tokenSecret": "my-token", "tokenKey": "tokens"}})
    keys = {}
    for kind, suffix in (("Deployment", "-clusterd"), ("DaemonSet", "-agents")):
        for v in _pod(objs, kind, suffix)["volumes"]:
            if v["name"] == "token":
                keys[suffix] = v["secret"]["items"]
    assert keys == {
        "-clusterd": [{"key": "tokens", "path": "token"}],
        "-agents": [{"key": "token", "path": "token"}],
    }


def test_an_agents_only_release_generates_no_token_of_its_own(chart):
    """A token clusterd does not know would lock the agents out: they take the clusterd's Secret."""
    values = load_values("agents-only.yaml")
    assert _token_wiring(render_objects(chart, values)) == {"noded": None, "deviced": None}
    values["clusterd"]["tokenSecret"] = "fm-faultmesh-token"
    assert _token_wiring(render_objects(chart, values)) == {
        "noded": "fm-faultmesh-token",
        "deviced": "fm-faultmesh-token",
    }


def test_helm_upgrade_keeps_the_generated_token(helm, chart):
    """Helm's ``lookup`` (the Go SDK, cluster-aware render) against kmock's API emulator holding
    the installed release's Secret: the upgrade renders the same token, not a new one."""
    kmock = pytest.importorskip("kmock", reason="kmock not installed (pip install '.[dev]')")
    import aiohttp

    kept = "k" * 48
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": f"{RELEASE}-faultmesh-token", "namespace": NAMESPACE},
        "data": {"token": base64.b64encode(kept.encode()).decode()},
    }

    async def upgrade() -> tuple[str, str]:
        async with kmock.KubernetesEmulator() as emu, kmock.Server(emu) as srv:
            emu.resources["v1/secrets"] = kmock.ResourceInfo(
                kind="Secret", singular="secret", namespaced=True, verbs=["get", "list", "create"]
            )
            url = str(srv.url).rstrip("/")

            def render() -> str:
                cfg = helm.Config(kube_apiserver=url, namespace=NAMESPACE)
                try:
                    out = cfg.render(
                        helm.Chart.load(str(CHART)), {}, name=RELEASE, namespace=NAMESPACE, is_upgrade=True
                    )
                finally:
                    cfg.close()
                return next(v for k, v in out.items() if k.endswith("secret-token.yaml"))

            first = await asyncio.wait_for(asyncio.to_thread(render), 60)  # nothing installed yet
            async with aiohttp.ClientSession() as s:
                r = await s.post(f"{url}/api/v1/namespaces/{NAMESPACE}/secrets", json=secret)
                assert r.status in (200, 201), await r.text()
            return first, await asyncio.wait_for(asyncio.to_thread(render), 60)

    first, again = asyncio.run(upgrade())
    assert base64.b64decode(yaml.safe_load(first)["data"]["token"]).decode() != kept
    assert base64.b64decode(yaml.safe_load(again)["data"]["token"]).decode() == kept


@pytest.mark.parametrize(
    ("values", "want"),
    [
        ({}, 0),  # one replica: a drain waits until clusterd is moved by hand
        ({"clusterd": {"replicas": 3}}, 1),  # one away at a time: a follower is left to lead
        ({"security": {"clusterdPodDisruptionBudget": {"maxUnavailable": "50%"}}}, "50%"),
    ],
)
def test_clusterd_has_a_disruption_budget(chart, values, want):
    objs = render_objects(chart, values)
    pdb = find(objs, "PodDisruptionBudget", "-clusterd")
    assert pdb["spec"]["maxUnavailable"] == want
    pod_labels = find(objs, "Deployment", "-clusterd")["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    agent_labels = find(objs, "DaemonSet", "-agents")["spec"]["template"]["metadata"]["labels"]
    assert not pdb["spec"]["selector"]["matchLabels"].items() <= agent_labels.items()
    off = render_objects(chart, {"security": {"clusterdPodDisruptionBudget": {"enabled": False}}})
    assert not [o for o in off if o["kind"] == "PodDisruptionBudget"]


def test_agents_role_grants_only_the_verbs_their_writes_use(chart):
    objs = render_objects(chart, load_values("full.yaml"))
    for role in (o for o in objs if o["kind"] == "Role" and o["metadata"]["name"].endswith("-agents")):
        unnamed = {v for r in role["rules"] if not r.get("resourceNames") for v in r["verbs"]}
        assert unnamed == {"create", "patch", "delete"}, role["metadata"]["namespace"]  # no get/update/list


def test_agents_get_their_node_ip_from_the_downward_api(chart):
    for values_name in ("default", "minimal.yaml"):
        objs = render_objects(chart, load_values(values_name))
        for c in _pod(objs, "DaemonSet", "-agents")["containers"]:
            env = {e["name"]: e for e in c["env"]}
            assert env["NODE_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.hostIP"}}
            assert "HOST_IP" not in env
            assert not any("HOST_IP" in a for a in c["args"]), c["args"]
    # minimal.yaml still says $(HOST_IP) in noded.bmc.host (the old name): it means the node IP
    noded = next(c for c in _pod(objs, "DaemonSet", "-agents")["containers"] if c["name"] == "noded")
    assert "--bmc-host=$(NODE_IP)" in noded["args"]


def test_notes_name_the_cli_environment_it_reads(chart, monkeypatch):
    """NOTES.txt's CLI set-up (the token; with ``tls.enabled`` the CA and the certificate's name for
    gRPC commands through a port-forward) uses only variables the ``faultmesh`` CLI reads: each one
    set here reaches the parsed flags of a gRPC command."""
    from chart.chartkit import render_text

    from fmtools.cli import build_parser

    values = {"tls": {"enabled": True, "secretName": "fm-tls"}}
    notes = next(t for p, t in render_text(chart, values).items() if p.endswith("NOTES.txt"))
    names = sorted(set(re.findall(r"\bFAULTMESH_[A-Z_]+\b", notes)))
    assert {"FAULTMESH_TOKEN_FILE", "FAULTMESH_GRPC_TLS_CA", "FAULTMESH_GRPC_TLS_SERVER_NAME"} <= set(names)
    assert "secret fm-tls -o jsonpath='{.data.ca\\.crt}'" in notes
    for name in names:
        monkeypatch.setenv(name, f"value-of-{name}")
    args = vars(build_parser().parse_args(["trace", "get", "default/job"]))
    unread = [n for n in names if f"value-of-{n}" not in args.values()]
    assert not unread, f"NOTES.txt names variables the CLI does not read: {unread}"
