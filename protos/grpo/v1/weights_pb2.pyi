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
    __slots__ = ("index", "nbytes", "checksum")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    index: int
    nbytes: int
    checksum: str
    def __init__(self, index: _Optional[int] = ..., nbytes: _Optional[int] = ..., checksum: _Optional[str] = ...) -> None: ...

class WeightManifest(_message.Message):
    __slots__ = ("policy_version", "tensors", "buckets", "checksum", "payload_bytes")
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    BUCKETS_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_BYTES_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    tensors: _containers.RepeatedCompositeFieldContainer[TensorSpec]
    buckets: _containers.RepeatedCompositeFieldContainer[BucketSpec]
    checksum: str
    payload_bytes: int
    def __init__(self, policy_version: _Optional[int] = ..., tensors: _Optional[_Iterable[_Union[TensorSpec, _Mapping]]] = ..., buckets: _Optional[_Iterable[_Union[BucketSpec, _Mapping]]] = ..., checksum: _Optional[str] = ..., payload_bytes: _Optional[int] = ...) -> None: ...

class TransferGroup(_message.Message):
    __slots__ = ("store_host", "store_port", "prefix", "world_size", "rank", "backend", "timeout_s")
    STORE_HOST_FIELD_NUMBER: _ClassVar[int]
    STORE_PORT_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    store_host: str
    store_port: int
    prefix: str
    world_size: int
    rank: int
    backend: str
    timeout_s: float
    def __init__(self, store_host: _Optional[str] = ..., store_port: _Optional[int] = ..., prefix: _Optional[str] = ..., world_size: _Optional[int] = ..., rank: _Optional[int] = ..., backend: _Optional[str] = ..., timeout_s: _Optional[float] = ...) -> None: ...
