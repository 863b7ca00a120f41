from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Table(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TABLE_UNSPECIFIED: _ClassVar[Table]
    JOBS: _ClassVar[Table]
    RANKS: _ClassVar[Table]
    STEPS: _ClassVar[Table]
    PHASES: _ClassVar[Table]
    COLLECTIVES: _ClassVar[Table]
    KERNEL_SUMMARIES: _ClassVar[Table]
    KERNEL_EVENTS: _ClassVar[Table]
    HOST_SAMPLES: _ClassVar[Table]
TABLE_UNSPECIFIED: Table
JOBS: Table
RANKS: Table
STEPS: Table
PHASES: Table
COLLECTIVES: Table
KERNEL_SUMMARIES: Table
KERNEL_EVENTS: Table
HOST_SAMPLES: Table

class Batch(_message.Message):
    __slots__ = ("agent_id", "seq", "job_id", "table", "arrow_ipc", "dropped_events", "clock_offset_ns")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    ARROW_IPC_FIELD_NUMBER: _ClassVar[int]
    DROPPED_EVENTS_FIELD_NUMBER: _ClassVar[int]
    CLOCK_OFFSET_NS_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    seq: int
    job_id: str
    table: Table
    arrow_ipc: bytes
    dropped_events: int
    clock_offset_ns: int
    def __init__(self, agent_id: _Optional[str] = ..., seq: _Optional[int] = ..., job_id: _Optional[str] = ..., table: _Optional[_Union[Table, str]] = ..., arrow_ipc: _Optional[bytes] = ..., dropped_events: _Optional[int] = ..., clock_offset_ns: _Optional[int] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("seq", "status", "code", "message", "rows")
    class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STATUS_UNSPECIFIED: _ClassVar[Ack.Status]
        STORED: _ClassVar[Ack.Status]
        DUPLICATE: _ClassVar[Ack.Status]
        REJECTED: _ClassVar[Ack.Status]
    STATUS_UNSPECIFIED: Ack.Status
    STORED: Ack.Status
    DUPLICATE: Ack.Status
    REJECTED: Ack.Status
    SEQ_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    seq: int
    status: Ack.Status
    code: str
    message: str
    rows: int
    def __init__(self, seq: _Optional[int] = ..., status: _Optional[_Union[Ack.Status, str]] = ..., code: _Optional[str] = ..., message: _Optional[str] = ..., rows: _Optional[int] = ...) -> None: ...

class ClockRequest(_message.Message):
    __slots__ = ("agent_send_ns",)
    AGENT_SEND_NS_FIELD_NUMBER: _ClassVar[int]
    agent_send_ns: int
    def __init__(self, agent_send_ns: _Optional[int] = ...) -> None: ...

class ClockReply(_message.Message):
    __slots__ = ("agent_send_ns", "server_ns")
    AGENT_SEND_NS_FIELD_NUMBER: _ClassVar[int]
    SERVER_NS_FIELD_NUMBER: _ClassVar[int]
    agent_send_ns: int
    server_ns: int
    def __init__(self, agent_send_ns: _Optional[int] = ..., server_ns: _Optional[int] = ...) -> None: ...
