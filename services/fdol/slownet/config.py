"""pingmesh-config: per super pod (or ``global``) ``{"activate": "on"|"off", "task_interval": 1..60}``.

Source: reference noded.md §6 (``pingmesh-config`` ConfigMap: each data value a JSON string; the
super pod's own id wins over ``global``; invalid activate/interval -> ignored, previous state kept)
and fdol.md §8.1 (detection period = 10 x task_interval). Accepted inputs: the ConfigMap itself
decoded (a mapping with ``data``; the services decode its YAML with
:func:`faultmesh.config.load_document`), JSON text, or a plain mapping whose values are objects or
JSON strings (the agent stream's ``PingmeshConfig`` message is converted by the services at their
edge). Key ``roce`` is the RoCE parameter plane between super pods (reference noded.md §6 "Key
``roce`` is the inter-super-pod RoCE switch", fdol.md §8.1 ``super-pod-roce``): its own entry,
with no ``global`` fallback (the reference skips RoCE detection without it); see
:mod:`fdol.slownet.roce`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fdol import strictjson

TASK_INTERVAL_RANGE = (1, 60)
ROCE_KEY = "roce"
PERIOD_FACTOR = 10  # detection period = 10 x task_interval (s)


class PingmeshConfigError(ValueError):
    """A pingmesh-config that cannot be used; the previous config stays (the message says why)."""


@dataclass(frozen=True)
class Activation:
    """One entry: ``activate`` (bool) and ``task_interval`` (s, 1..60)."""

    activate: bool
    task_interval: int

    @property
    def period_s(self) -> int:
        """Detection / collection period: 10 x task_interval seconds."""
        return PERIOD_FACTOR * self.task_interval

    def go_repr(self) -> str:
        """The reference log's Go ``%#v`` of the config (noded.md §6 result file, line 1)."""
        act = "on" if self.activate else "off"
        return f'&types.HccspingMeshConfig{{Activate:"{act}", TaskInterval:{self.task_interval}}}'


def _activation(key: str, v: Any) -> Activation:
    if isinstance(v, (str, bytes)):
        try:
            v = strictjson.loads(v)
        except ValueError:
            raise PingmeshConfigError(f"{key}: value is not JSON") from None
    if not isinstance(v, dict):
        raise PingmeshConfigError(f"{key}: value must be an object")
    act = v.get("activate")
    if act not in ("on", "off"):
        raise PingmeshConfigError(f"{key}: activate must be 'on' or 'off', not {act!r}")
    ti = v.get("task_interval")
    if isinstance(ti, str) and ti.strip().isdigit():
        ti = int(ti)
    if (
        isinstance(ti, bool)
        or not isinstance(ti, int)
        or not TASK_INTERVAL_RANGE[0] <= ti <= TASK_INTERVAL_RANGE[1]
    ):
        raise PingmeshConfigError(f"{key}: task_interval must be an integer 1..60, not {ti!r}")
    return Activation(act == "on", ti)


def parse_config(data: str | bytes | dict[str, Any]) -> dict[str, Activation]:
    """Parse a pingmesh-config (module doc: a decoded mapping or JSON text) into {key: Activation};
    keys are ``global``, ``roce`` or decimal super-pod ids. Raises :class:`PingmeshConfigError` for text that is
    not JSON, on any invalid entry or when no entry is left."""
    if isinstance(data, (str, bytes)):
        try:
            data = strictjson.loads(data)
        except ValueError as e:
            raise PingmeshConfigError(f"pingmesh-config is not JSON: {str(e)[:200]}") from None
    if not isinstance(data, dict):
        raise PingmeshConfigError("pingmesh-config must be a mapping")
    if isinstance(data.get("data"), dict):  # a ConfigMap
        data = data["data"]
    out: dict[str, Activation] = {}
    for key, v in data.items():
        key = str(key)
        if key not in ("global", ROCE_KEY) and not key.isdigit():
            raise PingmeshConfigError(f"key {key!r} is neither 'global' nor a super pod id")
        out[key] = _activation(key, v)
    if not out:
        raise PingmeshConfigError("pingmesh-config has no 'global', super pod or 'roce' entry")
    return out


def for_super_pod(cfg: dict[str, Activation], super_pod_id: str | int) -> Activation | None:
    """The entry for a super pod: its own id wins, else ``global``, else None. For the RoCE plane
    (``super_pod_id`` ``"roce"``) only the ``roce`` entry counts."""
    if str(super_pod_id) == ROCE_KEY:
        return cfg.get(ROCE_KEY)
    return cfg.get(str(super_pod_id)) or cfg.get("global")


def to_json_obj(cfg: dict[str, Activation]) -> dict[str, dict[str, Any]]:
    """{key: {"activate": "on"|"off", "task_interval": n}} (for HTTP and the state store)."""
    return {
        k: {"activate": "on" if a.activate else "off", "task_interval": a.task_interval}
        for k, a in cfg.items()
    }
