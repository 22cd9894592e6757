from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ProfilingClientInfo(_message.Message):
    __slots__ = ("jobId", "role")
    JOBID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    jobId: str
    role: str
    def __init__(self, jobId: _Optional[str] = ..., role: _Optional[str] = ...) -> None: ...

class ProfilingSwitch(_message.Message):
    __slots__ = ("CommunicationOperator", "Step", "SaveCheckpoint", "FP", "DataLoader")
    COMMUNICATIONOPERATOR_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    SAVECHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    FP_FIELD_NUMBER: _ClassVar[int]
    DATALOADER_FIELD_NUMBER: _ClassVar[int]
    CommunicationOperator: str
    Step: str
    SaveCheckpoint: str
    FP: str
    DataLoader: str
    def __init__(self, CommunicationOperator: _Optional[str] = ..., Step: _Optional[str] = ..., SaveCheckpoint: _Optional[str] = ..., FP: _Optional[str] = ..., DataLoader: _Optional[str] = ...) -> None: ...

class DataStatusReq(_message.Message):
    __slots__ = ("jobNsName",)
    JOBNSNAME_FIELD_NUMBER: _ClassVar[int]
    jobNsName: str
    def __init__(self, jobNsName: _Optional[str] = ...) -> None: ...

class DataStatusRes(_message.Message):
    __slots__ = ("message", "profilingSwitch", "code")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PROFILINGSWITCH_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    message: str
    profilingSwitch: ProfilingSwitch
    code: int
    def __init__(self, message: _Optional[str] = ..., profilingSwitch: _Optional[_Union[ProfilingSwitch, _Mapping]] = ..., code: _Optional[int] = ...) -> None: ...

class DataTypeReq(_message.Message):
    __slots__ = ("jobNsName", "profilingSwitch")
    JOBNSNAME_FIELD_NUMBER: _ClassVar[int]
    PROFILINGSWITCH_FIELD_NUMBER: _ClassVar[int]
    jobNsName: str
    profilingSwitch: ProfilingSwitch
    def __init__(self, jobNsName: _Optional[str] = ..., profilingSwitch: _Optional[_Union[ProfilingSwitch, _Mapping]] = ...) -> None: ...

class DataTypeRes(_message.Message):
    __slots__ = ("message", "code")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    message: str
    code: int
    def __init__(self, message: _Optional[str] = ..., code: _Optional[int] = ...) -> None: ...
