"""Bounded, expiring registrations of the subscription services (job.Job, fault.Fault, config.Config).

Issue 19 #8: in the reference a registration lives until restart, so a flood of Registers locks every
legitimate client out (job.Job's 100000-client cap) or costs memory and CPU per later change
(fault.Fault). Here, on top of the reference's caps:

- with ``--token-file`` the Register and Subscribe RPCs need the token (:data:`clusterd.auth.PROTECTED`),
  so a token-less caller can neither register nor end an authenticated subscriber's stream;
- each caller (the peer's host) holds at most :data:`MAX_PER_CALLER` registrations of one service;
- a registration without an open stream expires :data:`IDLE_TTL_S` after it was made or after its
  stream ended (a client that reconnects within that time keeps it).

A refusal is counted (``faultmesh_rejected_requests_total{service="brain",reason}``) by the servicer.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable

MAX_PER_CALLER = 1024
IDLE_TTL_S = 60.0


def caller_of(context) -> str:
    """The caller's identity: the host of ``context.peer()`` (``ipv4:10.0.0.1:5000`` -> ``10.0.0.1``,
    ``ipv6:[::1]:5000`` -> ``::1``); the whole peer string when it has no port."""
    peer = context.peer() or ""
    kind, _, addr = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        host = addr.rpartition(":")[0] or addr
        return host.strip("[]")
    return peer


class Registrations:
    """Who registered which key, and which keys have no open stream (oldest first).

    ``max_per_caller``: cap per caller; ``ttl_s``: life of a key without a stream; ``on_expire(key)``
    drops the servicer's own state of an expired key; ``clock``: monotonic seconds.
    """

    def __init__(
        self,
        on_expire: Callable[[Hashable], None],
        max_per_caller: int | None = None,
        ttl_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._on_expire = on_expire
        self.max_per_caller = MAX_PER_CALLER if max_per_caller is None else max_per_caller
        self.ttl_s = IDLE_TTL_S if ttl_s is None else ttl_s
        self.clock = clock
        self._caller: dict[Hashable, str] = {}
        self._per_caller: dict[str, int] = {}
        self._idle: OrderedDict[Hashable, float] = OrderedDict()  # key -> expiry, oldest first
        self._open: dict[Hashable, int] = {}  # key -> open streams

    def __len__(self) -> int:
        return len(self._caller)

    def __contains__(self, key: object) -> bool:
        return key in self._caller

    def count(self, caller: str) -> int:
        """How many keys ``caller`` holds."""
        return self._per_caller.get(caller, 0)

    def prune(self) -> int:
        """Expire the keys idle past their time (``on_expire`` each). Returns how many."""
        now = self.clock()
        n = 0
        while self._idle:
            key, deadline = next(iter(self._idle.items()))
            if deadline > now:
                break
            self.remove(key)
            self._on_expire(key)
            n += 1
        return n

    def full(self, key: Hashable, caller: str) -> bool:
        """True when ``caller`` may not add ``key`` (at its cap; re-registering its own key is fine)."""
        if self._caller.get(key) == caller:
            return False
        return self.count(caller) >= self.max_per_caller

    def add(self, key: Hashable, caller: str) -> None:
        """``caller`` registered ``key`` (replacing whoever had it); idle until a stream opens."""
        self.remove(key)
        self._caller[key] = caller
        self._per_caller[caller] = self._per_caller.get(caller, 0) + 1
        self._idle[key] = self.clock() + self.ttl_s

    def opened(self, key: Hashable) -> None:
        """A stream of ``key`` opened: it does not expire while one is open."""
        if key in self._caller:
            self._open[key] = self._open.get(key, 0) + 1
            self._idle.pop(key, None)

    def closed(self, key: Hashable) -> None:
        """A stream of ``key`` ended: with none left open, its idle time starts."""
        n = self._open.get(key, 0) - 1
        if n > 0:
            self._open[key] = n
            return
        self._open.pop(key, None)
        if key in self._caller:
            self._idle[key] = self.clock() + self.ttl_s
            self._idle.move_to_end(key)

    def remove(self, key: Hashable) -> None:
        """Forget ``key`` (its registration was replaced or dropped)."""
        caller = self._caller.pop(key, None)
        if caller is None:
            return
        left = self._per_caller[caller] - 1
        if left:
            self._per_caller[caller] = left
        else:
            del self._per_caller[caller]
        self._idle.pop(key, None)
        self._open.pop(key, None)
