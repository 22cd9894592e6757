"""One ConfigMap kept equal to a desired document, the way the reference agents keep theirs (issue 15).

:class:`ConfigMapPublisher` owns one ConfigMap (namespace, name, labels). The owner ``offer()``\\ s
the desired ``data`` (a ``{key: str}`` map) or None (delete it) as often as it likes; one task
writes:

- a write happens when the document changed by ``same()`` (default: equal ``data``) or when
  ``refresh_s`` passed since the last successful write (the reference agents rewrite an unchanged
  document: noded every 30 min, the device plugin every 5 min); at most one write per
  ``min_interval_s``;
- write = update (PUT), on 404 create (:meth:`faultmesh.kube.KubeApi.upsert_config_map`); delete
  ignores 404;
- a failed write is retried with :class:`faultmesh.retry.Backoff` (``retry_s`` .. ``retry_max_s``)
  until it succeeds or a newer document replaces it; each failure is logged once per outage and
  counted in ``faultmesh_kube_writes_total{kind="configmap",result}`` (the label set of clusterd's
  series of that name; an agent writes one ConfigMap, named in its log lines).

Used by noded's node-info sink and deviced's device-info sink; nothing here knows the documents.

:class:`ConfigMapFollower` is the reading side: it follows one named ConfigMap (list + watch with
``metadata.name=<name>``, re-listed after 410 / errors) and hands each new ``data`` -- or None when
the ConfigMap is gone -- to its owner on the loop: deviced's and noded's fault-table overrides
(``mindx-dl-fault-config``, ``mindx-dl-node-fault-config``). :func:`config_map_values` splits a
ConfigMap's ``data`` into usable string values and rejected keys (wrong type, too large).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from faultmesh.kube import KubeApi, KubeError, make_api_client
from faultmesh.kubewatch import ListWatcher
from faultmesh.log import event
from faultmesh.retry import Backoff
from faultmesh.runtime import wait_for

log = logging.getLogger("faultmesh.kube")

Data = dict[str, str]


class ConfigMapPublisher:
    """See the module docstring. ``same(old, new)`` says two documents need no rewrite (it may
    ignore timestamps). ``clock`` is monotonic seconds (injectable)."""

    def __init__(
        self,
        api: KubeApi,
        namespace: str,
        name: str,
        labels: dict[str, str],
        registry: CollectorRegistry | None = None,
        min_interval_s: float = 1.0,
        refresh_s: float = 1800.0,
        retry_s: float = 1.0,
        retry_max_s: float = 30.0,
        same: Callable[[Data, Data], bool] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.name = name
        self.labels = dict(labels)
        self.min_interval_s = min_interval_s
        self.refresh_s = refresh_s
        self.backoff = Backoff(retry_s, retry_max_s, jitter_s=0.0)
        self.same = same or (lambda old, new: old == new)
        self.clock = clock
        self.writes = Counter(
            "faultmesh_kube_writes",
            "ConfigMap writes of this agent, by result (ok, error); kind is always configmap",
            ["kind", "result"],
            registry=registry,
        )
        self._desired: Data | None = None
        self._offered = False
        self._written: Data | None = None  # what the server holds (None: absent / unknown)
        self._written_known = False
        self._last_write = -1e18
        self._failing = False
        self._wake = asyncio.Event()
        self.synced = asyncio.Event()  # set after each round that left the server equal to the desire

    def offer(self, data: Data | None) -> None:
        """The desired document (None: the ConfigMap should not exist). Never waits."""
        self._desired = None if data is None else dict(data)
        self._offered = True
        self._wake.set()

    def _due(self, now: float) -> bool:
        if not self._offered:
            return False
        want = self._desired
        if not self._written_known:
            return True
        if want is None:
            return self._written is not None
        if self._written is None or not self.same(self._written, want):
            return True
        return now - self._last_write >= self.refresh_s

    async def write_once(self) -> bool:
        """Write the desired document now if due. Returns True when something was written.
        Raises :class:`KubeError`."""
        if not self._due(self.clock()):
            return False
        want = self._desired
        try:
            if want is None:
                try:
                    await self.api.delete_config_map(self.namespace, self.name)
                except KubeError as e:
                    if e.status != 404:
                        raise
            else:
                await self.api.upsert_config_map(self.namespace, self.name, want, self.labels)
        except KubeError:
            self.writes.labels("configmap", "error").inc()
            raise
        self.writes.labels("configmap", "ok").inc()
        self._written, self._written_known = want, True
        self._last_write = self.clock()
        return True

    async def run(self) -> None:
        """Write whenever due (see the module docstring) until cancelled; nothing raises out."""
        while True:
            now = self.clock()
            wait = self.refresh_s - (now - self._last_write) if self._written_known else self.refresh_s
            try:
                await wait_for(self._wake.wait(), max(0.05, wait))
            except TimeoutError:
                pass
            self._wake.clear()
            gap = self.min_interval_s - (self.clock() - self._last_write)
            if gap > 0:
                await asyncio.sleep(gap)
            try:
                await self.write_once()
            except KubeError as e:
                delay = self.backoff.next_delay()
                if not self._failing:
                    event(
                        log,
                        logging.WARNING,
                        "configmap write failed, retrying",
                        configmap=f"{self.namespace}/{self.name}",
                        status=e.status,
                        error=e.reason,
                        retry_s=round(delay, 2),
                    )
                self._failing = True
                self._wake.set()
                await asyncio.sleep(delay)
                continue
            if self._failing:
                event(
                    log, logging.INFO, "configmap write recovered", configmap=f"{self.namespace}/{self.name}"
                )
            self._failing = False
            self.backoff.reset()
            if self._offered and not self._due(self.clock()):
                self.synced.set()


class AgentConfigMapSink:
    """An agent's one ConfigMap in Kubernetes mode: the API client (from ``--kube-api`` /
    ``--kubeconfig`` / in-cluster, :func:`faultmesh.kube.make_api_client`), a
    :class:`ConfigMapPublisher` and its task. ``offer()`` works before :meth:`start` (the last
    document is written once started).

    Subclasses set the ConfigMap and its write policy as class attributes: ``name_prefix`` (the
    name is ``name_prefix + node``), ``labels``, ``min_interval_s``, ``refresh_s``, and override
    :meth:`same`. ``args``: the parsed flags of :func:`faultmesh.kube.add_kube_arguments` plus
    ``--kube-namespace``.
    """

    name_prefix = ""
    labels: dict[str, str] = {}
    min_interval_s = 1.0
    refresh_s = 1800.0

    def __init__(self, args, node: str, registry: CollectorRegistry | None = None) -> None:
        self.args = args
        self.namespace = args.kube_namespace
        self.name = self.name_prefix + node
        self.registry = registry
        self.publisher: ConfigMapPublisher | None = None
        self._client = None
        self._task: asyncio.Task | None = None
        self._pending: tuple[Data | None] | None = None

    @staticmethod
    def same(old: Data, new: Data) -> bool:
        """True when ``new`` needs no write after ``old`` (before the refresh is due)."""
        return old == new

    def offer(self, data: Data | None) -> None:
        """The desired ConfigMap data (None: delete the ConfigMap). Never waits."""
        if self.publisher is None:
            self._pending = (data,)
        else:
            self.publisher.offer(data)

    async def start(self) -> None:
        """Connect and start writing. Raises ``OSError`` when no Kubernetes configuration loads."""
        self._client = await make_api_client(self.args.kube_api, self.args.kubeconfig)
        api = KubeApi(self._client, timeout_s=self.args.kube_timeout_s)
        self.publisher = ConfigMapPublisher(
            api, self.namespace, self.name, self.labels, self.registry,
            min_interval_s=self.min_interval_s, refresh_s=self.refresh_s, same=self.same,
        )  # fmt: skip
        if self._pending is not None:
            self.publisher.offer(self._pending[0])
            self._pending = None
        self._task = asyncio.get_running_loop().create_task(
            self.publisher.run(), name=f"kube-configmap-{self.name}"
        )
        event(log, logging.INFO, "kube configmap sink started", configmap=f"{self.namespace}/{self.name}")

    async def stop(self, drain_s: float = 2.0) -> None:
        """Stop the task, then one last bounded write of what is due, then close the client."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait([self._task], timeout=drain_s)
            self._task = None
        if self.publisher is not None:
            try:
                async with asyncio.timeout(max(0.1, drain_s)):
                    await self.publisher.write_once()
            except (KubeError, TimeoutError) as e:
                event(log, logging.WARNING, "configmap final write failed", configmap=self.name, error=str(e))
        if self._client is not None:
            await self._client.close()
            self._client = None


MAX_VALUE_BYTES = 1024 * 1024  # the API server's limit for a whole ConfigMap


def config_map_values(
    obj: dict | None, max_bytes: int = MAX_VALUE_BYTES
) -> tuple[Data, list[tuple[str, str]]]:
    """(values, rejected) of a raw ConfigMap: ``values`` the ``data`` entries that are strings of at
    most ``max_bytes`` UTF-8 bytes, ``rejected`` ``(key, why)`` for every other entry (and for a
    ``data`` that is not an object: ``("data", why)``). Never raises."""
    data = (obj or {}).get("data")
    if data is None:
        return {}, []
    if not isinstance(data, dict):
        return {}, [("data", f"data is {type(data).__name__}, not an object")]
    ok: Data = {}
    bad: list[tuple[str, str]] = []
    for k, v in data.items():
        if not isinstance(v, str):
            bad.append((str(k)[:80], f"value is {type(v).__name__}, not a string"))
        elif len(v.encode("utf-8", "replace")) > max_bytes:
            bad.append((str(k)[:80], f"value of {len(v)} characters, larger than {max_bytes} bytes"))
        else:
            ok[str(k)] = v
    return ok, bad


class ConfigMapFollower:
    """Follows ConfigMap ``namespace/name`` and calls ``on_data(obj)`` on the loop with the raw
    object after each change (None: deleted; nothing is called while it stays absent). ``on_data`` must not
    raise (an exception is logged and the watch goes on). ``args``: the flags of
    :func:`faultmesh.kube.add_kube_arguments` (the client comes from ``--kube-api`` /
    ``--kubeconfig`` / in-cluster). ``synced`` is set after the first list (:meth:`start` first).

    The reference device plugin polls its fault-config ConfigMap every ``PollInterval`` s and NodeD
    uses an informer; both are a watch here (a change applies at once)."""

    def __init__(
        self,
        args,
        namespace: str,
        name: str,
        on_data: Callable[[dict | None], None],
        watch_timeout_s: int = 300,
    ) -> None:
        self.args = args
        self.namespace = namespace
        self.name = name
        self.on_data = on_data
        self.watch_timeout_s = watch_timeout_s
        self.watcher: ListWatcher | None = None
        self._client = None
        self._task: asyncio.Task | None = None

    @property
    def synced(self) -> asyncio.Event:
        assert self.watcher is not None, "start() first"
        return self.watcher.synced

    async def _handle(self, op: str, obj: dict) -> None:
        try:
            self.on_data(obj if op == "upsert" else None)
        except Exception as e:  # a consumer bug must not end the watch
            event(log, logging.ERROR, "configmap consumer failed", configmap=self._where(), error=repr(e))

    def _where(self) -> str:
        return f"{self.namespace}/{self.name}"

    async def start(self) -> None:
        """Connect and start following. Raises ``OSError`` when no Kubernetes configuration loads."""
        self._client = await make_api_client(self.args.kube_api, self.args.kubeconfig)
        api = KubeApi(self._client, timeout_s=self.args.kube_timeout_s)
        self.watcher = ListWatcher(
            api, "configmaps", self.namespace, "", self._handle,
            accept=lambda o: (o.get("metadata") or {}).get("name") == self.name,
            watch_timeout_s=self.watch_timeout_s, field_selector=f"metadata.name={self.name}",
        )  # fmt: skip
        self._task = asyncio.get_running_loop().create_task(
            self.watcher.run(), name=f"kube-follow-{self.name}"
        )
        event(log, logging.INFO, "kube configmap watch started", configmap=self._where())

    async def stop(self, timeout_s: float = 2.0) -> None:
        """Stop following and close the client."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait([self._task], timeout=timeout_s)
            self._task = None
        if self._client is not None:
            await self._client.close()
            self._client = None


def add_fault_config_arguments(parser, title: str, name: str, namespace: str) -> None:
    """``--kube-fault-config on|off`` (default on) and ``--kube-fault-config-namespace``
    (default ``namespace``) on ``parser``: an agent following the reference's fault-table
    ConfigMap ``name`` with ``--kube``."""
    g = parser.add_argument_group(title)
    g.add_argument(
        "--kube-fault-config",
        choices=("on", "off"),
        default="on",
        help=f"with --kube: follow the {name} ConfigMap (table overrides, applied live)",
    )
    g.add_argument("--kube-fault-config-namespace", default=namespace, help=f"namespace of {name}")


def fault_config_follower(
    args, name: str, make_consumer: Callable[[str], Any]
) -> tuple[ConfigMapFollower | None, Any]:
    """(follower, consumer) of the flags of :func:`add_fault_config_arguments`: ``make_consumer(where)``
    (``where`` = ``"configmap <ns>/<name>"``) gives an object whose ``on_configmap(obj)`` the
    follower feeds; (None, None) without ``--kube`` or with ``--kube-fault-config off``."""
    if not args.kube or args.kube_fault_config != "on":
        return None, None
    ns = args.kube_fault_config_namespace
    consumer = make_consumer(f"configmap {ns}/{name}")
    return ConfigMapFollower(args, ns, name, consumer.on_configmap), consumer
