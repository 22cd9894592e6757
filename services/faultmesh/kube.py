"""A thin async Kubernetes API layer over kubernetes_asyncio, on raw JSON objects (core: used by
clusterd's Kubernetes mode and by the agents' ConfigMap sinks; issue 8, issue 15).

Every call has a timeout and ends in either a parsed JSON body or :class:`KubeError` (``status`` is
the HTTP status, 0 for a transport error or timeout). Objects stay plain dicts: the component
compares and re-serializes them, model classes would only cost time. :meth:`KubeApi.watch` streams
raw watch events; :class:`faultmesh.kubewatch.ListWatcher` keeps a local view of one resource in
sync over it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from faultmesh.log import event
from faultmesh.retry import Backoff
from faultmesh.runtime import wait_for

log = logging.getLogger("faultmesh.kube")


def _transport_errors() -> tuple[type[BaseException], ...]:
    """What a failed API call raises below the HTTP status (evaluated only when a call raised): aiohttp
    is kubernetes_asyncio's transport, imported with it, so an agent outside kube mode never loads it."""
    import aiohttp

    return (aiohttp.ClientError, OSError, TimeoutError)


class KubeError(Exception):
    """An API call that failed: ``op`` (what was done), ``status`` (HTTP, 0 = no response), ``reason``."""

    def __init__(self, op: str, status: int, reason: str = "") -> None:
        super().__init__(f"{op}: {status} {reason}".strip())
        self.op = op
        self.status = status
        self.reason = reason


class WatchExpired(KubeError):
    """The watch's resourceVersion is too old (410 Gone): re-list."""


def _reason(body: bytes) -> str:
    try:
        doc = orjson.loads(body)
        return str(doc.get("message") or doc.get("reason") or "")[:200]
    except (orjson.JSONDecodeError, AttributeError):
        return body[:200].decode(errors="replace")


def add_kube_arguments(parser: Any, title: str = "Kubernetes") -> Any:
    """``--kube``, ``--kubeconfig``, ``--kube-api``, ``--kube-timeout-s`` on ``parser`` (an argparse
    parser); returns the argument group so a caller can add its own ``--kube-*`` flags."""
    g = parser.add_argument_group(title)
    g.add_argument("--kube", action="store_true", help="publish/consume the reference's ConfigMaps")
    g.add_argument(
        "--kubeconfig", help="kubeconfig file (default: in-cluster service account, then ~/.kube/config)"
    )
    g.add_argument(
        "--kube-api", help="API server URL without auth (tests, kubectl proxy); overrides --kubeconfig"
    )
    g.add_argument("--kube-timeout-s", type=float, default=10.0, help="timeout of one API call (s)")
    return g


async def make_api_client(kube_api: str | None = None, kubeconfig: str | None = None) -> Any:
    """A kubernetes_asyncio ``ApiClient``: ``kube_api`` (a URL, no auth) if given, else ``kubeconfig``,
    else the in-cluster service account, else ``~/.kube/config``. The caller closes it.

    Raises ``OSError`` with a clear message when no configuration can be loaded."""
    from kubernetes_asyncio import client, config

    try:
        if kube_api:
            return client.ApiClient(client.Configuration(host=kube_api.rstrip("/")))
        cfg = client.Configuration()
        if kubeconfig:
            await config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        else:
            try:
                config.load_incluster_config(client_configuration=cfg)
            except config.ConfigException:
                await config.load_kube_config(client_configuration=cfg)
        return client.ApiClient(cfg)
    except (config.ConfigException, OSError, ValueError) as e:
        raise OSError(f"--kube: cannot load the Kubernetes client configuration: {e}") from None


class KubeApi:
    """The calls faultmesh makes (ConfigMaps, Nodes, Pods, Events, Leases, custom objects such as
    Volcano PodGroups). ``api_client`` is a kubernetes_asyncio ``ApiClient``; every call raises
    :class:`KubeError` (``status`` 0 for a transport error or a timeout of ``timeout_s``)."""

    def __init__(self, api_client: Any, timeout_s: float = 10.0) -> None:
        from kubernetes_asyncio import client

        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.coordination = client.CoordinationV1Api(api_client)
        self.timeout_s = timeout_s

    async def _call(self, op: str, fn: Callable[..., Awaitable[Any]], *args: Any, **kw: Any) -> Any:
        try:
            resp = await wait_for(
                fn(*args, _preload_content=False, _request_timeout=self.timeout_s, **kw), self.timeout_s + 1
            )
        except _transport_errors() as e:
            raise KubeError(op, 0, repr(e)) from None
        try:
            body = await wait_for(resp.read(), self.timeout_s)
        except _transport_errors() as e:
            raise KubeError(op, 0, repr(e)) from None
        finally:
            resp.release()
        if not 200 <= resp.status < 300:
            cls = WatchExpired if resp.status == 410 else KubeError
            raise cls(op, resp.status, _reason(body))
        try:
            return orjson.loads(body) if body else {}
        except orjson.JSONDecodeError as e:
            raise KubeError(op, resp.status, f"bad JSON body: {e}") from None

    # -- ConfigMaps ------------------------------------------------------------------------------
    async def list_config_maps(
        self, namespace: str | None, label_selector: str = "", field_selector: str = ""
    ) -> tuple[list[dict], str]:
        """(items, resourceVersion) of the ConfigMaps in ``namespace`` (None = all namespaces);
        ``field_selector`` e.g. ``metadata.name=x`` (a server may ignore it: filter again)."""
        kw = {"label_selector": label_selector} if label_selector else {}
        if field_selector:
            kw["field_selector"] = field_selector
        if namespace:
            doc = await self._call("list configmaps", self.core.list_namespaced_config_map, namespace, **kw)
        else:
            doc = await self._call("list configmaps", self.core.list_config_map_for_all_namespaces, **kw)
        return list(doc.get("items") or []), str((doc.get("metadata") or {}).get("resourceVersion") or "")

    async def get_config_map(self, namespace: str, name: str) -> dict:
        return await self._call("get configmap", self.core.read_namespaced_config_map, name, namespace)

    async def create_config_map(self, namespace: str, body: dict) -> dict:
        return await self._call("create configmap", self.core.create_namespaced_config_map, namespace, body)

    async def patch_config_map(self, namespace: str, name: str, body: dict) -> dict:
        """JSON merge patch (RFC 7386)."""
        return await self._call(
            "patch configmap",
            self.core.patch_namespaced_config_map,
            name,
            namespace,
            body,
            _content_type="application/merge-patch+json",
        )

    async def delete_config_map(self, namespace: str, name: str) -> dict:
        return await self._call("delete configmap", self.core.delete_namespaced_config_map, name, namespace)

    async def upsert_config_map(self, namespace: str, name: str, data: dict, labels: dict) -> None:
        """Update ``name``'s ``data`` keys and ``labels`` (a merge patch: keys not in ``data`` are
        left alone), creating it on 404 (and updating again when a create races with someone
        else's: 409), as the reference agents write theirs (update, then create)."""
        patch = {"metadata": {"labels": dict(labels)}, "data": dict(data)}
        try:
            await self.patch_config_map(namespace, name, patch)
        except KubeError as e:
            if e.status != 404:
                raise
            body = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
                "data": dict(data),
            }
            try:
                await self.create_config_map(namespace, body)
            except KubeError as e2:
                if e2.status != 409:
                    raise
                await self.patch_config_map(namespace, name, patch)

    # -- Events ----------------------------------------------------------------------------------
    async def create_event(self, namespace: str, body: dict) -> dict:
        return await self._call("create event", self.core.create_namespaced_event, namespace, body)

    # -- custom objects (Volcano PodGroups) ------------------------------------------------------
    async def list_custom(self, group: str, version: str, plural: str) -> tuple[list[dict], str]:
        """(items, resourceVersion) of a custom resource in all namespaces."""
        doc = await self._call(
            f"list {plural}", self.custom.list_cluster_custom_object, group, version, plural
        )
        return list(doc.get("items") or []), str((doc.get("metadata") or {}).get("resourceVersion") or "")

    async def patch_custom(
        self, group: str, version: str, namespace: str, plural: str, name: str, body: dict
    ) -> dict:
        """JSON merge patch of a namespaced custom object."""
        return await self._call(
            f"patch {plural}",
            self.custom.patch_namespaced_custom_object,
            group,
            version,
            namespace,
            plural,
            name,
            body,
            _content_type="application/merge-patch+json",
        )

    # -- Nodes -----------------------------------------------------------------------------------
    async def list_nodes(self) -> tuple[list[dict], str]:
        doc = await self._call("list nodes", self.core.list_node)
        return list(doc.get("items") or []), str((doc.get("metadata") or {}).get("resourceVersion") or "")

    async def list_pods(self, namespace: str | None, label_selector: str = "") -> tuple[list[dict], str]:
        """(items, resourceVersion) of the pods in ``namespace`` (None = all namespaces)."""
        kw = {"label_selector": label_selector} if label_selector else {}
        if namespace:
            doc = await self._call("list pods", self.core.list_namespaced_pod, namespace, **kw)
        else:
            doc = await self._call("list pods", self.core.list_pod_for_all_namespaces, **kw)
        return list(doc.get("items") or []), str((doc.get("metadata") or {}).get("resourceVersion") or "")

    async def patch_node(self, name: str, body: dict) -> dict:
        """JSON merge patch of a Node (annotations, labels)."""
        return await self._call(
            "patch node", self.core.patch_node, name, body, _content_type="application/merge-patch+json"
        )

    async def get_node(self, name: str) -> dict:
        return await self._call("get node", self.core.read_node, name)

    async def patch_node_status(self, name: str, body: dict) -> dict:
        """Strategic merge patch of a Node's status (conditions merge by ``type``)."""
        return await self._call(
            "patch node status",
            self.core.patch_node_status,
            name,
            body,
            _content_type="application/strategic-merge-patch+json",
        )

    async def patch_pod(self, namespace: str, name: str, body: dict) -> dict:
        """JSON merge patch of a Pod (labels, annotations)."""
        return await self._call(
            "patch pod",
            self.core.patch_namespaced_pod,
            name,
            namespace,
            body,
            _content_type="application/merge-patch+json",
        )

    # -- watch -----------------------------------------------------------------------------------
    async def watch(
        self,
        kind: str,
        namespace: str | None,
        label_selector: str,
        resource_version: str,
        timeout_s: int,
        field_selector: str = "",
    ):
        """Yield raw watch events ``{"type", "object"}`` until the server ends the stream.

        Raises :class:`WatchExpired` on 410 (status or ERROR event), :class:`KubeError` on other
        errors. The stream ends normally after ``timeout_s`` (server side) or when dropped.
        """
        if kind == "nodes":
            fn, args = self.core.list_node, ()
        elif kind.startswith(CUSTOM):
            fn, args = self.custom.list_cluster_custom_object, tuple(custom_kind(kind))
        elif kind == "pods":
            fn, args = (
                (self.core.list_namespaced_pod, (namespace,))
                if namespace
                else (self.core.list_pod_for_all_namespaces, ())
            )
        elif namespace:
            fn, args = self.core.list_namespaced_config_map, (namespace,)
        else:
            fn, args = self.core.list_config_map_for_all_namespaces, ()
        kw: dict[str, Any] = {"watch": "true", "timeout_seconds": timeout_s, "allow_watch_bookmarks": True}
        if label_selector:
            kw["label_selector"] = label_selector
        if field_selector:
            kw["field_selector"] = field_selector
        if resource_version:
            kw["resource_version"] = resource_version
        op = f"watch {kind}"
        try:
            resp = await wait_for(
                fn(*args, _preload_content=False, _request_timeout=timeout_s + 10, **kw), self.timeout_s + 1
            )
        except _transport_errors() as e:
            raise KubeError(op, 0, repr(e)) from None
        try:
            if not 200 <= resp.status < 300:
                body = await wait_for(resp.read(), self.timeout_s)
                cls = WatchExpired if resp.status == 410 else KubeError
                raise cls(op, resp.status, _reason(body))
            while True:
                try:
                    line = await wait_for(resp.content.readline(), timeout_s + 10)
                except _transport_errors() as e:
                    raise KubeError(op, 0, f"stream dropped: {e!r}") from None
                if not line:
                    return
                line = line.strip()
                if not line:
                    continue
                try:
                    ev = orjson.loads(line)
                except orjson.JSONDecodeError:
                    raise KubeError(op, 0, "bad watch line") from None
                if not isinstance(ev, dict) or "type" not in ev:
                    continue  # e.g. a list body from a server that ignored ?watch
                if ev["type"] == "ERROR":
                    obj = ev.get("object") or {}
                    code = int(obj.get("code") or 0)
                    cls = WatchExpired if code == 410 else KubeError
                    raise cls(op, code, str(obj.get("message") or obj.get("reason") or ""))
                yield ev
        finally:
            resp.release()


async def run_when_due(
    due: asyncio.Event,
    work: Callable[[], Awaitable[None]],
    phrase: str,
    on_error: Callable[[KubeError], None] | None = None,
) -> None:
    """Await ``work()`` each time ``due`` is set, until cancelled. A :class:`KubeError` sets ``due``
    again, calls ``on_error(e)``, is logged as ``phrase`` (WARNING, with ``error`` and ``retry_s``)
    and waited out with a capped :class:`faultmesh.retry.Backoff` (0.2 .. 30 s)."""
    backoff = Backoff(0.2, 30.0)
    while True:
        await due.wait()
        due.clear()
        try:
            await work()
            backoff.reset()
        except KubeError as e:
            if on_error is not None:
                on_error(e)
            due.set()
            delay = backoff.next_delay()
            event(log, logging.WARNING, phrase, error=str(e), retry_s=round(delay, 2))
            await asyncio.sleep(delay)


CUSTOM = "custom:"


def custom_kind(kind: str) -> list[str]:
    """``custom:<group>/<version>/<plural>`` (a :class:`~faultmesh.kubewatch.ListWatcher` kind) -> [group, version, plural].
    Raises ``ValueError`` for another shape."""
    parts = kind[len(CUSTOM) :].split("/")
    if not kind.startswith(CUSTOM) or len(parts) != 3 or not all(parts):
        raise ValueError(f"not a custom kind: {kind!r}")
    return parts
