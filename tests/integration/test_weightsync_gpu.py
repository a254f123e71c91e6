"""NCCL and CUDA IPC refit paths on the GPU machine (2 GPUs), through the benchmark's two processes."""

from __future__ import annotations

import importlib
import types
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu


def test_nccl_and_cuda_ipc_deliver_verified_buckets(monkeypatch):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    # On sys.path (which spawned children inherit), so the workers unpickle by module name.
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "bench"))
    bench = importlib.import_module("weightsync")
    args = types.SimpleNamespace(shapes=["smoke"], bucket_bytes=[16 * 1024], num_buffers=2, reps=1, link_bytes=2**20)
    raw = bench.run(bench.gpu_worker, args, timeout_s=300)
    errors = {k: v for k, v in raw.items() if not isinstance(v, float)}
    assert not errors, errors  # each path also asserts the receiver's checksums equal the sender's
    assert {"link_GBps", "naive_s/smoke", "nccl_s/smoke/16384", "ipc_s/smoke"} <= set(raw)
