"""Plain transformers engine: the reference for logprob checks, and the engine where vLLM is absent."""

from __future__ import annotations

import torch

from protos.grpo.v1 import queue_pb2
from services.common.config import RolloutSection

from .engine import Request, Sample
from .vllm_ext import copy_into


class HFEngine:
    def __init__(self, model_path: str, seed: int, cfg: RolloutSection | None = None, lm_head_fp32: bool = True):
        """cfg: the rollout section, as every engine takes it (engines.make_engine); this one has no options in it."""
        from transformers import AutoModelForCausalLM

        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        # safetensors only: a .bin in the folder would be a pickle.
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=self.dtype, use_safetensors=True)
        self.model = model.to(self.device).eval()
        if lm_head_fp32 and self.dtype != torch.float32:  # as the trainer's head (model.lm_head_fp32)
            from services.common.lm_head import install_fp32_lm_head

            install_fp32_lm_head(self.model)
        # Views of the parameters by HF name, built once: refits copy into them in place, and walking the
        # module tree for a state dict on every refit cost milliseconds (hundreds of tensors).
        self._weights = self.model.state_dict()
        config = self.model.config
        self.eos_token_id = config.eos_token_id
        self.pad_token_id = config.pad_token_id if config.pad_token_id is not None else config.eos_token_id
        torch.manual_seed(seed)

    def generate(self, requests: list[Request], between_steps=None) -> list[list[Sample]]:  # no steps to go between
        return [self._generate_one(list(r.prompt_ids), r.num_samples, r.sampling) for r in requests]

    @torch.no_grad()
    def _generate_one(self, prompt: list[int], num_samples: int, sampling: queue_pb2.SamplingParams) -> list[Sample]:
        from transformers import GenerationConfig

        if sampling.seed:
            torch.manual_seed(sampling.seed)
        ids, mask = self._left_pad([prompt] * num_samples)
        greedy = sampling.temperature == 0
        config = GenerationConfig(
            do_sample=not greedy,
            temperature=None if greedy else sampling.temperature,
            top_p=None if greedy else sampling.top_p,
            top_k=0,  # like vLLM's default: no top-k cut
            max_new_tokens=sampling.max_tokens,
            # With ignore_eos there is no stop token; EOS may still be sampled, as in vLLM.
            eos_token_id=None if sampling.ignore_eos else self.eos_token_id,
            pad_token_id=self.pad_token_id,
        )
        out = self.model.generate(
            input_ids=ids,
            attention_mask=mask,
            generation_config=config,
            output_logits=True,
            return_dict_in_generate=True,
        )
        tokens_BT = out.sequences[:, ids.shape[1] :]
        # Logprobs of the sampled tokens under logits / temperature, the distribution sampled from (as vLLM's
        # processed_logprobs; top_p < 1 is refused by the config, so no nucleus renormalisation is involved).
        logits_BTV = torch.stack(out.logits, 1).float() / (sampling.temperature or 1.0)
        logp_BT = logits_BTV.log_softmax(-1).gather(-1, tokens_BT[..., None])[..., 0]
        return [self._sample(t.tolist(), lp.tolist(), sampling.ignore_eos) for t, lp in zip(tokens_BT, logp_BT)]

    def _left_pad(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        return ids.to(self.device), mask.to(self.device)

    def _sample(self, tokens: list[int], logprobs: list[float], ignore_eos: bool) -> Sample:
        if not ignore_eos and self.eos_token_id in tokens:
            end = tokens.index(self.eos_token_id) + 1
            return Sample(tokens[:end], logprobs[:end], "stop")
        return Sample(tokens, logprobs, "length")

    def load_weights(self, named: list[tuple[str, torch.Tensor]]) -> None:
        """Every tensor checked against the engine's first, so a bad one changes nothing, then copied in."""
        copy_into(self._weights, named)

    def read_weights(self) -> dict[str, torch.Tensor]:
        return dict(self._weights)

    def sleep(self) -> None:
        """Nothing to free: the transformers engine keeps its weights and allocates per call."""
