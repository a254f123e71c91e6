"""vLLM engine, run in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0) so tensors pass without copies."""

from __future__ import annotations

import os

import torch

from .engine import Request, Sample


class VllmEngine:
    def __init__(self, model_path: str, seed: int, max_model_len: int, max_num_seqs: int):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM

        on_cpu = not torch.cuda.is_available()
        self.dtype = torch.float32 if on_cpu else torch.bfloat16
        self.llm = LLM(
            model=model_path,
            dtype=str(self.dtype).removeprefix("torch."),
            max_model_len=max_model_len,
            enforce_eager=on_cpu,
            seed=seed,
            max_num_seqs=max_num_seqs,
            # Logprobs of the distribution sampled from (after temperature), the one the trainer scores.
            logprobs_mode="processed_logprobs",
            worker_extension_cls="services.rollout.vllm_ext.WeightLoaderExtension",
        )

    def generate(self, requests: list[Request]) -> list[list[Sample]]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = [
            SamplingParams(
                n=r.num_samples,
                temperature=r.sampling.temperature,
                top_p=r.sampling.top_p,
                max_tokens=r.sampling.max_tokens,
                ignore_eos=r.sampling.ignore_eos,
                seed=r.sampling.seed or None,
                logprobs=0,  # the sampled token's logprob only
            )
            for r in requests
        ]
        prompts = [TokensPrompt(prompt_token_ids=list(r.prompt_ids)) for r in requests]
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        return [
            [
                Sample(
                    list(c.token_ids),
                    [c.logprobs[i][t].logprob for i, t in enumerate(c.token_ids)],
                    c.finish_reason or "",
                )
                for c in out.outputs
            ]
            for out in outs
        ]

    def load_weights(self, named: list[tuple[str, torch.Tensor]]) -> None:
        self.llm.collective_rpc("load_named", args=(named,))

    def read_weights(self) -> dict[str, torch.Tensor]:
        return self.llm.collective_rpc("read_named")[0]
