"""clusterd's Kubernetes mode (``--kube``; issue 8, reference clusterd.md §5, §6.1, §6.5, §4.2).

Publishes the cluster view for Volcano and other consumers of the reference's ConfigMaps, consumes
the reference agents' ConfigMaps so faultmesh's brain can run over a fleet where they still run,
reads public-fault ConfigMaps, and annotates isolated nodes:

One part per concern, wired here:

- **publish** cluster-info ConfigMaps for Volcano: :mod:`.publisher`;
- **consume** the reference agents' node-info / device-info ConfigMaps and public-fault ConfigMaps
  (given to the PubFault intake): :mod:`.consumer`;
- **node annotation** ``NodeHealthyStatus=UnHealthy`` while a node is UnHealthy: :mod:`.annotator`
  (the per-node gauges the chart's alerts use, ``faultmesh_node_unhealthy`` and
  ``faultmesh_slow_node``, are exported by ClusterD's core in every mode:
  :class:`clusterd.nodehealth.NodeHealthCollector`);
- **jobs from pods** (``--kube-jobs on``) into the brain's job registry: :mod:`.podjobs`, with the
  recovery settings of their Volcano PodGroups (``--kube-podgroups on``): :mod:`.podgroups`;
- **node signals** (conditions, events, optional taint): :mod:`.signals`;
- **the rescheduling hand-off** (reset-config, PodGroup and pod labels) from the brain's decisions,
  its isolations through the isolation breaker: :mod:`.handoff`;
- **leader election** (``--kube-leader-elect on``): only the Lease holder runs the writers above:
  :mod:`.leader`;
- **control ConfigMaps** (``ras-feature-slownode-*``, ``data-trace-<job>``) and ``fault-job-info``:
  :mod:`.control`;
- **super-pod-<id>** ConfigMaps (the pingmesh topology from the agents' device states): :mod:`.superpod`.

Watches re-list on 410 Gone and after errors, so no change is lost (:class:`faultmesh.kubewatch.ListWatcher`).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from clusterd.brain.jobs import JobRegistry
from clusterd.breaker import IsolationBreaker
from clusterd.kube import control as kcontrol
from clusterd.kube import formats, podgroups
from clusterd.kube import jobs as kjobs
from clusterd.kube import leader as kleader
from clusterd.kube import signals as ksignals
from clusterd.kube.annotator import NodeAnnotator
from clusterd.kube.config import KubeConfig
from clusterd.kube.consumer import CIM_LABEL, PUBLIC_FAULT_LABEL, KubeConsumer, PublicFaultIntake, has_label
from clusterd.kube.handoff import HandOff
from clusterd.kube.metrics import KubeMetrics
from clusterd.kube.podgroups import PodGroups
from clusterd.kube.podjobs import PodJobs
from clusterd.kube.podport import KubePods
from clusterd.kube.publisher import ClusterInfoPublisher
from clusterd.kube.signals import NodeSignals
from clusterd.kube.superpod import SuperPodPublisher
from faultmesh.kube import KubeApi, make_api_client
from faultmesh.kubewatch import ListWatcher
from faultmesh.lease import LeaseElector
from faultmesh.log import event
from faultmesh.runtime import wait_for

CLUSTERD_CONFIG_CM = "clusterd-config-cm"  # reference clusterd.md §8: the manual-separation policy
POLICY_KEY = "manually_separate_policy.conf"

if TYPE_CHECKING:
    from clusterd.context import ClusterContext

log = logging.getLogger("clusterd.kube")


class KubeComponent:
    """The ``--kube`` component of clusterd (see the module docstring). Inert without ``--kube``.

    ``cfg``: its configuration section (:class:`~clusterd.kube.config.KubeConfig`);
    ``public_faults``: the PubFault intake for public-fault ConfigMaps (None: they are rejected);
    ``jobs``: the job registry pods become jobs in (None: no job discovery); ``election``: the
    replica's :class:`~clusterd.kube.leader.Election` (its elector given by the replica runner, or
    made here at start with ``--kube-leader-elect on``; None: a private one).
    """

    name = "kube"

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        g = parser.add_argument_group("Kubernetes mode")
        g.add_argument("--kube", action="store_true", help="publish/consume the reference's ConfigMaps")
        g.add_argument(
            "--kubeconfig", help="kubeconfig file (default: in-cluster service account, then ~/.kube/config)"
        )
        g.add_argument(
            "--kube-api", help="API server URL without auth (tests, kubectl proxy); overrides --kubeconfig"
        )
        g.add_argument(
            "--kube-publish-namespace", default="mindx-dl", help="namespace of cluster-info-* ConfigMaps"
        )
        g.add_argument(
            "--kube-deviceinfo-namespace", default="kube-system", help="namespace of mindx-dl-deviceinfo-*"
        )
        g.add_argument(
            "--kube-nodeinfo-namespace", default="mindx-dl", help="namespace of mindx-dl-nodeinfo-*"
        )
        g.add_argument(
            "--kube-publicfault-namespace",
            default="",
            help="namespace of public-fault ConfigMaps (empty: all)",
        )
        g.add_argument(
            "--kube-device-type", default="Ascend910", help="device resource name: Ascend910, Ascend310P, npu"
        )
        g.add_argument(
            "--kube-shard-bytes",
            type=int,
            default=formats.MAX_SHARD_BYTES,
            help="max bytes per cluster-info shard",
        )
        g.add_argument(
            "--kube-min-write-s", type=float, default=1.0, help="min interval between publish rounds (s)"
        )
        g.add_argument(
            "--kube-resync-s", type=float, default=60.0, help="read back published ConfigMaps every (s)"
        )
        g.add_argument(
            "--kube-publish-holdoff-s",
            type=float,
            default=-1.0,
            help="after start, keep the cluster-info ConfigMaps as they are for this long (s), so the "
            "agents' snapshots arrive first; -1 (default): 15 with --kube-leader-elect on (a new leader "
            "starts without the agents' faults), else 0",
        )
        g.add_argument("--kube-watch-timeout-s", type=int, default=300, help="server-side watch timeout (s)")
        g.add_argument("--kube-timeout-s", type=float, default=10.0, help="timeout of one API call (s)")
        g.add_argument(
            "--kube-clusterd-config-namespace",
            default="cluster-system",
            help="namespace of clusterd-config-cm (the manual-separation policy)",
        )
        g.add_argument(
            "--kube-jobs",
            choices=("on", "off"),
            default="on",
            help="discover training jobs from pods into the job registry",
        )
        g.add_argument(
            "--kube-superpod-period-s",
            type=float,
            default=5.0,
            help="how often the super-pod-<id> ConfigMaps are brought up to date (s; reference: 5)",
        )
        ksignals.add_arguments(g)
        kleader.add_arguments(g)
        kcontrol.add_arguments(g)
        g.add_argument(
            "--kube-podgroups",
            choices=("on", "off"),
            default="on",
            help="watch Volcano PodGroups for job settings; hand off recovery decisions",
        )

    def __init__(
        self,
        ctx: ClusterContext,
        cfg: KubeConfig,
        public_faults: PublicFaultIntake | None = None,
        jobs: JobRegistry | None = None,
        policy: Callable[[str | None, str], bool] | None = None,
        decisions: Callable[[Callable[[str, dict], None]], None] | None = None,
        reports: Callable[[Callable[[str, list, str], None]], None] | None = None,
        election: kleader.Election | None = None,
        breaker: IsolationBreaker | None = None,
    ) -> None:
        self.ctx = ctx
        self.policy = policy
        self.cfg = a = cfg
        self.enabled = bool(a.kube)
        self.metrics = KubeMetrics(ctx.metrics.registry, ctx.metrics.reject)
        self.annotator = NodeAnnotator(ctx.nodes, self.metrics, self._known_node)
        self.consumer = KubeConsumer(
            a.kube_timeout_s * 3, ctx.center, ctx.nodes, self.metrics, public_faults, self._mark
        )
        self.publisher = ClusterInfoPublisher(
            a, ctx.center, ctx.nodes, self.consumer.device_docs, self.metrics, self.annotator.due.set, breaker
        )
        if breaker is not None:
            breaker.on_release.append(self.publisher.on_breaker_release)
        self.signals = NodeSignals(
            a.signals, ctx.center, ctx.nodes, self.metrics, self._known_node, self._node_count, self._node_taints,
            ctx.metrics.registry,
        )  # fmt: skip
        self.podgroups = PodGroups(self.metrics, self._podgroup_changed)
        self.superpods = SuperPodPublisher(  # pingmesh_on: set by clusterd.app (the slownet config)
            ctx.nodes,
            self.metrics,
            period_s=a.kube_superpod_period_s,
            node_objects=self._node_objects,
        )
        self.pod_jobs = PodJobs(jobs, ctx.store, self.metrics, self.podgroups) if jobs is not None else None
        self.handoff = (
            HandOff(
                jobs, self.podgroups, self.pod_jobs.pods_of, self.metrics, ctx.tasks.spawn, breaker=breaker
            )
            if jobs is not None and self.pod_jobs is not None
            else None
        )
        self.pod_port = (  # the controllers' pods and PodGroup (hot switch backup, resources back)
            KubePods(self.pod_jobs, self.podgroups, self.handoff)
            if self.enabled and self.handoff is not None and a.kube_jobs == a.kube_podgroups == "on"
            else None
        )
        if breaker is not None and self.handoff is not None:
            breaker.on_release.append(self.handoff.on_breaker_release)
        self._api_client = None
        self._tasks: list[asyncio.Task] = []
        self._leadership: kleader.Leadership | None = None
        self.api: KubeApi | None = None
        self.nodes: ListWatcher | None = None
        self.pods: ListWatcher | None = None
        self.watchers: list[ListWatcher] = []
        # the replica's election: its elector given by clusterd.kube.ha (run, released there), or
        # made, run and released here with --kube-leader-elect on
        self.election = election if election is not None else kleader.Election()
        if self.enabled:
            ctx.center.subscribe("kube", self.publisher.on_changes, resync=self.publisher.on_resync)
            ctx.center.subscribe("kube-signals", self.signals.on_changes, resync=self.signals.on_resync)
            ctx.agents.on_connect(lambda node, agent: self._mark(node))
            if decisions is not None and self.handoff is not None and a.kube_podgroups == "on":
                decisions(self.handoff.on_decision)
            if reports is not None and self.handoff is not None and a.kube_podgroups == "on":
                reports(self.handoff.on_report)

    # -- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        """Connect and start the watchers, the publisher and the annotator (owned by ``ctx.tasks``)."""
        if not self.enabled:
            return
        # OSError: clusterd's start path reports it as "clusterd failed to start" and exits 1.
        self._api_client = await make_api_client(self.cfg.kube_api, self.cfg.kubeconfig)
        self.api = self.publisher.api = self.annotator.api = self.signals.api = self.superpods.api = KubeApi(
            self._api_client, timeout_s=self.cfg.kube_timeout_s
        )
        a = self.cfg
        watcher = self.watcher

        def cm_named(label, prefix):
            return lambda o: has_label(o, label) and o["metadata"].get("name", "").startswith(prefix)

        c = self.consumer
        self.nodes = c.node_watch = watcher("nodes", "nodes", None, "", self._on_node, lambda o: True)
        sel = "=".join(CIM_LABEL)
        self.watchers = [
            self.nodes,
            watcher(
                "nodeinfo", "configmaps", a.kube_nodeinfo_namespace, sel, c.on_nodeinfo,
                cm_named(CIM_LABEL, formats.NODEINFO_PREFIX),
            ),
            watcher(
                "deviceinfo", "configmaps", a.kube_deviceinfo_namespace, sel, c.on_deviceinfo,
                cm_named(CIM_LABEL, formats.DEVICEINFO_PREFIX),
            ),
            watcher(
                "publicfault", "configmaps", a.kube_publicfault_namespace, "=".join(PUBLIC_FAULT_LABEL),
                c.on_publicfault, lambda o: has_label(o, PUBLIC_FAULT_LABEL),
            ),
        ]  # fmt: skip
        if self.policy is not None:
            self.watchers.append(
                watcher(
                    "clusterdconfig", "configmaps", a.kube_clusterd_config_namespace, "", self._on_config,
                    lambda o: o["metadata"].get("name") == CLUSTERD_CONFIG_CM,
                )
            )  # fmt: skip
        spawn = self.ctx.tasks.spawn
        if a.kube_jobs == "on" and self.pod_jobs is not None:
            self.pods = self.pod_jobs.pod_watch = watcher(
                "pods", "pods", None, "", self.pod_jobs.on_pod, kjobs.is_job_pod
            )
            self.watchers.append(self.pods)
            self._tasks.append(spawn(self.pod_jobs.run(), name="kube-job-sync"))
            if a.kube_podgroups == "on":
                self.watchers.append(
                    watcher("podgroups", podgroups.KIND, None, "", self.podgroups.on_podgroup, lambda o: True)
                )
                assert self.handoff is not None
                self.handoff.api = self.api
        elif a.kube_jobs == "on":
            event(log, logging.WARNING, "kube job discovery off: no job registry in this clusterd")
        for w in self.watchers:
            self._tasks.append(spawn(w.run(), name=f"kube-watch-{w.kind}-{w.namespace or 'all'}"))
        writers: list = [
            ("publisher", self.publisher.run), ("annotator", self.annotator.run), ("signals", self.signals.run),
            ("superpods", self.superpods.run),
        ]  # fmt: skip
        if self.handoff is not None and self.handoff.api is not None:
            writers.append(("handoff", self.handoff.run))
        if a.leader_elect:
            elector = self.election.elector
            if elector is None:
                elector = self.election.own(
                    LeaseElector(
                        self.api,
                        a.leader.kube_lease_namespace,
                        a.leader.kube_lease_name,
                        kleader.identity(),
                        lease_s=a.leader.kube_lease_s,
                    )
                )
                self._tasks.append(spawn(elector.run(), name="kube-lease"))
            self._leadership = kleader.Leadership(elector, writers, spawn, self._elected)
            self._tasks.append(spawn(self._leadership.run(), name="kube-leadership"))
        else:
            self._tasks += [spawn(w(), name=f"kube-{name}") for name, w in writers]
        event(
            log,
            logging.INFO,
            "kube mode started",
            publish_namespace=a.kube_publish_namespace,
            api=a.kube_api or a.kubeconfig or "in-cluster",
        )

    async def stop(self) -> None:
        """Cancel the watchers and the publisher (before the API client closes under them); a
        leader releases its Lease."""
        if self.election.owned and self.election.elector is not None:
            await wait_for(self.election.elector.release(), self.cfg.kube_timeout_s + 1)
        for t in self._tasks:
            t.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5)
        self._tasks.clear()
        if self._api_client is not None:
            await self._api_client.close()
            self._api_client = None

    @property
    def elector(self) -> LeaseElector | None:
        """The replica's Lease elector (None while leader election is off or before :meth:`start`)."""
        return self.election.elector

    # -- for the parts started after it (clusterd.kube.control) ----------------------------------------
    def watcher(self, name: str, kind: str, ns: str | None, selector: str, handler, accept) -> ListWatcher:
        """A :class:`ListWatcher` on this component's API (after :meth:`start`) with its watch
        timeout and metrics (``api_errors{op="watch <name>"}``, ``restarts{<name>}``)."""
        m = self.metrics
        return ListWatcher(
            self.api, kind, ns or None, selector, handler, accept,
            watch_timeout_s=self.cfg.kube_watch_timeout_s,
            on_error=lambda e: m.api_errors.labels(f"watch {name}", str(e.status)).inc(),
            on_restart=lambda why: m.restarts.labels(name, why).inc(),
        )  # fmt: skip

    def run_led(self, name: str, writer) -> None:
        """Run ``writer()`` (a coroutine factory) while this replica leads, as this component's own
        writers: under the Lease with leader election, else at once; cancelled on :meth:`stop`.
        Call after :meth:`start`."""
        if self._leadership is not None:
            self._leadership.add(name, writer)
        else:
            self._tasks.append(self.ctx.tasks.spawn(writer(), name=f"kube-{name}"))

    # -- wiring ----------------------------------------------------------------------------------
    async def _on_config(self, op: str, obj: dict) -> None:
        """clusterd-config-cm changed: its policy key goes to ``policy`` (a deleted map keeps the
        policy in force, as a rejected one does)."""
        if op == "upsert" and self.policy is not None:
            self.policy((obj.get("data") or {}).get(POLICY_KEY), CLUSTERD_CONFIG_CM)

    def _known_node(self, node: str) -> bool:
        return self.consumer.known_node(node)

    def _mark(self, node: str) -> None:
        self.publisher.mark(node)
        self.signals.mark(node)

    def _elected(self) -> None:
        """This replica now leads: re-check every node's annotation and signals."""
        self.annotator.due.set()
        self.signals.mark_all()

    def _podgroup_changed(self, job_id: str) -> None:
        if self.pod_jobs is not None:
            self.pod_jobs.touch(job_id)

    def _node_count(self) -> int:
        return len(self.nodes.objects) if self.nodes is not None else 0

    def _node_objects(self) -> dict[str, dict]:
        return {name: obj for (_, name), obj in self.nodes.objects.items()} if self.nodes is not None else {}

    def _node_taints(self, node: str) -> list:
        obj = self.nodes.objects.get(("", node)) if self.nodes is not None else None
        return list(((obj or {}).get("spec") or {}).get("taints") or [])

    async def _on_node(self, op: str, obj: dict) -> None:
        node = obj["metadata"]["name"]
        if op == "upsert":
            await self.consumer.node_added(node)
        else:
            self.annotator.forget(node)
            self.signals.forget(node)
        self._mark(node)

    async def publish_once(self) -> int:
        """One publish round now (tests). Returns how many ConfigMaps were written."""
        return await self.publisher.publish_once()
