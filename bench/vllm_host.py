"""vLLM host work that the rollout engine switches off. Detokenizing every sampled token at every engine step (and
each logprob's token to text): the worker needs neither, it decodes each finished sample once, for the rewards, so
services/rollout/vllm_engine.py asks vLLM for detokenize=False. And a dict and a Logprob object for every generated
token (vLLM's default container), which the garbage collector then walks: the engine asks for flat_logprobs=True, one
list of floats a sample. This times one vLLM engine, built as the rollout builds it, on the same requests under
vLLM's defaults (`default`), detokenize off (`detokenize_off`) and both off (`rollout`, what the engine asks for),
taking turns after a warm-up of each; the seeds are the same, so all must sample the same tokens (`same_tokens`) with
the same logprobs (`same_logprobs`).

    python bench/vllm_host.py --model-dir M --prompts 32 --samples 8 --max-tokens 256 --args ...  # the H200 run
    python bench/vllm_host.py --smoke        # tiny random model; /tmp/vllm_host_smoke.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
from provenance import write_result  # noqa: E402 - bench/ is this script's own folder
from rollout import _requests  # noqa: E402

from services.common.config import load_config  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny random model, few tokens, CPU or GPU")
    parser.add_argument("--model-dir", default="", help="an HF folder; generated on the built-in prompts")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=6, help="timed passes of each setting, taking turns")
    parser.add_argument("--args", nargs="*", default=[], help="config overrides, e.g. rollout.gpu.*")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    tmp = Path(tempfile.mkdtemp(prefix="bench-vllm-host-"))
    model = args.model_dir
    if args.smoke:
        from services.common.config import ModelSection
        from services.common.tinymodel import create_tiny_model

        model = str(create_tiny_model(ModelSection(path=str(tmp / "tiny")), seed=0))
        args.prompts, args.samples, args.max_tokens, args.repeats = 2, 2, 8, 2
    if not model:
        parser.error("--model-dir or --smoke")
    overrides = [
        f'model.path="{model}"',
        "task.chat_template=false",
        f"rollout.max_num_seqs={args.prompts * args.samples}",
        "rollout.max_model_len=512",
        *args.args,
    ]
    cfg = load_config(None, overrides)
    work = _requests(cfg, args.prompts, args.samples, args.max_tokens)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cfg.rollout.kv_cache_GiB))
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from services.common.lifecycle import GcClock, freeze_startup_heap
    from services.rollout.vllm_engine import VllmEngine, sampled_logprobs

    engine = VllmEngine(cfg.model.path, seed=cfg.run.seed, cfg=cfg.rollout, lm_head_fp32=cfg.model.lm_head_fp32)
    prompts = [TokensPrompt(prompt_token_ids=list(w.prompt_ids)) for w in work]
    freeze_startup_heap()  # as the worker does once started: the collector then walks what the passes make
    clock = GcClock()

    def one_pass(setting: dict) -> tuple[float, list[list[int]], list[list[float]]]:
        params = [
            SamplingParams(
                n=w.num_samples,
                temperature=w.sampling.temperature,
                max_tokens=w.sampling.max_tokens,
                ignore_eos=True,
                seed=w.sampling.seed,
                logprobs=0,
                **setting,
            )
            for w in work
        ]
        start = time.perf_counter()
        outs = engine.llm.generate(prompts, params, use_tqdm=False)
        samples = [c for o in outs for c in o.outputs]
        ids = [list(c.token_ids) for c in samples]
        logprobs = [sampled_logprobs(c.logprobs, c.token_ids) for c in samples]
        return time.perf_counter() - start, ids, logprobs  # the engine's generate takes both out of vLLM's outputs

    settings = {
        "default": {"detokenize": True, "flat_logprobs": False},
        "detokenize_off": {"detokenize": False, "flat_logprobs": False},
        "rollout": {"detokenize": False, "flat_logprobs": True},
    }
    passes: dict[str, list[float]] = {name: [] for name in settings}
    gc_s = dict.fromkeys(settings, 0.0)
    full_collections = dict.fromkeys(settings, 0)
    outputs = {name: one_pass(setting)[1:] for name, setting in settings.items()}  # warm-up; what each samples
    for _ in range(args.repeats):
        for name, setting in settings.items():
            was_s, was_full = clock.seconds, clock.full_collections
            passes[name].append(round(one_pass(setting)[0], 4))
            gc_s[name] += clock.seconds - was_s
            full_collections[name] += clock.full_collections - was_full
    median = {name: statistics.median(passes[name]) for name in settings}
    num_tokens = sum(len(t) for t in outputs["rollout"][0])
    result = {
        "rollout_over_default_tokps": median["default"] / median["rollout"],
        "detokenize_off_over_default_tokps": median["default"] / median["detokenize_off"],
        "rollout_over_detokenize_off_tokps": median["detokenize_off"] / median["rollout"],
        "median_s": median,
        "tokps": {name: num_tokens / seconds for name, seconds in median.items()},
        "same_tokens": all(out[0] == outputs["default"][0] for out in outputs.values()),
        "same_logprobs": all(out[1] == outputs["default"][1] for out in outputs.values()),
        "passes_s": passes,
        "gc_s_per_pass": {name: gc_s[name] / args.repeats for name in settings},
        "gc_full_collections": full_collections,
        "tokens": num_tokens,
        "prompts": args.prompts,
        "samples_per_prompt": args.samples,
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "vllm_dtype": str(engine.dtype).removeprefix("torch."),
    }
    out = Path(
        args.out or ("/tmp/vllm_host_smoke.json" if args.smoke else REPO / "bench/results/vllm_host/vllm_host.json")
    )
    write_result(out, result)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
