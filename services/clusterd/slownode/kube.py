"""Slow-node detection's Kubernetes part (issue 15; reference fdol.md §7): the ``ras-feature-slownode-<job>``
ConfigMaps (label ``fd-ol-slow-node=true``, any namespace, or ``--kube-slownode-namespace``; key
``FeatConf``, the FeatConf JSON of fdol.md §7).

Added or changed -> slow-node detection of the job starts or is updated (``SlowNode: 0`` stops it);
deleted -> it stops. The job's placement comes from the job registry (pods / PodGroups, or
``POST /v1/jobs``); a FeatConf for a job not known yet waits and starts when the job appears, as the
reference waits for the job summary (the waiting and the retry are the control ConfigMaps' one
mechanism: :class:`clusterd.kube.control.ControlMaps`). Detection is
:class:`clusterd.slownode.component.SlowNodeComponent`'s (source ``kube``); after the first list a
``kube`` job whose ConfigMap is gone is stopped (:meth:`SlowNodeConfigMaps.sweep`).

Bad input (truncated JSON, unknown keys, values over 64 KiB, an invalid FeatConf) is refused with a
logged, counted reason (``slownode_*``, :class:`clusterd.kube.cmchecks.ConfigMapChecks`); unknown
FeatConf keys are counted (``slownode_featconf_unknown_keys``) and ignored, as the reference ignores
them. Deliberate difference: a changed ConfigMap applies every FeatConf key (the reference copies
only SlowNode/Servers/RankIds until delete + add).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from clusterd.slownode.jobs import EnableError, JobState, unwrap_configmap
from faultmesh.log import event
from fdol.slownode.featconf import FeatConf, FeatConfError, parse_featconf

if TYPE_CHECKING:
    from clusterd.kube.cmchecks import ConfigMapChecks

log = logging.getLogger("clusterd.kube")

SLOWNODE_LABEL = ("fd-ol-slow-node", "true")
SLOWNODE_PREFIX = "ras-feature-slownode"
FEATCONF_KEY = "FeatConf"
KIND = "slownode"


class SlowNodeJobs(Protocol):
    """What this part uses of :class:`clusterd.slownode.component.SlowNodeComponent`."""

    jobs: dict[str, JobState]

    async def enable(self, conf: FeatConf, placement: dict[int, str], source: str) -> Any: ...
    async def disable(self, job_id: str) -> Any: ...
    def resolve_placement(self, conf: FeatConf, ranks: Any) -> dict[int, str]: ...


def featconf_job(obj: dict) -> str | None:
    """The job id a ras-feature-slownode ConfigMap names (None when it names none)."""
    text = (obj.get("data") or {}).get(FEATCONF_KEY)
    try:
        return parse_featconf(orjson.loads(text)).job_id if isinstance(text, str) else None
    except (ValueError, FeatConfError):
        return None


def _accept(o: dict) -> bool:
    meta = o.get("metadata") or {}
    labelled = (meta.get("labels") or {}).get(SLOWNODE_LABEL[0]) == SLOWNODE_LABEL[1]
    return labelled and str(meta.get("name", "")).startswith(SLOWNODE_PREFIX)


class SlowNodeConfigMaps:
    """See the module docstring: the ras-feature-slownode ConfigMaps applied to ``slownode`` (the
    slow-node component, :class:`SlowNodeJobs`), checked with ``checks``, watched in ``namespace``
    ("": every namespace)."""

    def __init__(self, slownode: SlowNodeJobs, checks: ConfigMapChecks, namespace: str = "") -> None:
        self.slownode = slownode
        self.checks = checks
        self.namespace = namespace
        self.applied: dict[str, str] = {}  # ns/name of a ConfigMap -> the job it enabled

    def watch(self) -> tuple[str, str | None, str, Callable[[dict], bool]]:
        """(name, namespace or None, label selector, accept) of the ConfigMap watch."""
        return KIND, self.namespace or None, "=".join(SLOWNODE_LABEL), _accept

    async def apply(self, op: str, obj: dict, where: str) -> bool:
        """A ras-feature-slownode ConfigMap ``where`` (ns/name) changed. Returns True when it must
        wait for its job (tried again by the control ConfigMaps), False when handled or refused."""
        sn = self.slownode
        if op == "delete":
            job_id = self.applied.pop(where, None)
            if job_id is not None and getattr(sn.jobs.get(job_id), "source", "") == "kube":
                await sn.disable(job_id)
            return False
        text = self.checks.value(KIND, obj, FEATCONF_KEY, "slownode_no_featconf")
        if text is None:
            return False
        try:
            fc, ranks = unwrap_configmap({"data": {FEATCONF_KEY: text}})
            conf = parse_featconf(fc)
        except (EnableError, FeatConfError) as e:
            self.checks.reject("slownode_bad_featconf", obj, str(e))
            return False
        if conf.unknown_keys:
            self.checks.reject(
                "slownode_featconf_unknown_keys", obj, "ignored: " + ",".join(conf.unknown_keys)[:200]
            )
        try:
            placement = {} if conf.slow_node == 0 else sn.resolve_placement(conf, ranks)
        except EnableError as e:
            if not self.checks.retrying:
                event(
                    log, logging.INFO, "slow-node configmap waits for its job",
                    configmap=where, job=conf.job_id, why=str(e),
                )  # fmt: skip
            return True  # the job is not known yet: start when it is
        await sn.enable(conf, placement, "kube")
        self.applied[where] = conf.job_id
        return False

    async def sweep(self, listed: Iterable[dict]) -> None:
        """After the first list (``listed``: the ConfigMaps there are): stop the ``kube`` jobs
        (resumed from the store) whose ConfigMap is gone."""
        backed = {featconf_job(o) for o in listed}
        for job_id, js in list(self.slownode.jobs.items()):
            if js.source == "kube" and job_id not in backed:
                await self.slownode.disable(job_id)
