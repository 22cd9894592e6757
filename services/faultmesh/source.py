"""Fault sources: the one extension model of the agents (noded, deviced) — issue 12, anchors §7.

A source detects one kind of fault and writes what it sees into the agent state through its
:class:`SourceContext`; it never sees the agent stream, other sources or the app object.

- :class:`Source` is the protocol: ``name``, ``supported()``, ``async start(ctx)``, ``async stop()``.
- :class:`SourceContext` is everything a source may use: its scoped state (``set_faults`` replaces
  all this source said before; conditions), ``spawn`` (owned tasks, cancelled on stop),
  ``run_blocking`` (the bounded pool, with a timeout), ``from_thread`` (C callbacks onto the loop),
  HTTP ``routes``, control-message handlers (``on_control``), its typed ``config`` section and a
  metrics registry.
- :class:`PolledSource` is the base of every polled source (BMC, DPC/DTFS storage, ...): a jittered
  schedule, ``asyncio.timeout`` per poll, backoff (faultmesh.retry) after a failure, "source down"
  logged once on the first failure and "source up" once on recovery, and the gauge
  ``faultmesh_source_up{source}``. ``poll()`` returns the FULL current set of faults; a fault absent
  from it has recovered. Until its first successful poll a source is *pending* in the agent state
  (``ctx.mark_pending`` / ``ctx.mark_ready``): ClusterD keeps what it had for it (issue 20).
- :class:`PushSource` is the base of sources fed by callbacks (DCMI fault events, pingmesh results).
- :func:`start_sources` / :func:`stop_sources` run a service's source tuple.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple, Protocol, runtime_checkable

from prometheus_client import CollectorRegistry, Counter, Gauge

from faultmesh.log import event
from faultmesh.model import Fault
from faultmesh.retry import Backoff
from faultmesh.runtime import BlockingPool, TaskOwner

log = logging.getLogger("faultmesh.source")

ControlHandler = Callable[[Any], Awaitable[None]]

__all__ = [
    "PolledSource",
    "PushSource",
    "Source",
    "SourceContext",
    "SourceMetrics",
    "Support",
    "start_sources",
    "stop_sources",
]


class Support(NamedTuple):
    """Whether a source can run here: ``ok``, and ``reason`` when not ("libdcmi not found")."""

    ok: bool
    reason: str = ""


class SourceMetrics:
    """Per-source metrics on one registry: ``faultmesh_source_up{source}`` (1 when the last poll
    worked), ``faultmesh_source_polls_total{source,result}``, ``faultmesh_source_poll_seconds{source}``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.up = Gauge(
            "faultmesh_source_up", "1 when the source's last poll worked", ["source"], registry=registry
        )
        self.polls = Counter(
            "faultmesh_source_polls",
            "polls by result (ok, error, timeout)",
            ["source", "result"],
            registry=registry,
        )
        self.poll_seconds = Gauge(
            "faultmesh_source_poll_seconds", "duration of the last poll (s)", ["source"], registry=registry
        )


class _State(Protocol):
    """What a SourceContext needs of the agent state (faultmesh.agent.AgentState)."""

    def replace_source(self, source: str, faults: Iterable[Fault]) -> bool: ...
    def expect_sources(self, sources: Iterable[str]) -> None: ...
    def source_ready(self, sources: Iterable[str]) -> bool: ...
    def set_condition(self, type_: str, active: bool, reason: str = "", message: str = "") -> bool: ...


@dataclass
class SourceContext:
    """What one source may use (issue 12). Built by the service's wiring, one per source.

    ``name`` (the source name, its metrics label and config key), ``node`` (this node's name),
    ``node_ip`` (this node's IP from ``--node-ip`` / env ``NODE_IP`` / ``XDL_IP``; "" when unknown),
    ``state`` (the agent state; use :meth:`set_faults` / :meth:`set_condition`), ``tasks`` (owned
    tasks of this source, cancelled by :meth:`close`), ``pool`` (bounded blocking pool), ``config``
    (the source's own section: any object, typically an argparse Namespace or a dataclass),
    ``registry`` and ``metrics`` (Prometheus), ``routes`` (HTTP (method, path, handler) added before
    the server starts), ``controls`` (ControlMessage body kind -> handler).
    """

    name: str
    node: str
    state: _State
    pool: BlockingPool
    config: Any = None
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    metrics: SourceMetrics | None = None
    node_ip: str = ""
    routes: list[tuple[str, str, Callable]] = field(default_factory=list)
    controls: dict[str, ControlHandler] = field(default_factory=dict)
    tasks: TaskOwner = field(init=False)
    loop: asyncio.AbstractEventLoop | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.tasks = TaskOwner(f"source-{self.name}")
        if self.metrics is None:
            self.metrics = SourceMetrics(self.registry)

    # -- state, scoped to this source -------------------------------------------------------------
    def set_faults(self, faults: Iterable[Fault]) -> bool:
        """Make ``faults`` the complete set this source reports (absent ones recover). True on change."""
        return self.state.replace_source(self.name, faults)

    def set_condition(self, type_: str, active: bool, reason: str = "", message: str = "") -> bool:
        """Set a node condition (BMCUnreachable, ...). True on change."""
        return self.state.set_condition(type_, active, reason, message)

    def mark_pending(self, *sources: str) -> None:
        """This source's fault sources (default: its own name) have not completed their first poll:
        ClusterD keeps what it had for them until :meth:`mark_ready` (issue 20)."""
        self.state.expect_sources(sources or (self.name,))

    def mark_ready(self, *sources: str) -> bool:
        """The first complete poll of these fault sources (default: this source's name) is in the
        state: ClusterD may now clear what they no longer report. True when one was pending."""
        return self.state.source_ready(sources or (self.name,))

    # -- tasks, threads ---------------------------------------------------------------------------
    def spawn(self, coro: Coroutine[Any, Any, Any], name: str | None = None) -> asyncio.Task:
        """Start an owned task (cancelled and awaited by :meth:`close`)."""
        if self.loop is None:
            self.loop = asyncio.get_running_loop()
        return self.tasks.spawn(coro, name=name or self.name)

    async def run_blocking(self, timeout_s: float, fn: Callable[..., Any], *args: Any) -> Any:
        """Run a blocking ``fn(*args)`` in the bounded pool. Raises ``BlockingTimeout`` after ``timeout_s``."""
        return await self.pool.call(timeout_s, fn, *args)

    def bind_loop(self) -> None:
        """Remember the running loop (call from the loop, before C callbacks may fire)."""
        self.loop = asyncio.get_running_loop()

    def from_thread(self, fn: Callable[..., Any], *args: Any) -> None:
        """Schedule ``fn(*args)`` on the loop from any thread (a C callback). Dropped after close."""
        loop = self.loop
        if loop is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # loop closed between the check and the call
            pass

    # -- HTTP and control messages ----------------------------------------------------------------
    def add_route(self, method: str, path: str, handler: Callable) -> None:
        """Register an HTTP route (served by the agent's HTTP server, added before it starts)."""
        self.routes.append((method, path, handler))

    def on_control(self, kind: str, handler: ControlHandler) -> None:
        """Handle ControlMessages whose body kind is ``kind`` (one handler per kind per service)."""
        self.controls[kind] = handler

    async def close(self, timeout_s: float = 5.0) -> None:
        """Cancel and await this source's tasks (up to ``timeout_s`` s)."""
        await self.tasks.close(timeout_s)


@runtime_checkable
class Source(Protocol):
    """A fault source (anchors §7). ``name`` is the kebab-case source name."""

    name: ClassVar[str]

    def supported(self) -> Support: ...
    async def start(self, ctx: SourceContext) -> None: ...
    async def stop(self) -> None: ...


class PushSource:
    """Base of callback-fed sources: keeps ``ctx``; subclasses override :meth:`start` / :meth:`stop`."""

    name: ClassVar[str] = "push"

    def __init__(self) -> None:
        self.ctx: SourceContext | None = None

    def supported(self) -> Support:
        """Runs everywhere unless a subclass says otherwise."""
        return Support(True)

    async def start(self, ctx: SourceContext) -> None:
        """Keep the context and bind the loop for :meth:`SourceContext.from_thread`."""
        self.ctx = ctx
        ctx.bind_loop()

    async def stop(self) -> None:
        """Cancel the source's tasks."""
        if self.ctx is not None:
            await self.ctx.close()


class PolledSource(PushSource):
    """Base of polled sources. Subclasses set ``interval_s`` / ``timeout_s`` and implement
    ``async poll() -> Iterable[Fault]`` (the FULL current set; may raise any exception: a failed
    poll, counted and backed off, the last reported faults stay).

    ``jitter`` (fraction of ``interval_s``, default 0.1) spreads a fleet's polls; after a failure the
    next poll waits :class:`faultmesh.retry.Backoff` (``backoff_initial_s``, capped at ``interval_s``).
    ``on_down(error)`` / ``on_up()`` hooks run once per transition (conditions, logs).
    ``fault_sources`` (default: ``(name,)``) are marked pending at start and ready after the first
    successful poll's :meth:`publish`.
    """

    interval_s: float = 60.0
    timeout_s: float = 15.0
    jitter: float = 0.1
    backoff_initial_s: float = 1.0
    # the Fault.source names this source reports, pending until its first successful poll
    # (None: its own name; (): it reports no faults of its own, e.g. deviced's engine-fed sources)
    fault_sources: ClassVar[tuple[str, ...] | None] = None

    def __init__(self) -> None:
        super().__init__()
        self.up: bool | None = None
        self.polls_ok = 0
        self.failures = 0
        self.last_error = ""
        self.polled = asyncio.Event()  # set after the first poll (ok or not)
        self._refresh = asyncio.Event()
        self._backoff: Backoff | None = None

    async def poll(self) -> Iterable[Fault]:  # pragma: no cover - abstract
        """The full current set of this source's faults."""
        raise NotImplementedError

    def reported_sources(self) -> tuple[str, ...]:
        """The ``Fault.source`` names this source reports (``fault_sources``, default its name)."""
        return (self.name,) if self.fault_sources is None else self.fault_sources

    def on_up(self) -> None:
        """Called once when polls start working (after start, or after failures)."""

    def on_down(self, error: str) -> None:
        """Called once when polls start failing."""

    def publish(self, faults: Iterable[Fault]) -> None:
        """Store a poll's result in the state (override to post-process)."""
        assert self.ctx is not None
        self.ctx.set_faults(faults)

    async def start(self, ctx: SourceContext) -> None:
        """Mark the source pending (until its first successful poll) and start the poll loop as an
        owned task."""
        await super().start(ctx)
        if self.reported_sources():
            ctx.mark_pending(*self.reported_sources())
        self._backoff = Backoff(
            min(self.backoff_initial_s, self.interval_s), max(self.interval_s, self.backoff_initial_s)
        )
        ctx.spawn(self.run(), name=f"poll-{self.name}")

    def request_refresh(self) -> None:
        """Poll again now instead of waiting for the next interval."""
        self._refresh.set()

    async def poll_once(self) -> bool:
        """One poll with its timeout; returns True when it worked. Never raises (except cancel)."""
        assert self.ctx is not None and self.ctx.metrics is not None
        m = self.ctx.metrics
        t0 = time.monotonic()
        try:
            async with asyncio.timeout(self.timeout_s):
                faults = list(await self.poll())
        except asyncio.CancelledError:
            raise
        except TimeoutError:
            return self._failed("timeout", f"poll timed out after {self.timeout_s:g} s", t0)
        except Exception as e:  # a failed poll is a state of the source, not a crash of the agent
            return self._failed("error", str(e) or type(e).__name__, t0)
        m.poll_seconds.labels(self.name).set(time.monotonic() - t0)
        m.polls.labels(self.name, "ok").inc()
        m.up.labels(self.name).set(1)
        self.publish(faults)
        if self.reported_sources():
            self.ctx.mark_ready(*self.reported_sources())
        self.polls_ok += 1
        self.failures = 0
        self.last_error = ""
        if self._backoff is not None:
            self._backoff.reset()
        if self.up is not True:
            if self.up is False:
                event(log, logging.INFO, "source up", source=self.name, node=self.ctx.node)
            self.up = True
            self.on_up()
        self.polled.set()
        return True

    def _failed(self, result: str, error: str, t0: float) -> bool:
        assert self.ctx is not None and self.ctx.metrics is not None
        m = self.ctx.metrics
        m.poll_seconds.labels(self.name).set(time.monotonic() - t0)
        m.polls.labels(self.name, result).inc()
        m.up.labels(self.name).set(0)
        self.failures += 1
        self.last_error = error
        if self.up is not False:
            event(log, logging.WARNING, "source down", source=self.name, node=self.ctx.node, error=error)
            self.up = False
            self.on_down(error)
        self.polled.set()
        return False

    def next_delay(self, ok: bool) -> float:
        """Seconds until the next poll: the jittered interval, or the backoff after a failure."""
        if not ok and self._backoff is not None:
            return self._backoff.next_delay()
        return self.interval_s * (1.0 + random.uniform(-self.jitter, self.jitter))

    async def run(self) -> None:
        """Poll forever (until cancelled)."""
        while True:
            ok = await self.poll_once()
            self._refresh.clear()
            try:
                async with asyncio.timeout(self.next_delay(ok)):
                    await self._refresh.wait()
            except TimeoutError:
                pass


async def start_sources(
    sources: Sequence[Source],
    make_ctx: Callable[[Source], SourceContext],
    started: list[tuple[Source, SourceContext]] | None = None,
) -> list[tuple[Source, SourceContext]]:
    """Start every supported source with its own context. A source that is not supported, or whose
    start raises, is logged ("source not started") and left out; the others run. Each started
    source is appended to ``started`` (a new list when None) as soon as it runs, so a caller whose
    start is cancelled half-way still holds every source to stop. Returns ``started``."""
    started = [] if started is None else started
    for src in sources:
        sup = src.supported()
        if not sup.ok:
            event(log, logging.INFO, "source not supported", source=src.name, reason=sup.reason)
            continue
        ctx = make_ctx(src)
        try:
            await src.start(ctx)
        except Exception as e:  # one broken source must not take the agent down
            event(log, logging.ERROR, "source not started", source=src.name, error=repr(e))
            await ctx.close()
            continue
        started.append((src, ctx))
    return started


async def stop_sources(started: Sequence[tuple[Source, SourceContext]], budget_s: float = 5.0) -> None:
    """Stop sources in reverse start order within ``budget_s`` seconds in all; a source that overruns
    its share is logged ("source stop overran") and its tasks cancelled."""
    deadline = time.monotonic() + budget_s
    for src, ctx in reversed(started):
        left = max(0.1, deadline - time.monotonic())
        try:
            async with asyncio.timeout(left):
                await src.stop()
        except TimeoutError:
            event(log, logging.WARNING, "source stop overran", source=src.name, budget_s=round(left, 2))
        except Exception as e:
            event(log, logging.WARNING, "source stop failed", source=src.name, error=repr(e))
        await ctx.close(max(0.1, deadline - time.monotonic()))
