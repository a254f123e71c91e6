"""NCCL and CUDA IPC refit paths on the GPU machine, through the benchmark's two processes."""

from __future__ import annotations

import importlib
import types
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu


def _bench(monkeypatch):
    # On sys.path (which spawned children inherit), so the workers unpickle by module name.
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "bench"))
    return importlib.import_module("weightsync")


def _run(bench, ipc_only: bool, bucket_bytes: list[int]) -> dict:
    args = types.SimpleNamespace(
        shapes=["smoke"], bucket_bytes=bucket_bytes, num_buffers=2, reps=1, link_bytes=2**20, ipc_only=ipc_only,
        transfer_timeout_s=60,
    )  # fmt: skip
    raw = bench.run(bench.gpu_worker, args, timeout_s=240)  # a stuck step fails its deadline first, both sides
    errors = {k: v for k, v in raw.items() if not isinstance(v, float)}
    assert not errors, errors  # each path also asserts the receiver's checksums equal the sender's
    return raw


def test_nccl_and_cuda_ipc_deliver_verified_buckets(monkeypatch):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    raw = _run(_bench(monkeypatch), ipc_only=False, bucket_bytes=[16 * 1024])
    assert {"link_GBps", "naive_s/smoke", "nccl_s/smoke/16384", "ipc_s/smoke/16384", "copy_s/smoke"} <= set(raw)


def test_cuda_ipc_on_one_gpu_delivers_verified_buckets_into_the_engine_tensors(monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    raw = _run(_bench(monkeypatch), ipc_only=True, bucket_bytes=[16 * 1024, 2**30])  # many buckets, and one
    assert {"ipc_s/smoke/16384", "ipc_receive_s/smoke/16384", f"ipc_s/smoke/{2**30}", "copy_s/smoke"} <= set(raw)
