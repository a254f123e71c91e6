"""The lm_head in fp32 (model.lm_head_fp32), the same on the trainer and on the transformers rollout engine."""

from __future__ import annotations

import types

from torch import Tensor, nn


def _fp32_linear(self: nn.Linear, x: Tensor) -> Tensor:
    return nn.functional.linear(x.float(), self.weight.float(), None if self.bias is None else self.bias.float())


def install_fp32_lm_head(model: nn.Module) -> None:
    """The model's lm_head computes its logits in fp32 from its bf16 inputs and weights (model.lm_head_fp32), on
    the fused head's path and on the plain forward alike; the weights and their gradients keep their dtype.

    The trainer's fused head reads `lm_head.fp32`; vLLM gets the same through services/rollout/vllm_ext.py. The
    bf16 rounding of the logits that this removes only cancels when both sides compute the head in fp32."""
    model.lm_head.fp32 = True
    model.lm_head.forward = types.MethodType(_fp32_linear, model.lm_head)
