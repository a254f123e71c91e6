"""Bucket checksum speed on this host, one core, per algorithm of services/weightsync/kernels/checksum.py.

.venv/bin/python bench/checksums.py          # writes bench/results/checksums/checksums_cpu.json
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from provenance import write_result  # noqa: E402 - bench/ is this script's own folder

from services.weightsync.kernels import checksum as cs  # noqa: E402


def main() -> int:
    torch.set_num_threads(1)
    buf = torch.randint(0, 256, (256 << 20,), dtype=torch.uint8)  # one 256 MiB bucket, touched
    result = {}
    for algo in ("xxh3", "crc32", "blake2b"):
        best = min(_seconds(buf, algo) for _ in range(3))
        result[f"{algo}_GBps"] = buf.numel() / best / 1e9
    write_result(REPO / "bench" / "results" / "checksums" / "checksums_cpu.json", result)
    print(json.dumps(result, indent=2))
    return 0


def _seconds(buf: torch.Tensor, algo: str) -> float:
    start = time.perf_counter()
    cs.bucket_checksum(buf, algo)
    return time.perf_counter() - start


if __name__ == "__main__":
    sys.exit(main())
