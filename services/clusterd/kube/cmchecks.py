"""The checks every control ConfigMap of clusterd goes through (issue 15; issue 28 gave them one
owner): its ``namespace/name``, its one expected key's value (every other key, a bad value and a
missing key refused), and the rejections counted in
``faultmesh_rejected_requests_total{service="kube",reason}`` with a rate-limited log line.

Shared by the control ConfigMaps (:mod:`clusterd.kube.control`: data-trace, and the retry of the
ConfigMaps that wait for their job) and the slow-node ones (:mod:`clusterd.slownode.kube`).
"""

from __future__ import annotations

from clusterd.kube.metrics import KubeMetrics
from faultmesh.kubecm import config_map_values

MAX_VALUE_BYTES = 64 * 1024


def configmap_name(obj: dict) -> tuple[str, str]:
    """A ConfigMap's (namespace, name) ("" when absent)."""
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


class ConfigMapChecks:
    """See the module docstring. ``retrying``: True while the ConfigMaps that wait for their job
    are tried again (set by :class:`clusterd.kube.control.ControlMaps`): their rejections were
    counted when they came, so none is counted twice."""

    def __init__(self, metrics: KubeMetrics) -> None:
        self.metrics = metrics
        self.retrying = False

    def reject(self, reason: str, obj: dict, why: str) -> None:
        """Count and log one refused ConfigMap (``why`` cut to 300 characters)."""
        if self.retrying:
            return  # counted when this version came
        ns, name = configmap_name(obj)
        self.metrics.reject(reason, configmap=f"{ns}/{name}", error=why[:300])

    def value(self, kind: str, obj: dict, key: str, missing: str) -> str | None:
        """The ConfigMap's ``key`` value (None when it has none); every other key, a bad value and
        a missing key are refused and counted (``<kind>_unknown_key``, ``<kind>_bad_value``,
        ``missing``)."""
        values, bad = config_map_values(obj, MAX_VALUE_BYTES)
        for k, why in bad:
            self.reject(f"{kind}_bad_value", obj, f"{k}: {why}")
        for k in sorted(set(values) - {key}):
            self.reject(f"{kind}_unknown_key", obj, f"unknown key {k[:80]!r} (known: {key})")
        if key not in values and not any(k == key for k, _ in bad):
            self.reject(missing, obj, f"no key {key}")
        return values.get(key)
