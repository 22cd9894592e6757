"""Super-pod topology: nodes, server indexes, physical id -> SDID, optional switch planes.

Source: reference noded.md §6 (``super-pod-<id>`` ConfigMap, ``superPodDevice`` JSON
``{"SuperPodID", "NodeDeviceMap": {node: {"NodeName", "ServerID", "DeviceMap": {"<phyId>": "<sdid>"}}}}``
and the SDID -> IPv4 rule) and fdol.md §8.2 (A3 topology file ``super-pod-<N>.json`` with ``Version``).

SDID layout (reference noded.md §6, checked against the docs' 7-node example): bits 22..31 = server id,
bits 16..17 = die, bits 0..15 = device; the documented super pods also put ``phy // 2`` in bits 18..21,
which :func:`make_sdid` reproduces (e.g. server 1, phy 15 -> 6094863).

faultmesh extensions: an optional ``"Planes": {"<plane id>": [phy ids]}`` names the HCCS switch plane
each physical id uses for inter-node traffic; with it localization can blame a plane (issue 6). An
optional per-node ``"RoceIP"`` (the node's RoCE parameter-plane address: every NPU of an OS leaves
through the same egress IP, reference fdol.md §8.2) and ``"RocePhyId"`` (the NPU whose port carries
it, default the lowest phy id) put the node on the RoCE plane between super pods
(:mod:`fdol.slownet.roce`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from fdol import strictjson

MAX_PHY_ID = 63
MAX_SDID = (1 << 32) - 1


class TopologyError(ValueError):
    """A super-pod topology that is missing, malformed or contradictory (the message says why)."""


def sdid_server_id(sdid: int) -> int:
    """Server id of an SDID: ``(sdid >> 22) & 0x3FF`` (reference noded.md §6, fdol.md §8.8)."""
    return (sdid >> 22) & 0x3FF


def sdid_to_ip(sdid: int) -> str:
    """SDID -> pseudo IPv4 ``192.<server>.<2+die>.<199-dev>`` (reference noded.md §6).

    Examples: 62914560 -> ``192.15.2.199``, 62980097 -> ``192.15.3.198``, 4259841 -> ``192.1.3.198``.
    """
    server = (sdid >> 22) & 0x3FF
    die = (sdid >> 16) & 0x3
    dev = sdid & 0xFFFF
    return f"192.{server}.{2 + die}.{199 - dev}"


def make_sdid(server_id: int, phy_id: int) -> int:
    """The SDID an A3 super pod gives ``phy_id`` on server ``server_id`` (layout in the module doc).

    Raises ``ValueError`` when server_id is outside 0..1023 or phy_id outside 0..63.
    """
    if not 0 <= server_id <= 0x3FF or not 0 <= phy_id <= MAX_PHY_ID:
        raise ValueError(f"server_id {server_id} / phy_id {phy_id} out of range")
    return (server_id << 22) | ((phy_id // 2) << 18) | ((phy_id % 2) << 16) | phy_id


@dataclass
class NodeTopology:
    """One server of a super pod: ``name``, ``server_index`` and ``devices`` (phy id -> SDID)."""

    name: str
    server_index: int
    devices: dict[int, int] = field(default_factory=dict)
    roce_ip: str = ""
    roce_phy: int | None = None


@dataclass
class SuperPod:
    """One super pod: ``super_pod_id`` (decimal string; ``"roce"`` for the RoCE plane), ``nodes`` by
    name, optional ``planes`` (plane id -> set of phy ids), optional ``groups`` (node -> group id:
    the super pod of each node of the RoCE plane), ``warnings`` found while parsing.

    Lookups: :meth:`locate` (SDID -> (node, phy)), :meth:`plane_of` (phy -> plane id or None).
    """

    super_pod_id: str
    nodes: dict[str, NodeTopology]
    planes: dict[int, frozenset[int]] | None = None
    warnings: list[str] = field(default_factory=list)
    version: str = "A3"
    groups: dict[str, str] | None = None

    def __post_init__(self) -> None:
        self._by_sdid: dict[int, tuple[str, int]] = {}
        for n in self.nodes.values():
            for phy, sdid in n.devices.items():
                self._by_sdid[sdid] = (n.name, phy)
        self._plane_of: dict[int, int] = {}
        for pid, phys in (self.planes or {}).items():
            for p in phys:
                self._plane_of[p] = pid

    def locate(self, sdid: int) -> tuple[str, int] | None:
        """(node name, phy id) of an SDID, or None when the SDID is not in this super pod."""
        return self._by_sdid.get(sdid)

    def plane_of(self, phy_id: int) -> int | None:
        """The switch plane of a phy id, or None without planes."""
        return self._plane_of.get(phy_id)

    def node_by_server_index(self, index: int) -> NodeTopology | None:
        """The node with this server index, or None."""
        for n in self.nodes.values():
            if n.server_index == index:
                return n
        return None

    @property
    def npu_count(self) -> int:
        """Number of NPUs in the super pod."""
        return len(self._by_sdid)

    # -- serialization -----------------------------------------------------------------------
    def to_json_obj(self) -> dict[str, Any]:
        """The reference ``superPodDevice`` form (plus ``Planes`` when set)."""
        obj: dict[str, Any] = {
            "Version": self.version,
            "SuperPodID": self.super_pod_id,
            "NodeDeviceMap": {
                n.name: {
                    "NodeName": n.name,
                    "ServerID": str(n.server_index),
                    "DeviceMap": {str(p): str(s) for p, s in sorted(n.devices.items())},
                    **({"RoceIP": n.roce_ip} if n.roce_ip else {}),
                    **({"RocePhyId": str(n.roce_phy)} if n.roce_ip and n.roce_phy is not None else {}),
                }
                for n in sorted(self.nodes.values(), key=lambda n: n.server_index)
            },
        }
        if self.planes:
            obj["Planes"] = {str(k): sorted(v) for k, v in sorted(self.planes.items())}
        return obj


def _int(value: Any, what: str, lo: int, hi: int) -> int:
    if isinstance(value, bool):
        raise TopologyError(f"{what} must be an integer, got {value!r}")
    try:
        v = int(str(value).strip(), 10)
    except (TypeError, ValueError):
        raise TopologyError(f"{what} must be an integer, got {value!r}") from None
    if not lo <= v <= hi:
        raise TopologyError(f"{what} {v} outside {lo}..{hi}")
    return v


def _is_ipv4(s: str) -> bool:
    parts = s.split(".")
    return len(parts) == 4 and all(p.isdigit() and len(p) <= 3 and int(p) <= 255 for p in parts)


def _check(sp: SuperPod) -> SuperPod:
    if not sp.nodes:
        raise TopologyError(f"super pod {sp.super_pod_id}: no nodes")
    seen: dict[int, str] = {}
    indexes: dict[int, str] = {}
    for n in sp.nodes.values():
        if not n.devices:
            raise TopologyError(f"node {n.name}: empty DeviceMap")
        if n.server_index in indexes:
            raise TopologyError(
                f"nodes {indexes[n.server_index]} and {n.name} share server index {n.server_index}"
            )
        indexes[n.server_index] = n.name
        servers = set()
        for phy, sdid in n.devices.items():
            if sdid in seen:
                raise TopologyError(f"SDID {sdid} on both {seen[sdid]} and {n.name}/{phy}")
            seen[sdid] = f"{n.name}/{phy}"
            servers.add(sdid_server_id(sdid))
        if len(servers) > 1:
            sp.warnings.append(f"node {n.name}: SDIDs span server ids {sorted(servers)}")
    if sp.planes:
        owner: dict[int, int] = {}
        for pid, phys in sp.planes.items():
            for p in phys:
                if p in owner:
                    raise TopologyError(f"phy {p} in planes {owner[p]} and {pid}")
                owner[p] = pid
    sp.__post_init__()
    return sp


def parse_super_pod(data: str | bytes | dict[str, Any]) -> SuperPod:
    """Parse the reference ``superPodDevice`` JSON (str/bytes or decoded dict) into a :class:`SuperPod`.

    ``ServerID`` defaults to the SDIDs' server id when absent. Raises :class:`TopologyError` for
    missing ``SuperPodID``/``NodeDeviceMap``, non-integer ids, duplicate SDIDs or server indexes, a
    ``NodeName`` different from its map key, or a phy id in two planes.
    """
    if isinstance(data, (str, bytes, bytearray)):
        try:
            data = strictjson.loads(data)
        except ValueError as e:
            raise TopologyError(f"topology is not JSON: {e}") from None
    if not isinstance(data, dict):
        raise TopologyError("topology must be a JSON object")
    if "superPodDevice" in data and "NodeDeviceMap" not in data:  # the ConfigMap's data section
        return parse_super_pod(data["superPodDevice"])
    spid = data.get("SuperPodID")
    if spid is None or str(spid).strip() == "":
        raise TopologyError("topology has no SuperPodID")
    spid = str(_int(spid, "SuperPodID", 0, 65535))
    ndm = data.get("NodeDeviceMap")
    if not isinstance(ndm, dict) or not ndm:
        raise TopologyError(f"super pod {spid}: NodeDeviceMap missing or empty")
    nodes: dict[str, NodeTopology] = {}
    for key, nd in ndm.items():
        if not isinstance(nd, dict):
            raise TopologyError(f"node {key}: entry must be an object")
        name = str(nd.get("NodeName") or key)
        if name != key:
            raise TopologyError(f"node key {key!r} has NodeName {name!r}")
        dm = nd.get("DeviceMap")
        if not isinstance(dm, dict) or not dm:
            raise TopologyError(f"node {name}: DeviceMap missing or empty")
        devices = {
            _int(p, f"node {name} phy id", 0, MAX_PHY_ID): _int(s, f"node {name} SDID", 0, MAX_SDID)
            for p, s in dm.items()
        }
        sid = nd.get("ServerID")
        if sid is None or str(sid) == "":
            index = sdid_server_id(next(iter(devices.values())))
        else:
            index = _int(sid, f"node {name} ServerID", 0, 1 << 20)
        roce_ip = str(nd.get("RoceIP") or "")
        roce_phy = None
        if roce_ip:
            if not _is_ipv4(roce_ip):
                raise TopologyError(f"node {name}: RoceIP {roce_ip!r} is not an IPv4 address")
            if nd.get("RocePhyId") not in (None, ""):
                roce_phy = _int(nd["RocePhyId"], f"node {name} RocePhyId", 0, MAX_PHY_ID)
                if roce_phy not in devices:
                    raise TopologyError(f"node {name}: RocePhyId {roce_phy} not in its DeviceMap")
        nodes[name] = NodeTopology(name, index, devices, roce_ip, roce_phy)
    planes = None
    if data.get("Planes"):
        raw = data["Planes"]
        if not isinstance(raw, dict):
            raise TopologyError("Planes must be an object {plane id: [phy ids]}")
        planes = {
            _int(k, "plane id", 0, 1 << 16): frozenset(_int(p, "plane phy id", 0, MAX_PHY_ID) for p in v)
            for k, v in raw.items()
        }
    return _check(SuperPod(spid, nodes, planes, version=str(data.get("Version") or "A3")))


def from_nodes(super_pod_id: str | int, nodes: Iterable[NodeTopology]) -> SuperPod:
    """A :class:`SuperPod` from already-split fields (e.g. the agent stream's topology message,
    converted by the service at its edge); planes are not carried.

    Raises :class:`TopologyError` for an empty super pod id, a node without a name or listed twice,
    a phy id outside 0..63 or an SDID outside 0..2^32-1, and everything :func:`parse_super_pod` checks
    (duplicate SDIDs or server indexes, an empty device map).
    """
    if super_pod_id is None or str(super_pod_id) == "":
        raise TopologyError("topology has no super_pod_id")
    out: dict[str, NodeTopology] = {}
    for n in nodes:
        if not n.name:
            raise TopologyError("topology node without a name")
        if n.name in out:
            raise TopologyError(f"node {n.name} listed twice")
        devices = {}
        for phy, sdid in n.devices.items():
            if not 0 <= phy <= MAX_PHY_ID or not 0 <= sdid <= MAX_SDID:
                raise TopologyError(f"node {n.name}: phy {phy} / SDID {sdid} out of range")
            devices[int(phy)] = int(sdid)
        out[n.name] = NodeTopology(n.name, int(n.server_index), devices)
    return _check(SuperPod(str(_int(super_pod_id, "super_pod_id", 0, 65535)), out))


def build_super_pod(
    super_pod_id: str | int,
    node_names: list[str],
    npus_per_node: int = 16,
    first_server_id: int = 1,
    planes: int = 0,
) -> SuperPod:
    """A regular super pod: node k gets server index ``first_server_id + k`` and phys ``0..npus-1``
    with :func:`make_sdid` SDIDs; ``planes`` > 0 assigns phy p to plane ``p % planes``.

    Used by the fabric simulator, tests and benches.
    """
    nodes = {
        name: NodeTopology(
            name,
            first_server_id + k,
            {p: make_sdid(first_server_id + k, p) for p in range(npus_per_node)},
        )
        for k, name in enumerate(node_names)
    }
    plane_map = None
    if planes > 0:
        plane_map = {i: frozenset(p for p in range(npus_per_node) if p % planes == i) for i in range(planes)}
    return _check(SuperPod(str(super_pod_id), nodes, plane_map))
