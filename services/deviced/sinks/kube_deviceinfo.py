"""``deviced --kube``: the reference device plugin's ``mindx-dl-deviceinfo-<node>`` ConfigMap
(issue 15, reference deviced.md §5.1 "Write policy").

Namespace ``--kube-namespace`` (``kube-system``), label ``mx-consumer-cim=true``, data keys
``DeviceInfoCfg``, ``SwitchInfoCfg``, ``ManuallySeparateNPU``, ``UpgradeFaultReason``,
``Description`` -- the document of :func:`deviced.sinks.deviceinfo.build`, in Go's bytes. Cadence as
the reference: updated (created if absent) at most once a second; a document equal to the last
written one -- ignoring ``UpdateTime`` and every ``fault_time`` -- is skipped unless 5 min passed
since the last write.

Deliberate differences: a failed write is retried with a capped backoff (the reference tries every
1 s for 10 s, then waits for the next change); ManuallySeparateNPU / UpgradeFaultReason are not
restored from an existing ConfigMap at start (deviced restores them from its state file).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from deviced.sinks import deviceinfo
from faultmesh.kube import add_kube_arguments
from faultmesh.kubecm import AgentConfigMapSink

NAME_PREFIX = "mindx-dl-deviceinfo-"
LABELS = {"mx-consumer-cim": "true"}
REFRESH_S = 300.0  # the reference rewrites an unchanged document every 5 min


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--kube`` and friends for deviced."""
    g = add_kube_arguments(parser, "Kubernetes (device-info ConfigMap, as the reference device plugin)")
    g.add_argument("--kube-namespace", default="kube-system", help="namespace of mindx-dl-deviceinfo-<node>")


def _strip(obj: Any) -> Any:
    """``obj`` without the keys the change check ignores (UpdateTime, CheckCode, fault_time)."""
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in obj.items() if k not in ("UpdateTime", "CheckCode", "fault_time")}
    if isinstance(obj, list):
        return [_strip(v) for v in obj]
    return obj


def _key(data: dict[str, str]) -> dict:
    out: dict[str, Any] = {}
    for k, v in data.items():
        try:
            doc = json.loads(v) if k in ("DeviceInfoCfg", "SwitchInfoCfg") else v
        except ValueError:
            doc = v
        if k == "DeviceInfoCfg" and isinstance(doc, dict):
            dl = dict((doc.get("DeviceInfo") or {}).get("DeviceList") or {})
            for name, value in dl.items():
                if name.endswith("-Fault") and value:
                    try:
                        dl[name] = json.loads(value)
                    except ValueError:
                        pass
            doc = {**doc, "DeviceInfo": {"DeviceList": dl}}
        out[k] = _strip(doc)
    return out


def same(old: dict[str, str], new: dict[str, str]) -> bool:
    """True when ``new`` differs from ``old`` only in times (see module docstring)."""
    return _key(old) == _key(new)


class KubeDeviceInfo(AgentConfigMapSink):
    """The device-info ConfigMap of ``node``; ``update(app)`` after every report."""

    name_prefix = NAME_PREFIX
    labels = LABELS
    min_interval_s = 1.0
    refresh_s = REFRESH_S
    same = staticmethod(same)

    def update(self, app) -> None:
        """Offer the document of ``app`` (a :class:`deviced.app.DeviceD`)."""
        self.offer(deviceinfo.build(app)["data"])
