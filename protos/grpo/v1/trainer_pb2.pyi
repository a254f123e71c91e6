from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Sequence(_message.Message):
    __slots__ = ("prompt_ids", "response_ids", "rollout_logprobs", "advantage", "trajectory_id", "loss_mask")
    PROMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_IDS_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    ADVANTAGE_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORY_ID_FIELD_NUMBER: _ClassVar[int]
    LOSS_MASK_FIELD_NUMBER: _ClassVar[int]
    prompt_ids: _containers.RepeatedScalarFieldContainer[int]
    response_ids: _containers.RepeatedScalarFieldContainer[int]
    rollout_logprobs: _containers.RepeatedScalarFieldContainer[float]
    advantage: float
    trajectory_id: str
    loss_mask: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, prompt_ids: _Optional[_Iterable[int]] = ..., response_ids: _Optional[_Iterable[int]] = ..., rollout_logprobs: _Optional[_Iterable[float]] = ..., advantage: _Optional[float] = ..., trajectory_id: _Optional[str] = ..., loss_mask: _Optional[_Iterable[bool]] = ...) -> None: ...

class TrainRequest(_message.Message):
    __slots__ = ("step", "sequences", "temperature", "max_tokens")
    STEP_FIELD_NUMBER: _ClassVar[int]
    SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    step: int
    sequences: _containers.RepeatedCompositeFieldContainer[Sequence]
    temperature: float
    max_tokens: int
    def __init__(self, step: _Optional[int] = ..., sequences: _Optional[_Iterable[_Union[Sequence, _Mapping]]] = ..., temperature: _Optional[float] = ..., max_tokens: _Optional[int] = ...) -> None: ...

class TrainReply(_message.Message):
    __slots__ = ("policy_version", "metrics")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    metrics: _containers.ScalarMap[str, float]
    def __init__(self, policy_version: _Optional[int] = ..., metrics: _Optional[_Mapping[str, float]] = ...) -> None: ...

class LogprobsRequest(_message.Message):
    __slots__ = ("sequences", "temperature")
    SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    sequences: _containers.RepeatedCompositeFieldContainer[Sequence]
    temperature: float
    def __init__(self, sequences: _Optional[_Iterable[_Union[Sequence, _Mapping]]] = ..., temperature: _Optional[float] = ...) -> None: ...

class TokenLogprobs(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, values: _Optional[_Iterable[float]] = ...) -> None: ...

class LogprobsReply(_message.Message):
    __slots__ = ("policy_version", "logprobs")
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprobs]
    def __init__(self, policy_version: _Optional[int] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprobs, _Mapping]]] = ...) -> None: ...

class SaveRequest(_message.Message):
    __slots__ = ("path", "weights_only")
    PATH_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_ONLY_FIELD_NUMBER: _ClassVar[int]
    path: str
    weights_only: bool
    def __init__(self, path: _Optional[str] = ..., weights_only: _Optional[bool] = ...) -> None: ...

class SaveReply(_message.Message):
    __slots__ = ("path", "policy_version", "checksums")
    class ChecksumsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PATH_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    CHECKSUMS_FIELD_NUMBER: _ClassVar[int]
    path: str
    policy_version: int
    checksums: _containers.ScalarMap[str, str]
    def __init__(self, path: _Optional[str] = ..., policy_version: _Optional[int] = ..., checksums: _Optional[_Mapping[str, str]] = ...) -> None: ...

class LoadRequest(_message.Message):
    __slots__ = ("path",)
    PATH_FIELD_NUMBER: _ClassVar[int]
    path: str
    def __init__(self, path: _Optional[str] = ...) -> None: ...

class LoadReply(_message.Message):
    __slots__ = ("policy_version",)
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    def __init__(self, policy_version: _Optional[int] = ...) -> None: ...

class PublishWeightsRequest(_message.Message):
    __slots__ = ("timeout_s",)
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    timeout_s: float
    def __init__(self, timeout_s: _Optional[float] = ...) -> None: ...

class PublishWeightsReply(_message.Message):
    __slots__ = ("policy_version", "payload_bytes", "publish_s", "checksum", "num_endpoints", "received_checksums", "num_readback_verified", "gather_s", "apply_s")
    class ReceivedChecksumsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class ApplySEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_BYTES_FIELD_NUMBER: _ClassVar[int]
    PUBLISH_S_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    NUM_ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_CHECKSUMS_FIELD_NUMBER: _ClassVar[int]
    NUM_READBACK_VERIFIED_FIELD_NUMBER: _ClassVar[int]
    GATHER_S_FIELD_NUMBER: _ClassVar[int]
    APPLY_S_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    payload_bytes: int
    publish_s: float
    checksum: str
    num_endpoints: int
    received_checksums: _containers.ScalarMap[str, str]
    num_readback_verified: int
    gather_s: float
    apply_s: _containers.ScalarMap[str, float]
    def __init__(self, policy_version: _Optional[int] = ..., payload_bytes: _Optional[int] = ..., publish_s: _Optional[float] = ..., checksum: _Optional[str] = ..., num_endpoints: _Optional[int] = ..., received_checksums: _Optional[_Mapping[str, str]] = ..., num_readback_verified: _Optional[int] = ..., gather_s: _Optional[float] = ..., apply_s: _Optional[_Mapping[str, float]] = ...) -> None: ...
