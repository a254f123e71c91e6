"""weightsync: how a refit moves the weights."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from .base import _Section


class WeightsyncSection(_Section):
    host: str = "127.0.0.1"
    """Interface of the control service and of the transfer rendezvous store."""
    grpc_port: int = Field(default=0, ge=0, le=65535)
    """gRPC control port; 0 = a free port chosen at launch."""
    store_port: int = Field(default=0, ge=0, le=65535)
    """TCPStore port for transfer-group rendezvous; 0 = a free port chosen at launch."""
    bucket_bytes: int = Field(default=0, ge=0)
    """Bytes per transfer bucket; 0 = by the transport's device (bucket_bytes_for). On a GPU each bucket costs a
    hand-off, so larger buckets refit faster; on CPU smaller ones pipeline packing, gloo and hashing (the figures:
    bench/README.md, weightsync). The sender's ring holds num_buffers."""
    timeout_s: float = Field(default=120.0, gt=0)
    """Deadline of one refit, rendezvous included."""
    transport: Literal["auto", "gloo", "nccl", "cuda_ipc", "ucxx"] = "auto"
    """Data plane of a refit: auto = nccl with a GPU, gloo without; cuda_ipc when trainer and rollout share
    one GPU; ucxx when workers join mid-run (they pull the current version from the trainer by themselves)."""
    num_buffers: int = Field(default=2, ge=1, le=4)
    """Bucket buffers in flight on the sender: packing bucket i+1 overlaps sending bucket i. cuda_ipc ignores it:
    its ring holds the whole version (one buffer per bucket), which receivers read in place."""
    cast_dtype: Literal["", "bfloat16", "float16", "float32"] = ""
    """Dtype of floating tensors on the wire, cast on the sender (e.g. fp32 master -> bf16); "" = the dtype the
    rollout engines registered (bf16 on GPU, fp32 on CPU). Setting it also casts in the trainer's gather."""
    fuse: list[Literal["qkv", "gate_up"]] = []
    """Projections the engine wants fused, done on the sender (vLLM takes HF names and fuses itself: keep empty)."""
    all_ranks_send: bool = True
    """With gloo or nccl and several FSDP2 ranks, every rank gathers and sends its own run of buckets (no rank-0
    funnel: no rank holds more than its share of the full weights); false: rank 0 gathers and sends them all."""
    ucxx_host: str = "127.0.0.1"
    """Address the trainer's ucxx listener binds to and rollout workers reach (transport = ucxx)."""

    @field_validator("bucket_bytes")
    @classmethod
    def _bucket_floor(cls, v: int) -> int:
        if 0 < v < 2**10:
            raise ValueError(f"weightsync.bucket_bytes must be 0 (by device) or >= 1024, got {v}")
        return v

    def bucket_bytes_for(self, device_type: str) -> int:
        """bucket_bytes, or where it is 0: 256 MiB for a GPU transport, 32 MiB for a host one."""
        return self.bucket_bytes or (256 * 2**20 if device_type == "cuda" else 32 * 2**20)
