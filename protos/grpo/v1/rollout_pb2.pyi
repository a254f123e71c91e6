from protos.grpo.v1 import weights_pb2 as _weights_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class InfoReply(_message.Message):
    __slots__ = ("worker_id", "engine", "policy_version", "num_groups_done")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    NUM_GROUPS_DONE_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    engine: str
    policy_version: int
    num_groups_done: int
    def __init__(self, worker_id: _Optional[str] = ..., engine: _Optional[str] = ..., policy_version: _Optional[int] = ..., num_groups_done: _Optional[int] = ...) -> None: ...

class LoadWeightsRequest(_message.Message):
    __slots__ = ("manifest", "group", "source", "refit_id")
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    REFIT_ID_FIELD_NUMBER: _ClassVar[int]
    manifest: _weights_pb2.WeightManifest
    group: _weights_pb2.TransferGroup
    source: _weights_pb2.DataSource
    refit_id: str
    def __init__(self, manifest: _Optional[_Union[_weights_pb2.WeightManifest, _Mapping]] = ..., group: _Optional[_Union[_weights_pb2.TransferGroup, _Mapping]] = ..., source: _Optional[_Union[_weights_pb2.DataSource, _Mapping]] = ..., refit_id: _Optional[str] = ...) -> None: ...

class LoadWeightsReply(_message.Message):
    __slots__ = ("policy_version", "received_checksum", "readback_checksums", "apply_s")
    class ReadbackChecksumsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    READBACK_CHECKSUMS_FIELD_NUMBER: _ClassVar[int]
    APPLY_S_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    received_checksum: str
    readback_checksums: _containers.ScalarMap[str, str]
    apply_s: float
    def __init__(self, policy_version: _Optional[int] = ..., received_checksum: _Optional[str] = ..., readback_checksums: _Optional[_Mapping[str, str]] = ..., apply_s: _Optional[float] = ...) -> None: ...
