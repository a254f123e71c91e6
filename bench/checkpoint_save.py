"""What a resumable checkpoint costs the run, phase by phase, and what the training state's writer threads buy.

One process (a gloo group of one), the model in fp32 with AdamW's state after one step, as the trainer holds them;
each round writes a whole checkpoint as the trainer's Save does (services/trainer/engine.py: the training state by
torch distributed checkpoint, the HF export, the signed manifest) and as the coordinator then makes it durable
(an fsync of every file), once with DCP's default of one writer thread and once with each other thread count,
alternating, into a fresh folder each time; as a run keeps its newest two (run.keep_checkpoints), the folder from
two saves back is deleted once a save completes, so the disk writes back what a run's would. Medians over the rounds.

    python bench/checkpoint_save.py                  # SmolLM2-135M-Instruct (make model), threads 1 and ours
    python bench/checkpoint_save.py --threads 1 2 4 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from provenance import write_result  # noqa: E402 - bench/ is this script's own folder


def one_save(root: Path, model, optimizer, source: Path, threads: int) -> tuple[dict[str, float], Path]:
    from services.trainer import checkpoint
    from services.trainer.manifest import write_manifest

    folder = Path(tempfile.mkdtemp(dir=root))
    times = {}
    start = time.perf_counter()
    checkpoint.save_train_state(folder / checkpoint.TRAIN_STATE, model, optimizer, 1, 0, threads=threads)
    times["train_state_s"] = time.perf_counter() - start
    mark = time.perf_counter()
    checkpoint.write_hf({k: v.detach() for k, v in model.state_dict().items()}, source, folder)
    times["hf_export_s"] = time.perf_counter() - mark
    mark = time.perf_counter()
    write_manifest(folder)
    times["manifest_s"] = time.perf_counter() - mark
    mark = time.perf_counter()
    for path in folder.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
    times["fsync_s"] = time.perf_counter() - mark
    times["total_s"] = time.perf_counter() - start
    times["bytes"] = float(sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()))
    return times, folder


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", default="", help="an HF model folder (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--threads", nargs="*", type=int, default=[], help="writer threads to time (1 = DCP's)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--out", default=str(REPO / "bench" / "results" / "checkpoint_save" / "checkpoint_save_cpu.json")
    )
    args = parser.parse_args()

    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    from services.common.models import build_model
    from services.trainer.checkpoint import writer_threads

    source = Path(args.model_dir) if args.model_dir else build_model("smollm2-135m-instruct", REPO / "runs" / "models")
    threads = args.threads or sorted({1, writer_threads()})
    root = Path(tempfile.mkdtemp(prefix="ckpt-bench-"))
    dist.init_process_group("gloo", init_method=f"file://{root / 'rendezvous'}", rank=0, world_size=1)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    model(torch.randint(0, 100, (1, 8))).logits.float().mean().backward()
    optimizer.step()  # AdamW's two moments exist, as in a trainer past its first step

    rounds: dict[int, list[dict[str, float]]] = {t: [] for t in threads}
    kept: list[Path] = []
    for _ in range(args.rounds):
        for t in threads:  # alternating: the disk's and page cache's drift falls on every thread count alike
            times, folder = one_save(root, model, optimizer, source, t)
            rounds[t].append(times)
            kept.append(folder)
            if len(kept) > 2:
                shutil.rmtree(kept.pop(0))
    dist.destroy_process_group()
    shutil.rmtree(root, ignore_errors=True)

    medians = {str(t): {k: statistics.median(r[k] for r in rs) for k in rs[0]} for t, rs in rounds.items()}
    base = medians[str(threads[0])]
    result = {
        "model": source.name,
        "medians": medians,
        "train_state_speedup_vs_first": {t: base["train_state_s"] / m["train_state_s"] for t, m in medians.items()},
        "total_speedup_vs_first": {t: base["total_s"] / m["total_s"] for t, m in medians.items()},
        "rounds": {str(t): rs for t, rs in rounds.items()},
    }
    write_result(args.out, result)
    print(json.dumps({k: result[k] for k in ("medians", "train_state_speedup_vs_first", "total_speedup_vs_first")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
