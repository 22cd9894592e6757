from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DigestResult(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DIGEST_UNCHECKED: _ClassVar[DigestResult]
    DIGEST_MATCH: _ClassVar[DigestResult]
    DIGEST_MISMATCH: _ClassVar[DigestResult]
DIGEST_UNCHECKED: DigestResult
DIGEST_MATCH: DigestResult
DIGEST_MISMATCH: DigestResult

class Fault(_message.Message):
    __slots__ = ("source", "node", "device_type", "device_id", "code", "level", "assertion", "first_seen_ms", "last_seen_ms", "attributes")
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_TYPE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    ASSERTION_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEEN_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_MS_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    source: str
    node: str
    device_type: str
    device_id: int
    code: str
    level: str
    assertion: str
    first_seen_ms: int
    last_seen_ms: int
    attributes: _containers.ScalarMap[str, str]
    def __init__(self, source: _Optional[str] = ..., node: _Optional[str] = ..., device_type: _Optional[str] = ..., device_id: _Optional[int] = ..., code: _Optional[str] = ..., level: _Optional[str] = ..., assertion: _Optional[str] = ..., first_seen_ms: _Optional[int] = ..., last_seen_ms: _Optional[int] = ..., attributes: _Optional[_Mapping[str, str]] = ...) -> None: ...

class FaultKey(_message.Message):
    __slots__ = ("source", "device_type", "device_id", "code")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_TYPE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    source: str
    device_type: str
    device_id: int
    code: str
    def __init__(self, source: _Optional[str] = ..., device_type: _Optional[str] = ..., device_id: _Optional[int] = ..., code: _Optional[str] = ...) -> None: ...

class Condition(_message.Message):
    __slots__ = ("type", "active", "reason", "message", "since_ms")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    SINCE_MS_FIELD_NUMBER: _ClassVar[int]
    type: str
    active: bool
    reason: str
    message: str
    since_ms: int
    def __init__(self, type: _Optional[str] = ..., active: _Optional[bool] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., since_ms: _Optional[int] = ...) -> None: ...

class DeviceState(_message.Message):
    __slots__ = ("device_type", "device_id", "phy_id", "health", "network_health", "level", "super_pod_id", "server_index")
    DEVICE_TYPE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    PHY_ID_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    NETWORK_HEALTH_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    SUPER_POD_ID_FIELD_NUMBER: _ClassVar[int]
    SERVER_INDEX_FIELD_NUMBER: _ClassVar[int]
    device_type: str
    device_id: int
    phy_id: int
    health: str
    network_health: str
    level: str
    super_pod_id: int
    server_index: int
    def __init__(self, device_type: _Optional[str] = ..., device_id: _Optional[int] = ..., phy_id: _Optional[int] = ..., health: _Optional[str] = ..., network_health: _Optional[str] = ..., level: _Optional[str] = ..., super_pod_id: _Optional[int] = ..., server_index: _Optional[int] = ...) -> None: ...

class PingResult(_message.Message):
    __slots__ = ("ping_task_id", "src_type", "src_addr", "dst_type", "dst_addr", "min_delay", "max_delay", "avg_delay", "min_loss_rate", "max_loss_rate", "avg_loss_rate", "timestamp_ms", "super_pod_id", "src_phy_id")
    PING_TASK_ID_FIELD_NUMBER: _ClassVar[int]
    SRC_TYPE_FIELD_NUMBER: _ClassVar[int]
    SRC_ADDR_FIELD_NUMBER: _ClassVar[int]
    DST_TYPE_FIELD_NUMBER: _ClassVar[int]
    DST_ADDR_FIELD_NUMBER: _ClassVar[int]
    MIN_DELAY_FIELD_NUMBER: _ClassVar[int]
    MAX_DELAY_FIELD_NUMBER: _ClassVar[int]
    AVG_DELAY_FIELD_NUMBER: _ClassVar[int]
    MIN_LOSS_RATE_FIELD_NUMBER: _ClassVar[int]
    MAX_LOSS_RATE_FIELD_NUMBER: _ClassVar[int]
    AVG_LOSS_RATE_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    SUPER_POD_ID_FIELD_NUMBER: _ClassVar[int]
    SRC_PHY_ID_FIELD_NUMBER: _ClassVar[int]
    ping_task_id: int
    src_type: str
    src_addr: str
    dst_type: str
    dst_addr: str
    min_delay: float
    max_delay: float
    avg_delay: float
    min_loss_rate: float
    max_loss_rate: float
    avg_loss_rate: float
    timestamp_ms: int
    super_pod_id: str
    src_phy_id: int
    def __init__(self, ping_task_id: _Optional[int] = ..., src_type: _Optional[str] = ..., src_addr: _Optional[str] = ..., dst_type: _Optional[str] = ..., dst_addr: _Optional[str] = ..., min_delay: _Optional[float] = ..., max_delay: _Optional[float] = ..., avg_delay: _Optional[float] = ..., min_loss_rate: _Optional[float] = ..., max_loss_rate: _Optional[float] = ..., avg_loss_rate: _Optional[float] = ..., timestamp_ms: _Optional[int] = ..., super_pod_id: _Optional[str] = ..., src_phy_id: _Optional[int] = ...) -> None: ...

class SlowNodeReport(_message.Message):
    __slots__ = ("job_id", "node", "result_json", "timestamp_ms")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    RESULT_JSON_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    node: str
    result_json: bytes
    timestamp_ms: int
    def __init__(self, job_id: _Optional[str] = ..., node: _Optional[str] = ..., result_json: _Optional[bytes] = ..., timestamp_ms: _Optional[int] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("node", "agent", "boot_id", "version", "node_ip", "node_sn", "labels", "snapshot_digest", "claim_seq")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NODE_FIELD_NUMBER: _ClassVar[int]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    NODE_IP_FIELD_NUMBER: _ClassVar[int]
    NODE_SN_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_DIGEST_FIELD_NUMBER: _ClassVar[int]
    CLAIM_SEQ_FIELD_NUMBER: _ClassVar[int]
    node: str
    agent: str
    boot_id: str
    version: str
    node_ip: str
    node_sn: str
    labels: _containers.ScalarMap[str, str]
    snapshot_digest: bytes
    claim_seq: int
    def __init__(self, node: _Optional[str] = ..., agent: _Optional[str] = ..., boot_id: _Optional[str] = ..., version: _Optional[str] = ..., node_ip: _Optional[str] = ..., node_sn: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., snapshot_digest: _Optional[bytes] = ..., claim_seq: _Optional[int] = ...) -> None: ...

class Snapshot(_message.Message):
    __slots__ = ("seq", "faults", "conditions", "devices", "node_status", "pending_sources", "digest", "part", "parts")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    FAULTS_FIELD_NUMBER: _ClassVar[int]
    CONDITIONS_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    NODE_STATUS_FIELD_NUMBER: _ClassVar[int]
    PENDING_SOURCES_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    PART_FIELD_NUMBER: _ClassVar[int]
    PARTS_FIELD_NUMBER: _ClassVar[int]
    seq: int
    faults: _containers.RepeatedCompositeFieldContainer[Fault]
    conditions: _containers.RepeatedCompositeFieldContainer[Condition]
    devices: _containers.RepeatedCompositeFieldContainer[DeviceState]
    node_status: str
    pending_sources: _containers.RepeatedScalarFieldContainer[str]
    digest: bytes
    part: int
    parts: int
    def __init__(self, seq: _Optional[int] = ..., faults: _Optional[_Iterable[_Union[Fault, _Mapping]]] = ..., conditions: _Optional[_Iterable[_Union[Condition, _Mapping]]] = ..., devices: _Optional[_Iterable[_Union[DeviceState, _Mapping]]] = ..., node_status: _Optional[str] = ..., pending_sources: _Optional[_Iterable[str]] = ..., digest: _Optional[bytes] = ..., part: _Optional[int] = ..., parts: _Optional[int] = ...) -> None: ...

class Delta(_message.Message):
    __slots__ = ("seq", "upserts", "removals", "conditions", "devices", "ping_results", "slownode_reports", "node_status", "snapshot_digest")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    UPSERTS_FIELD_NUMBER: _ClassVar[int]
    REMOVALS_FIELD_NUMBER: _ClassVar[int]
    CONDITIONS_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    PING_RESULTS_FIELD_NUMBER: _ClassVar[int]
    SLOWNODE_REPORTS_FIELD_NUMBER: _ClassVar[int]
    NODE_STATUS_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_DIGEST_FIELD_NUMBER: _ClassVar[int]
    seq: int
    upserts: _containers.RepeatedCompositeFieldContainer[Fault]
    removals: _containers.RepeatedCompositeFieldContainer[FaultKey]
    conditions: _containers.RepeatedCompositeFieldContainer[Condition]
    devices: _containers.RepeatedCompositeFieldContainer[DeviceState]
    ping_results: _containers.RepeatedCompositeFieldContainer[PingResult]
    slownode_reports: _containers.RepeatedCompositeFieldContainer[SlowNodeReport]
    node_status: str
    snapshot_digest: bytes
    def __init__(self, seq: _Optional[int] = ..., upserts: _Optional[_Iterable[_Union[Fault, _Mapping]]] = ..., removals: _Optional[_Iterable[_Union[FaultKey, _Mapping]]] = ..., conditions: _Optional[_Iterable[_Union[Condition, _Mapping]]] = ..., devices: _Optional[_Iterable[_Union[DeviceState, _Mapping]]] = ..., ping_results: _Optional[_Iterable[_Union[PingResult, _Mapping]]] = ..., slownode_reports: _Optional[_Iterable[_Union[SlowNodeReport, _Mapping]]] = ..., node_status: _Optional[str] = ..., snapshot_digest: _Optional[bytes] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("seq", "error", "digest")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    seq: int
    error: str
    digest: DigestResult
    def __init__(self, seq: _Optional[int] = ..., error: _Optional[str] = ..., digest: _Optional[_Union[DigestResult, str]] = ...) -> None: ...

class AgentMessage(_message.Message):
    __slots__ = ("hello", "snapshot", "delta", "ack")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    snapshot: Snapshot
    delta: Delta
    ack: Ack
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., snapshot: _Optional[_Union[Snapshot, _Mapping]] = ..., delta: _Optional[_Union[Delta, _Mapping]] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ...) -> None: ...

class PingmeshActivation(_message.Message):
    __slots__ = ("activate", "task_interval_s")
    ACTIVATE_FIELD_NUMBER: _ClassVar[int]
    TASK_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    activate: bool
    task_interval_s: int
    def __init__(self, activate: _Optional[bool] = ..., task_interval_s: _Optional[int] = ...) -> None: ...

class PingmeshConfig(_message.Message):
    __slots__ = ("activations",)
    class ActivationsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: PingmeshActivation
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[PingmeshActivation, _Mapping]] = ...) -> None: ...
    ACTIVATIONS_FIELD_NUMBER: _ClassVar[int]
    activations: _containers.MessageMap[str, PingmeshActivation]
    def __init__(self, activations: _Optional[_Mapping[str, PingmeshActivation]] = ...) -> None: ...

class TopologyNode(_message.Message):
    __slots__ = ("node_name", "server_index", "phy_id_to_sdid")
    class PhyIdToSdidEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    NODE_NAME_FIELD_NUMBER: _ClassVar[int]
    SERVER_INDEX_FIELD_NUMBER: _ClassVar[int]
    PHY_ID_TO_SDID_FIELD_NUMBER: _ClassVar[int]
    node_name: str
    server_index: int
    phy_id_to_sdid: _containers.ScalarMap[int, int]
    def __init__(self, node_name: _Optional[str] = ..., server_index: _Optional[int] = ..., phy_id_to_sdid: _Optional[_Mapping[int, int]] = ...) -> None: ...

class SuperPodTopology(_message.Message):
    __slots__ = ("super_pod_id", "nodes")
    SUPER_POD_ID_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    super_pod_id: str
    nodes: _containers.RepeatedCompositeFieldContainer[TopologyNode]
    def __init__(self, super_pod_id: _Optional[str] = ..., nodes: _Optional[_Iterable[_Union[TopologyNode, _Mapping]]] = ...) -> None: ...

class PingTask(_message.Message):
    __slots__ = ("src_phy_id", "dst_addrs")
    SRC_PHY_ID_FIELD_NUMBER: _ClassVar[int]
    DST_ADDRS_FIELD_NUMBER: _ClassVar[int]
    src_phy_id: int
    dst_addrs: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, src_phy_id: _Optional[int] = ..., dst_addrs: _Optional[_Iterable[str]] = ...) -> None: ...

class PingList(_message.Message):
    __slots__ = ("super_pod_id", "tasks", "uid")
    SUPER_POD_ID_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    super_pod_id: str
    tasks: _containers.RepeatedCompositeFieldContainer[PingTask]
    uid: str
    def __init__(self, super_pod_id: _Optional[str] = ..., tasks: _Optional[_Iterable[_Union[PingTask, _Mapping]]] = ..., uid: _Optional[str] = ...) -> None: ...

class RankPlacement(_message.Message):
    __slots__ = ("rank", "node", "device_id")
    RANK_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    rank: int
    node: str
    device_id: int
    def __init__(self, rank: _Optional[int] = ..., node: _Optional[str] = ..., device_id: _Optional[int] = ...) -> None: ...

class JobInfo(_message.Message):
    __slots__ = ("job_id", "name", "namespace", "ranks", "deleted", "process_recover_enable", "recover_strategy")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    PROCESS_RECOVER_ENABLE_FIELD_NUMBER: _ClassVar[int]
    RECOVER_STRATEGY_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    name: str
    namespace: str
    ranks: _containers.RepeatedCompositeFieldContainer[RankPlacement]
    deleted: bool
    process_recover_enable: str
    recover_strategy: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, job_id: _Optional[str] = ..., name: _Optional[str] = ..., namespace: _Optional[str] = ..., ranks: _Optional[_Iterable[_Union[RankPlacement, _Mapping]]] = ..., deleted: _Optional[bool] = ..., process_recover_enable: _Optional[str] = ..., recover_strategy: _Optional[_Iterable[str]] = ...) -> None: ...

class SlowNodeJob(_message.Message):
    __slots__ = ("job_id", "job_name", "namespace", "enable", "featconf_json", "ranks")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_NAME_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ENABLE_FIELD_NUMBER: _ClassVar[int]
    FEATCONF_JSON_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    job_name: str
    namespace: str
    enable: bool
    featconf_json: bytes
    ranks: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, job_id: _Optional[str] = ..., job_name: _Optional[str] = ..., namespace: _Optional[str] = ..., enable: _Optional[bool] = ..., featconf_json: _Optional[bytes] = ..., ranks: _Optional[_Iterable[int]] = ...) -> None: ...

class ReleaseDevice(_message.Message):
    __slots__ = ("phy_id", "seen_until_ms")
    PHY_ID_FIELD_NUMBER: _ClassVar[int]
    SEEN_UNTIL_MS_FIELD_NUMBER: _ClassVar[int]
    phy_id: int
    seen_until_ms: int
    def __init__(self, phy_id: _Optional[int] = ..., seen_until_ms: _Optional[int] = ...) -> None: ...

class DataTraceSwitch(_message.Message):
    __slots__ = ("job_ns_name", "communication_operator", "step", "save_checkpoint", "fp", "data_loader")
    JOB_NS_NAME_FIELD_NUMBER: _ClassVar[int]
    COMMUNICATION_OPERATOR_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    SAVE_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    FP_FIELD_NUMBER: _ClassVar[int]
    DATA_LOADER_FIELD_NUMBER: _ClassVar[int]
    job_ns_name: str
    communication_operator: str
    step: str
    save_checkpoint: str
    fp: str
    data_loader: str
    def __init__(self, job_ns_name: _Optional[str] = ..., communication_operator: _Optional[str] = ..., step: _Optional[str] = ..., save_checkpoint: _Optional[str] = ..., fp: _Optional[str] = ..., data_loader: _Optional[str] = ...) -> None: ...

class ControlMessage(_message.Message):
    __slots__ = ("seq", "ack", "pingmesh_config", "topology", "ping_list", "job", "slownode_job", "data_trace", "release")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    PINGMESH_CONFIG_FIELD_NUMBER: _ClassVar[int]
    TOPOLOGY_FIELD_NUMBER: _ClassVar[int]
    PING_LIST_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    SLOWNODE_JOB_FIELD_NUMBER: _ClassVar[int]
    DATA_TRACE_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    seq: int
    ack: Ack
    pingmesh_config: PingmeshConfig
    topology: SuperPodTopology
    ping_list: PingList
    job: JobInfo
    slownode_job: SlowNodeJob
    data_trace: DataTraceSwitch
    release: ReleaseDevice
    def __init__(self, seq: _Optional[int] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ..., pingmesh_config: _Optional[_Union[PingmeshConfig, _Mapping]] = ..., topology: _Optional[_Union[SuperPodTopology, _Mapping]] = ..., ping_list: _Optional[_Union[PingList, _Mapping]] = ..., job: _Optional[_Union[JobInfo, _Mapping]] = ..., slownode_job: _Optional[_Union[SlowNodeJob, _Mapping]] = ..., data_trace: _Optional[_Union[DataTraceSwitch, _Mapping]] = ..., release: _Optional[_Union[ReleaseDevice, _Mapping]] = ...) -> None: ...
