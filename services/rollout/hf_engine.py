"""Plain transformers engine: the reference for logprob checks, and the engine where vLLM is absent."""

from __future__ import annotations

import torch

from protos.grpo.v1 import queue_pb2

from .engine import Sample


class HFEngine:
    def __init__(self, model_path: str, seed: int):
        from transformers import AutoModelForCausalLM

        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to(self.device).eval()
        self.eos_token_id = self.model.config.eos_token_id
        self.generator = torch.Generator(self.device).manual_seed(seed)

    @torch.no_grad()
    def generate(
        self, prompts: list[list[int]], num_samples: int, sampling: queue_pb2.SamplingParams
    ) -> list[list[Sample]]:
        return [[self._sample(p, sampling) for _ in range(num_samples)] for p in prompts]

    def _sample(self, prompt: list[int], sampling: queue_pb2.SamplingParams) -> Sample:
        ids = torch.tensor([prompt], device=self.device)
        past, tokens, logprobs, finish = None, [], [], "length"
        for _ in range(sampling.max_tokens):
            out = self.model(input_ids=ids, past_key_values=past, use_cache=True)
            past, logits = out.past_key_values, out.logits[0, -1].float()
            token = _sample_token(logits, sampling.temperature, sampling.top_p, self.generator)
            tokens.append(token)
            logprobs.append(torch.log_softmax(logits, -1)[token].item())
            if token == self.eos_token_id and not sampling.ignore_eos:
                finish = "stop"
                break
            ids = torch.tensor([[token]], device=self.device)
        return Sample(tokens, logprobs, finish)

    def load_weights(self, named: list[tuple[str, torch.Tensor]]) -> None:
        params = self.model.state_dict()
        with torch.no_grad():
            for name, t in named:
                if name not in params:
                    raise ValueError(f"engine has no weight named {name!r}")
                params[name].copy_(t)

    def read_weights(self) -> dict[str, torch.Tensor]:
        return {n: t.detach().clone() for n, t in self.model.state_dict().items()}


def _sample_token(logits_V: torch.Tensor, temperature: float, top_p: float, gen: torch.Generator) -> int:
    probs_V = torch.softmax(logits_V / temperature, -1)
    if top_p < 1.0:
        sorted_p, order = probs_V.sort(descending=True)
        keep = sorted_p.cumsum(-1) - sorted_p < top_p
        probs_V = torch.zeros_like(probs_V).scatter(0, order[keep], sorted_p[keep])
    return int(torch.multinomial(probs_V, 1, generator=gen).item())
