from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TensorSpec(_message.Message):
    __slots__ = ("name", "dtype", "shape", "bucket", "offset", "nbytes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    BUCKET_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    bucket: int
    offset: int
    nbytes: int
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., bucket: _Optional[int] = ..., offset: _Optional[int] = ..., nbytes: _Optional[int] = ...) -> None: ...

class BucketSpec(_message.Message):
    __slots__ = ("index", "nbytes", "sender")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    index: int
    nbytes: int
    sender: int
    def __init__(self, index: _Optional[int] = ..., nbytes: _Optional[int] = ..., sender: _Optional[int] = ...) -> None: ...

class WeightManifest(_message.Message):
    __slots__ = ("policy_version", "tensors", "buckets", "payload_bytes", "checksum_algo", "signature")
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    BUCKETS_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_ALGO_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    tensors: _containers.RepeatedCompositeFieldContainer[TensorSpec]
    buckets: _containers.RepeatedCompositeFieldContainer[BucketSpec]
    payload_bytes: int
    checksum_algo: str
    signature: bytes
    def __init__(self, policy_version: _Optional[int] = ..., tensors: _Optional[_Iterable[_Union[TensorSpec, _Mapping]]] = ..., buckets: _Optional[_Iterable[_Union[BucketSpec, _Mapping]]] = ..., payload_bytes: _Optional[int] = ..., checksum_algo: _Optional[str] = ..., signature: _Optional[bytes] = ...) -> None: ...

class TransferGroup(_message.Message):
    __slots__ = ("store_host", "store_port", "prefix", "world_size", "rank", "backend", "timeout_s", "num_senders")
    STORE_HOST_FIELD_NUMBER: _ClassVar[int]
    STORE_PORT_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    NUM_SENDERS_FIELD_NUMBER: _ClassVar[int]
    store_host: str
    store_port: int
    prefix: str
    world_size: int
    rank: int
    backend: str
    timeout_s: float
    num_senders: int
    def __init__(self, store_host: _Optional[str] = ..., store_port: _Optional[int] = ..., prefix: _Optional[str] = ..., world_size: _Optional[int] = ..., rank: _Optional[int] = ..., backend: _Optional[str] = ..., timeout_s: _Optional[float] = ..., num_senders: _Optional[int] = ...) -> None: ...

class CudaIpcBuffer(_message.Message):
    __slots__ = ("device_uuid", "handle", "storage_size_bytes", "storage_offset_bytes", "ref_counter_handle", "ref_counter_offset", "event_handle", "event_sync_required", "nbytes")
    DEVICE_UUID_FIELD_NUMBER: _ClassVar[int]
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    STORAGE_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    STORAGE_OFFSET_BYTES_FIELD_NUMBER: _ClassVar[int]
    REF_COUNTER_HANDLE_FIELD_NUMBER: _ClassVar[int]
    REF_COUNTER_OFFSET_FIELD_NUMBER: _ClassVar[int]
    EVENT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    EVENT_SYNC_REQUIRED_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    device_uuid: str
    handle: bytes
    storage_size_bytes: int
    storage_offset_bytes: int
    ref_counter_handle: bytes
    ref_counter_offset: int
    event_handle: bytes
    event_sync_required: bool
    nbytes: int
    def __init__(self, device_uuid: _Optional[str] = ..., handle: _Optional[bytes] = ..., storage_size_bytes: _Optional[int] = ..., storage_offset_bytes: _Optional[int] = ..., ref_counter_handle: _Optional[bytes] = ..., ref_counter_offset: _Optional[int] = ..., event_handle: _Optional[bytes] = ..., event_sync_required: _Optional[bool] = ..., nbytes: _Optional[int] = ...) -> None: ...

class DataSource(_message.Message):
    __slots__ = ("sender_id", "ucxx_address", "ipc_buffers")
    SENDER_ID_FIELD_NUMBER: _ClassVar[int]
    UCXX_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    IPC_BUFFERS_FIELD_NUMBER: _ClassVar[int]
    sender_id: str
    ucxx_address: str
    ipc_buffers: _containers.RepeatedCompositeFieldContainer[CudaIpcBuffer]
    def __init__(self, sender_id: _Optional[str] = ..., ucxx_address: _Optional[str] = ..., ipc_buffers: _Optional[_Iterable[_Union[CudaIpcBuffer, _Mapping]]] = ...) -> None: ...
