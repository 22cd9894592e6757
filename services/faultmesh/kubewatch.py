"""A local view of one Kubernetes resource kept in sync (core: clusterd's Kubernetes mode, the agents'
ConfigMap sinks; issue 8, issue 15): :class:`ListWatcher` lists, then watches from the list's
resourceVersion over :meth:`faultmesh.kube.KubeApi.watch`; a watch that expires (410 Gone, as an
HTTP status or an ERROR event) or cannot resume is re-listed and the difference is delivered as
upserts and deletes, so no change is lost.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from faultmesh.kube import CUSTOM, KubeError, WatchExpired, custom_kind
from faultmesh.log import event
from faultmesh.retry import Backoff

if TYPE_CHECKING:
    from faultmesh.kube import KubeApi

log = logging.getLogger("faultmesh.kube")


def obj_key(obj: dict) -> tuple[str, str]:
    """(namespace, name) of a raw object."""
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


Handler = Callable[[str, dict], Awaitable[None]]


class ListWatcher:
    """Keeps ``self.objects`` ((namespace, name) -> object) equal to the server, calling
    ``handler("upsert"|"delete", obj)`` for every change, in order, on the loop.

    ``accept(obj)`` filters client-side too (name prefix, labels), so a server that ignores the label
    selector still gives the right view. ``on_restart(why)`` is called each time the watch is
    restarted: ``expired`` (410, re-listed), ``error`` (re-listed after a backoff) or ``ended`` (the
    stream closed or timed out: resumed from the last resourceVersion). ``field_selector``
    (ConfigMaps only, e.g. ``metadata.name=x``) narrows the list and the watch on the server.
    """

    def __init__(
        self,
        api: KubeApi,
        kind: str,
        namespace: str | None,
        label_selector: str,
        handler: Handler,
        accept: Callable[[dict], bool] = lambda obj: True,
        watch_timeout_s: int = 300,
        backoff: Backoff | None = None,
        on_error: Callable[[KubeError], None] | None = None,
        on_restart: Callable[[str], None] | None = None,
        field_selector: str = "",
    ) -> None:
        self.api = api
        self.field_selector = field_selector
        self.kind = kind
        self.namespace = namespace
        self.label_selector = label_selector
        self.handler = handler
        self.accept = accept
        self.watch_timeout_s = watch_timeout_s
        self.backoff = backoff or Backoff(0.2, 30.0)
        self.on_error = on_error or (lambda e: None)
        self.on_restart = on_restart or (lambda why: None)
        self.objects: dict[tuple[str, str], dict] = {}
        self.synced = asyncio.Event()

    async def _list(self) -> str:
        if self.kind == "nodes":
            items, rv = await self.api.list_nodes()
        elif self.kind.startswith(CUSTOM):
            items, rv = await self.api.list_custom(*custom_kind(self.kind))
        elif self.kind == "pods":
            items, rv = await self.api.list_pods(self.namespace, self.label_selector)
        else:
            items, rv = await self.api.list_config_maps(
                self.namespace, self.label_selector, self.field_selector
            )
        fresh = {obj_key(o): o for o in items if self.accept(o)}
        for key in [k for k in self.objects if k not in fresh]:
            old = self.objects.pop(key)
            await self.handler("delete", old)
        for key, obj in sorted(fresh.items()):
            if self.objects.get(key) != obj:
                self.objects[key] = obj
                await self.handler("upsert", obj)
        self.synced.set()
        return rv

    async def _apply(self, ev: dict) -> str | None:
        obj = ev.get("object") or {}
        rv = str((obj.get("metadata") or {}).get("resourceVersion") or "") or None
        if ev["type"] == "BOOKMARK":
            return rv
        key = obj_key(obj)
        if ev["type"] == "DELETED" or not self.accept(obj):
            old = self.objects.pop(key, None)
            if old is not None:
                await self.handler("delete", old)
        elif self.objects.get(key) != obj:
            self.objects[key] = obj
            await self.handler("upsert", obj)
        return rv

    async def run(self) -> None:
        """List and watch forever (cancel to stop). API errors back off; nothing raises out."""
        rv = ""
        need_list = True
        while True:
            try:
                if need_list:
                    rv = await self._list()
                    need_list = False
                started = time.monotonic()
                async for ev in self.api.watch(
                    self.kind, self.namespace, self.label_selector, rv, self.watch_timeout_s,
                    self.field_selector,
                ):  # fmt: skip
                    new_rv = await self._apply(ev)
                    if new_rv:
                        rv = new_rv
                    self.backoff.reset()
                self.on_restart("ended")
                if not rv:
                    need_list = True  # nothing to resume from
                if time.monotonic() - started < 1.0:
                    await asyncio.sleep(
                        self.backoff.next_delay()
                    )  # a server that closes at once: no hot loop
            except WatchExpired as e:
                event(
                    log,
                    logging.INFO,
                    "watch expired, relisting",
                    kind=self.kind,
                    namespace=self.namespace or "*",
                    error=e.reason,
                )
                self.on_restart("expired")
                need_list = True
            except KubeError as e:
                self.on_error(e)
                delay = self.backoff.next_delay()
                event(
                    log,
                    logging.WARNING,
                    "kube watch failed, retrying",
                    kind=self.kind,
                    namespace=self.namespace or "*",
                    status=e.status,
                    error=e.reason,
                    retry_s=round(delay, 2),
                )
                need_list = True  # a failed list or a broken stream: re-list so no change is lost
                self.on_restart("error")
                await asyncio.sleep(delay)
