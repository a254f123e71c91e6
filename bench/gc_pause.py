"""The garbage collector's full-collection pause in a rollout worker, before and after freezing its startup heap.

    python bench/gc_pause.py [--hidden 64 --layers 2]

Builds what a rollout worker holds once started (its modules and the transformers engine on a random
model created locally), then times gc.collect() (best of --reps) before and after
lifecycle.freeze_startup_heap(). Writes bench/results/gc_pause/gc_pause.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from provenance import write_result  # noqa: E402 - bench/ is this script's own folder


def full_collection_s(reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        gc.collect()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "gc_pause" / "gc_pause.json"))
    args = p.parse_args()

    from services.common.config import ModelSection
    from services.common.lifecycle import freeze_startup_heap
    from services.common.tinymodel import create_tiny_model
    from services.rollout import server  # noqa: F401  (the worker's modules: gRPC, Redis, protos)
    from services.rollout.hf_engine import HFEngine

    with tempfile.TemporaryDirectory() as tmp:
        model = ModelSection(path=f"{tmp}/model", hidden_size=args.hidden, num_layers=args.layers)
        engine = HFEngine(str(create_tiny_model(model, seed=0)), seed=0)
        tracked = len(gc.get_objects())
        before = full_collection_s(args.reps)
        freeze_startup_heap()
        after = full_collection_s(args.reps)
        del engine
    result = {
        "tracked_objects": tracked,
        "full_collection_s_before": before,
        "full_collection_s_after_freeze": after,
    }
    write_result(args.out, result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
