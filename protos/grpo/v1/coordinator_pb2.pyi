from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RunState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RUN_STATE_UNSPECIFIED: _ClassVar[RunState]
    RUN_STATE_IDLE: _ClassVar[RunState]
    RUN_STATE_RUNNING: _ClassVar[RunState]
    RUN_STATE_DONE: _ClassVar[RunState]
    RUN_STATE_FAILED: _ClassVar[RunState]
    RUN_STATE_STOPPED: _ClassVar[RunState]
RUN_STATE_UNSPECIFIED: RunState
RUN_STATE_IDLE: RunState
RUN_STATE_RUNNING: RunState
RUN_STATE_DONE: RunState
RUN_STATE_FAILED: RunState
RUN_STATE_STOPPED: RunState

class StartRunRequest(_message.Message):
    __slots__ = ("num_steps",)
    NUM_STEPS_FIELD_NUMBER: _ClassVar[int]
    num_steps: int
    def __init__(self, num_steps: _Optional[int] = ...) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ("with_workers",)
    WITH_WORKERS_FIELD_NUMBER: _ClassVar[int]
    with_workers: bool
    def __init__(self, with_workers: _Optional[bool] = ...) -> None: ...

class StopRunRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ScaleRolloutRequest(_message.Message):
    __slots__ = ("num_workers",)
    NUM_WORKERS_FIELD_NUMBER: _ClassVar[int]
    num_workers: int
    def __init__(self, num_workers: _Optional[int] = ...) -> None: ...

class RolloutWorker(_message.Message):
    __slots__ = ("worker_id", "policy_version", "joining", "groups_done", "heartbeat_age_s")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    JOINING_FIELD_NUMBER: _ClassVar[int]
    GROUPS_DONE_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_AGE_S_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    policy_version: int
    joining: bool
    groups_done: int
    heartbeat_age_s: float
    def __init__(self, worker_id: _Optional[str] = ..., policy_version: _Optional[int] = ..., joining: _Optional[bool] = ..., groups_done: _Optional[int] = ..., heartbeat_age_s: _Optional[float] = ...) -> None: ...

class RunStatus(_message.Message):
    __slots__ = ("run_id", "state", "step", "num_steps", "policy_version", "last_metrics", "error", "num_rollout_workers", "rollout_workers")
    class LastMetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    NUM_STEPS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    LAST_METRICS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    NUM_ROLLOUT_WORKERS_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_WORKERS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    state: RunState
    step: int
    num_steps: int
    policy_version: int
    last_metrics: _containers.ScalarMap[str, float]
    error: str
    num_rollout_workers: int
    rollout_workers: _containers.RepeatedCompositeFieldContainer[RolloutWorker]
    def __init__(self, run_id: _Optional[str] = ..., state: _Optional[_Union[RunState, str]] = ..., step: _Optional[int] = ..., num_steps: _Optional[int] = ..., policy_version: _Optional[int] = ..., last_metrics: _Optional[_Mapping[str, float]] = ..., error: _Optional[str] = ..., num_rollout_workers: _Optional[int] = ..., rollout_workers: _Optional[_Iterable[_Union[RolloutWorker, _Mapping]]] = ...) -> None: ...
