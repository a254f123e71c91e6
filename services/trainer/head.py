"""Fused lm_head + target logprob: never materialises the fp32 [tokens, vocab] log-softmax or its gradient."""

from __future__ import annotations

import types

import torch
from torch import Tensor, nn

# Set by compile_head(): the same pure functions compiled by inductor (one fused pass over the logits).
_CHUNK_FNS: dict[str, object] = {}


def _chunk_logprobs(logits_CV: Tensor, targets_C: Tensor) -> Tensor:
    # dtype=float32 reads bf16 logits and computes in fp32 in one kernel on CUDA (no fp32 copy first).
    logp_CV = torch.log_softmax(logits_CV, dim=-1, dtype=torch.float32)
    return logp_CV.gather(-1, targets_C.unsqueeze(-1)).squeeze(-1)


def _chunk_grad_logits(logits_CV: Tensor, targets_C: Tensor, grad_C: Tensor) -> Tensor:
    """d logp[target] / d logits = onehot(target) - softmax, scaled by each row's incoming gradient."""
    grad_CV = torch.softmax(logits_CV, dim=-1, dtype=torch.float32).mul_(-grad_C.unsqueeze(-1))
    grad_CV.scatter_add_(-1, targets_C.unsqueeze(-1), grad_C.unsqueeze(-1))
    return grad_CV.to(logits_CV.dtype)


def _fn(name: str, eager):
    return _CHUNK_FNS.get(name, eager)


class _ChunkedTokenLogprobs(torch.autograd.Function):
    """One logits matmul in the compute dtype (as plain lm_head), then fp32 softmax math chunk by chunk.

    Saves the compute-dtype logits (R x V x 2 bytes in bf16) instead of the fp32 log-softmax output
    (R x V x 4) plus its fp32 input copy, and backward builds the logits gradient chunk by chunk, so
    no fp32 tensor larger than chunk_tokens x V exists.
    """

    @staticmethod
    def forward(ctx, hidden_RD: Tensor, weight_VD: Tensor, targets_R: Tensor, chunk_tokens: int, fp32: bool) -> Tensor:
        logits_RV = _head_matmul(hidden_RD, weight_VD, fp32)
        logp_R = _logprobs_by_chunk(logits_RV, targets_R, chunk_tokens)
        ctx.save_for_backward(hidden_RD, weight_VD, targets_R, logits_RV)
        ctx.chunk_tokens, ctx.fp32 = chunk_tokens, fp32
        return logp_R

    @staticmethod
    def backward(ctx, grad_R: Tensor):
        hidden_RD, weight_VD, targets_R, logits_RV = ctx.saved_tensors
        grad_logits_RV = torch.empty_like(logits_RV)
        grad_fn = _fn("grad_logits", _chunk_grad_logits)
        for start in range(0, logits_RV.shape[0], ctx.chunk_tokens):
            span = slice(start, start + ctx.chunk_tokens)
            grad_logits_RV[span] = grad_fn(logits_RV[span], targets_R[span], grad_R[span].float())
        hidden, weight = (hidden_RD.float(), weight_VD.float()) if ctx.fp32 else (hidden_RD, weight_VD)
        grad_hidden = (grad_logits_RV @ weight).to(hidden_RD.dtype) if ctx.needs_input_grad[0] else None
        grad_weight = (grad_logits_RV.t() @ hidden).to(weight_VD.dtype) if ctx.needs_input_grad[1] else None
        return grad_hidden, grad_weight, None, None, None


def _head_matmul(hidden_RD: Tensor, weight_VD: Tensor, fp32: bool) -> Tensor:
    """The logits: in the compute dtype, or (fp32) from the same bf16 values accumulated and kept in fp32."""
    return hidden_RD.float() @ weight_VD.float().t() if fp32 else hidden_RD @ weight_VD.t()


def _logprobs_by_chunk(logits_RV: Tensor, targets_R: Tensor, chunk_tokens: int) -> Tensor:
    fn = _fn("logprobs", _chunk_logprobs)
    spans = [slice(start, start + chunk_tokens) for start in range(0, logits_RV.shape[0], chunk_tokens)]
    return torch.cat([fn(logits_RV[span], targets_R[span]) for span in spans])


def chunked_token_logprobs(
    hidden_RD: Tensor, weight_VD: Tensor, targets_R: Tensor, chunk_tokens: int, fp32: bool = False
) -> Tensor:
    """fp32 logprob of each target token under softmax(hidden @ weight.T), chunk_tokens rows at a time; fp32:
    the matmul itself in fp32 (model.lm_head_fp32)."""
    assert chunk_tokens > 0, "chunk_tokens must be positive"
    if torch.is_grad_enabled() and (hidden_RD.requires_grad or weight_VD.requires_grad):
        return _ChunkedTokenLogprobs.apply(hidden_RD, weight_VD, targets_R, chunk_tokens, fp32)
    return _logprobs_by_chunk(_head_matmul(hidden_RD, weight_VD, fp32), targets_R, chunk_tokens)


def _packed_logprobs(
    self: nn.Module, input_ids_1T: Tensor, position_ids_1T: Tensor, logit_index_R: Tensor, targets_R: Tensor,
    chunk_tokens: int, temperature: float = 1.0, **kwargs,
) -> Tensor:  # fmt: skip
    """A causal LM's forward up to the final norm, then the fused head on the response positions only, under
    softmax(logits / temperature): (hidden / temperature) @ W.T is logits / temperature."""
    hidden_1TD = self.model(input_ids=input_ids_1T, position_ids=position_ids_1T, use_cache=False, **kwargs)[0]
    hidden_RD = hidden_1TD[0, logit_index_R]
    fp32 = getattr(self.lm_head, "fp32", False)
    if temperature != 1.0:
        hidden_RD = (hidden_RD.float() if fp32 else hidden_RD) / temperature
    return chunked_token_logprobs(hidden_RD, self.lm_head.weight, targets_R, chunk_tokens, fp32)


def install_packed_logprobs(model: nn.Module) -> None:
    """Give the (sharded) model a `packed_logprobs` method that FSDP2 treats like forward."""
    from torch.distributed.fsdp import register_fsdp_forward_method

    # FSDP2 all-gathers (and later reduce-scatters) the root's embedding / lm_head / norm around
    # forward() only; registering the method gives it the same hooks, so it may bypass forward().
    model.packed_logprobs = types.MethodType(_packed_logprobs, model)
    register_fsdp_forward_method(model, "packed_logprobs")


def compile_head() -> None:
    """Fuse each chunk's softmax math into one inductor kernel (idempotent)."""
    if not _CHUNK_FNS:
        _CHUNK_FNS["logprobs"] = torch.compile(_chunk_logprobs, dynamic=True)
        _CHUNK_FNS["grad_logits"] = torch.compile(_chunk_grad_logits, dynamic=True)
