"""Vocab-parallel fused lm_head + target logprob, chunk by chunk (the FSDP2 head with the vocabulary split
over tensor-parallel ranks): no fp32 [tokens, vocab] tensor, and no gathered logits, ever exist."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from ..head import chunked_token_logprobs


def _all_reduce(t: Tensor, op, group) -> Tensor:
    dist.all_reduce(t, op=op, group=group)
    return t


class _VocabParallelLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden_RD, weight_VD, targets_R, chunk_tokens: int, vocab_start: int, group):
        logits_RV = hidden_RD @ weight_VD.t()  # this rank's vocabulary slice, compute dtype
        local_R = targets_R - vocab_start
        mine_R = (local_R >= 0) & (local_R < weight_VD.shape[0])
        local_R = local_R.clamp(0, weight_VD.shape[0] - 1)
        lse_R = torch.empty(logits_RV.shape[0], device=logits_RV.device, dtype=torch.float32)
        target_R = torch.empty_like(lse_R)
        for start in range(0, logits_RV.shape[0], chunk_tokens):
            span = slice(start, start + chunk_tokens)
            chunk = logits_RV[span].float()
            max_C = _all_reduce(chunk.max(-1).values, dist.ReduceOp.MAX, group)
            sum_C = _all_reduce((chunk - max_C[:, None]).exp().sum(-1), dist.ReduceOp.SUM, group)
            lse_R[span] = max_C + sum_C.log()
            target_R[span] = chunk.gather(-1, local_R[span, None])[:, 0] * mine_R[span]
        _all_reduce(target_R, dist.ReduceOp.SUM, group)
        ctx.save_for_backward(hidden_RD, weight_VD, logits_RV, lse_R, local_R, mine_R)
        ctx.chunk_tokens, ctx.group = chunk_tokens, group
        return target_R - lse_R

    @staticmethod
    def backward(ctx, grad_R: Tensor):
        hidden_RD, weight_VD, logits_RV, lse_R, local_R, mine_R = ctx.saved_tensors
        grad_logits_RV = torch.empty_like(logits_RV)
        for start in range(0, logits_RV.shape[0], ctx.chunk_tokens):
            span = slice(start, start + ctx.chunk_tokens)
            g_C = grad_R[span].float()
            grad_CV = (logits_RV[span].float() - lse_R[span, None]).exp_().mul_(-g_C[:, None])
            grad_CV.scatter_add_(-1, local_R[span, None], (g_C * mine_R[span])[:, None])
            grad_logits_RV[span] = grad_CV.to(logits_RV.dtype)
        # Each rank's hidden gradient covers its vocabulary slice only: the sum over ranks is the gradient.
        grad_hidden = _all_reduce(grad_logits_RV @ weight_VD, dist.ReduceOp.SUM, ctx.group)
        grad_weight = grad_logits_RV.t() @ hidden_RD
        return grad_hidden, grad_weight, None, None, None, None


def token_logprobs(hidden_RD: Tensor, weight_VD: Tensor, targets_R: Tensor, chunk_tokens: int, tp_rank: int, group):
    """fp32 logprob of each target under softmax over the full vocabulary, weight_VD being this rank's rows."""
    if group is None or dist.get_world_size(group) == 1:
        return chunked_token_logprobs(hidden_RD, weight_VD, targets_R, chunk_tokens)
    vocab_start = tp_rank * weight_VD.shape[0]
    return _VocabParallelLogprobs.apply(hidden_RD, weight_VD, targets_R, chunk_tokens, vocab_start, group)
