"""``noded --kube``: the reference NodeD's ``mindx-dl-nodeinfo-<node>`` ConfigMap (issue 15,
reference noded.md §3 "30-minute rule", §4).

Namespace ``--kube-namespace`` (``mindx-dl``), label ``mx-consumer-cim=true``, data ``NodeInfo``
(``{"NodeInfo": FaultDevInfo, "CheckCode": hex}`` in Go's bytes, :mod:`noded.nodeinfo`) and
``updateTime`` (RFC 3339, local time). Written when there is a fault device or NodeStatus is not
Healthy, deleted otherwise. Cadence as the reference: a change is written within ~1 s
(``min_interval_s`` 1), an unchanged document is skipped unless 30 min passed since the last write;
"unchanged" = same NodeStatus and, per (DeviceType, DeviceId), the same level and the same code *set*.

Deliberate differences: no ownerReference to the DaemonSet (the reference sets one when it can
GET it); a failed write is retried with a capped backoff instead of 3 tries 1 s apart.
"""

from __future__ import annotations

import argparse
import json

from faultmesh.kube import add_kube_arguments
from faultmesh.kubecm import AgentConfigMapSink
from noded import nodeinfo

NAME_PREFIX = "mindx-dl-nodeinfo-"
LABELS = {"mx-consumer-cim": "true"}
REFRESH_S = 1800.0  # the reference's 30-minute rule


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--kube`` and friends for noded."""
    g = add_kube_arguments(parser, "Kubernetes (node-info ConfigMap, as the reference NodeD)")
    g.add_argument("--kube-namespace", default="mindx-dl", help="namespace of mindx-dl-nodeinfo-<node>")


def _key(data: dict[str, str] | None):
    """What the 30-minute rule compares: NodeStatus and per device (level, code set)."""
    if data is None:
        return None
    try:
        info = json.loads(data["NodeInfo"])["NodeInfo"]
        devs = {
            (d["DeviceType"], d["DeviceId"]): (d["FaultLevel"], frozenset(d["FaultCode"]))
            for d in info["FaultDevList"]
        }
        return info["NodeStatus"], devs
    except (KeyError, TypeError, ValueError):
        return ("unreadable", data.get("NodeInfo"))


def same(old: dict[str, str], new: dict[str, str]) -> bool:
    """True when ``new`` needs no write under the reference's rule (see module docstring)."""
    return _key(old) == _key(new)


class KubeNodeInfo(AgentConfigMapSink):
    """The node-info ConfigMap of ``node``. ``update(info)`` with a ``FaultDevInfo`` object
    (:func:`noded.nodeinfo.fault_dev_info`) after every state change."""

    name_prefix = NAME_PREFIX
    labels = LABELS
    min_interval_s = 1.0
    refresh_s = REFRESH_S
    same = staticmethod(same)

    def update(self, info: dict) -> None:
        """Offer the document of ``info`` (or a delete when the node is healthy with no fault)."""
        self.offer(nodeinfo.node_info_document(info) if nodeinfo.should_publish(info) else None)
