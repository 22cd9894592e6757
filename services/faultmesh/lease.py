"""Leader election on a ``coordination.k8s.io/v1`` Lease, as client-go's leaderelection does (issue 15 HA).

:class:`LeaseElector` tries every ``retry_s`` to acquire or renew the Lease ``namespace/name`` for
``identity``:

- absent: create it (a 409 means someone else was faster);
- held by us: renew ``renewTime``;
- held by another: it is considered expired when its record (holder, renewTime) has not changed for
  ``lease_s`` of *our* monotonic clock (no trust in the other host's wall clock, as client-go);
  then we take it over (``leaseTransitions`` + 1).

Every write carries the ``resourceVersion`` read just before, so the API server refuses (409) a
write that raced with another candidate's. A leader that cannot renew for ``lease_s`` (minus one
retry, the renew deadline) steps down. :meth:`release` (on a graceful stop) empties the holder so
a follower takes over at its next retry instead of after the lease time.

``on_error(KubeError)`` is called for every failed attempt (retried at the next period; the
caller counts them). ``leading`` is set while we lead; ``on_change(leading: bool)`` and every
callable in ``listeners`` are called on every transition. ``holder`` is the identity that held the
Lease at the last read ("" when none or unknown): what a follower names as the leader when it
refuses a client.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Callable

from faultmesh.kube import KubeApi, KubeError
from faultmesh.log import event

log = logging.getLogger("faultmesh.lease")


def _micro_now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseElector:
    """See the module docstring. Raises nothing out of :meth:`run` (API errors are retried)."""

    def __init__(
        self,
        api: KubeApi,
        namespace: str,
        name: str,
        identity: str,
        lease_s: float = 15.0,
        retry_s: float = 2.0,
        on_change: Callable[[bool], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_error: Callable[[KubeError], None] | None = None,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_s = lease_s
        self.retry_s = retry_s
        self.on_change = on_change or (lambda leading: None)
        self.clock = clock
        self.on_error = on_error or (lambda e: None)
        self.leading = asyncio.Event()
        self._observed: tuple[str, str] | None = None  # (holder, renewTime) last seen
        self._observed_at = 0.0
        self._renewed_at = 0.0
        self.listeners: list[Callable[[bool], None]] = []
        self.holder = ""

    # -- API ---------------------------------------------------------------------------------------
    async def _get(self) -> dict | None:
        try:
            return await self.api._call(
                "get lease", self.api.coordination.read_namespaced_lease, self.name, self.namespace
            )
        except KubeError as e:
            if e.status == 404:
                return None
            raise

    def _spec(self, transitions: int, acquire: str | None) -> dict:
        now = _micro_now()
        spec = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, int(self.lease_s)),
            "renewTime": now,
            "leaseTransitions": transitions,
        }
        spec["acquireTime"] = acquire or now
        return spec

    async def try_acquire_or_renew(self) -> bool:
        """One attempt. True when we hold the Lease afterwards. Raises :class:`KubeError`."""
        api = self.api
        lease = await self._get()
        now = self.clock()
        if lease is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": self._spec(0, None),
            }
            try:
                await api._call(
                    "create lease", api.coordination.create_namespaced_lease, self.namespace, body
                )
            except KubeError as e:
                if e.status == 409:
                    return False
                raise
            self.holder = self.identity
            return True
        spec = lease.get("spec") or {}
        holder = self.holder = str(spec.get("holderIdentity") or "")
        record = (holder, str(spec.get("renewTime") or ""))
        if record != self._observed:
            self._observed, self._observed_at = record, now
        if holder and holder != self.identity and now - self._observed_at < self.lease_s:
            return False  # held, not expired
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if holder == self.identity else 1)
        acquire = spec.get("acquireTime") if holder == self.identity else None
        patch = {
            "metadata": {"resourceVersion": (lease.get("metadata") or {}).get("resourceVersion")},
            "spec": self._spec(transitions, acquire),
        }
        try:
            await api._call(
                "update lease",
                api.coordination.patch_namespaced_lease,
                self.name,
                self.namespace,
                patch,
                _content_type="application/merge-patch+json",
            )
        except KubeError as e:
            if e.status == 409:
                return False  # someone else wrote first
            raise
        self.holder = self.identity
        return True

    def _set(self, leading: bool) -> None:
        if leading == self.leading.is_set():
            return
        if leading:
            self.leading.set()
        else:
            self.leading.clear()
        event(
            log,
            logging.WARNING if not leading else logging.INFO,
            "leader elected" if leading else "leadership lost",
            lease=f"{self.namespace}/{self.name}",
            identity=self.identity,
        )
        self.on_change(leading)
        for fn in list(self.listeners):
            fn(leading)

    async def run(self) -> None:
        """Acquire, renew and watch the Lease until cancelled."""
        while True:
            try:
                ok = await self.try_acquire_or_renew()
                if ok:
                    self._renewed_at = self.clock()
                self._set(ok)
            except KubeError as e:
                deadline = self.lease_s - self.retry_s
                if self.leading.is_set() and self.clock() - self._renewed_at >= deadline:
                    self._set(False)  # could not renew within the renew deadline: step down
                self.on_error(e)
                event(log, logging.WARNING, "lease renewal failed", lease=self.name, error=str(e))
            await asyncio.sleep(self.retry_s)

    async def release(self) -> None:
        """Give the Lease up (graceful stop): holder emptied, so a follower takes over at once."""
        if not self.leading.is_set():
            return
        self._set(False)
        try:
            lease = await self._get()
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            patch = {
                "metadata": {"resourceVersion": lease["metadata"].get("resourceVersion")},
                "spec": {"holderIdentity": "", "renewTime": _micro_now()},
            }
            await self.api._call(
                "release lease",
                self.api.coordination.patch_namespaced_lease,
                self.name,
                self.namespace,
                patch,
                _content_type="application/merge-patch+json",
            )
        except KubeError as e:
            event(log, logging.WARNING, "lease release failed", lease=self.name, error=str(e))
