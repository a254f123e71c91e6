from protos.grpo.v1 import weights_pb2 as _weights_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Endpoint(_message.Message):
    __slots__ = ("endpoint_id", "grpc_address", "dtype")
    ENDPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    GRPC_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    endpoint_id: str
    grpc_address: str
    dtype: str
    def __init__(self, endpoint_id: _Optional[str] = ..., grpc_address: _Optional[str] = ..., dtype: _Optional[str] = ...) -> None: ...

class RegisterReply(_message.Message):
    __slots__ = ("policy_version",)
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    def __init__(self, policy_version: _Optional[int] = ...) -> None: ...

class LayoutRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReceiverLayout(_message.Message):
    __slots__ = ("transport", "cast_dtype", "fuse", "num_buffers", "ucxx_host")
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    CAST_DTYPE_FIELD_NUMBER: _ClassVar[int]
    FUSE_FIELD_NUMBER: _ClassVar[int]
    NUM_BUFFERS_FIELD_NUMBER: _ClassVar[int]
    UCXX_HOST_FIELD_NUMBER: _ClassVar[int]
    transport: str
    cast_dtype: str
    fuse: _containers.RepeatedScalarFieldContainer[str]
    num_buffers: int
    ucxx_host: str
    def __init__(self, transport: _Optional[str] = ..., cast_dtype: _Optional[str] = ..., fuse: _Optional[_Iterable[str]] = ..., num_buffers: _Optional[int] = ..., ucxx_host: _Optional[str] = ...) -> None: ...

class PublishRequest(_message.Message):
    __slots__ = ("manifest", "timeout_s", "source", "num_senders")
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    NUM_SENDERS_FIELD_NUMBER: _ClassVar[int]
    manifest: _weights_pb2.WeightManifest
    timeout_s: float
    source: _weights_pb2.DataSource
    num_senders: int
    def __init__(self, manifest: _Optional[_Union[_weights_pb2.WeightManifest, _Mapping]] = ..., timeout_s: _Optional[float] = ..., source: _Optional[_Union[_weights_pb2.DataSource, _Mapping]] = ..., num_senders: _Optional[int] = ...) -> None: ...

class PublishReply(_message.Message):
    __slots__ = ("refit_id", "group", "num_endpoints")
    REFIT_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    NUM_ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    refit_id: str
    group: _weights_pb2.TransferGroup
    num_endpoints: int
    def __init__(self, refit_id: _Optional[str] = ..., group: _Optional[_Union[_weights_pb2.TransferGroup, _Mapping]] = ..., num_endpoints: _Optional[int] = ...) -> None: ...

class AwaitRequest(_message.Message):
    __slots__ = ("refit_id", "timeout_s", "sender_error")
    REFIT_ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    SENDER_ERROR_FIELD_NUMBER: _ClassVar[int]
    refit_id: str
    timeout_s: float
    sender_error: str
    def __init__(self, refit_id: _Optional[str] = ..., timeout_s: _Optional[float] = ..., sender_error: _Optional[str] = ...) -> None: ...

class EndpointResult(_message.Message):
    __slots__ = ("endpoint_id", "ok", "error", "received_checksum", "readback_checksums", "apply_s")
    class ReadbackChecksumsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ENDPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    READBACK_CHECKSUMS_FIELD_NUMBER: _ClassVar[int]
    APPLY_S_FIELD_NUMBER: _ClassVar[int]
    endpoint_id: str
    ok: bool
    error: str
    received_checksum: str
    readback_checksums: _containers.ScalarMap[str, str]
    apply_s: float
    def __init__(self, endpoint_id: _Optional[str] = ..., ok: _Optional[bool] = ..., error: _Optional[str] = ..., received_checksum: _Optional[str] = ..., readback_checksums: _Optional[_Mapping[str, str]] = ..., apply_s: _Optional[float] = ...) -> None: ...

class AwaitReply(_message.Message):
    __slots__ = ("policy_version", "results")
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    results: _containers.RepeatedCompositeFieldContainer[EndpointResult]
    def __init__(self, policy_version: _Optional[int] = ..., results: _Optional[_Iterable[_Union[EndpointResult, _Mapping]]] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EndpointStatus(_message.Message):
    __slots__ = ("endpoint_id", "grpc_address", "applied_version", "last_error")
    ENDPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    GRPC_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    APPLIED_VERSION_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    endpoint_id: str
    grpc_address: str
    applied_version: int
    last_error: str
    def __init__(self, endpoint_id: _Optional[str] = ..., grpc_address: _Optional[str] = ..., applied_version: _Optional[int] = ..., last_error: _Optional[str] = ...) -> None: ...

class StatusReply(_message.Message):
    __slots__ = ("policy_version", "endpoints")
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    endpoints: _containers.RepeatedCompositeFieldContainer[EndpointStatus]
    def __init__(self, policy_version: _Optional[int] = ..., endpoints: _Optional[_Iterable[_Union[EndpointStatus, _Mapping]]] = ...) -> None: ...
