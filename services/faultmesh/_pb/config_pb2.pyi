from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class ClientInfo(_message.Message):
    __slots__ = ("jobId", "role")
    JOBID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    jobId: str
    role: str
    def __init__(self, jobId: _Optional[str] = ..., role: _Optional[str] = ...) -> None: ...

class Status(_message.Message):
    __slots__ = ("code", "info")
    CODE_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    code: int
    info: str
    def __init__(self, code: _Optional[int] = ..., info: _Optional[str] = ...) -> None: ...

class RankTableStream(_message.Message):
    __slots__ = ("jobId", "rankTable")
    JOBID_FIELD_NUMBER: _ClassVar[int]
    RANKTABLE_FIELD_NUMBER: _ClassVar[int]
    jobId: str
    rankTable: str
    def __init__(self, jobId: _Optional[str] = ..., rankTable: _Optional[str] = ...) -> None: ...
