"""bench/weightsync.py's CPU paths through its two processes (gloo, verified refits): the script the GPU
numbers come from keeps working where CI runs."""

from __future__ import annotations

import importlib
import types
from pathlib import Path


def test_the_refit_benchmark_runs_verified_gloo_refits_on_cpu(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "bench"))
    bench = importlib.import_module("weightsync")
    args = types.SimpleNamespace(
        shapes=["smoke"], bucket_bytes=[16 * 1024], num_buffers=2, reps=2, link_bytes=2**20, smoke=True,
        transfer_timeout_s=60,
    )  # fmt: skip
    raw = bench.run(bench.cpu_worker, args, timeout_s=240)
    # `ours` asserts the receiver's checksums equal the sender's commit, then that the engine's tensors
    # equal the sender's, on every repetition: an error here is a wrong or lost byte, or a stuck step.
    assert not [k for k, v in raw.items() if not isinstance(v, float)], raw
    assert {"socket_GBps", "link_GBps", "naive_s/smoke", "gloo_s/smoke"} <= set(raw)
