"""The fused lm_head + logprob equals log_softmax(hidden @ W.T)[target], values and gradients, in fp32."""

import pytest
import torch

from services.trainer.head import chunked_token_logprobs
from services.trainer.losses import token_logprobs


@pytest.mark.parametrize("chunk_tokens", [1, 7, 64])
def test_chunked_logprobs_and_grads_equal_the_plain_computation(chunk_tokens):
    gen = torch.Generator().manual_seed(0)
    hidden_RD = torch.randn(37, 16, generator=gen, requires_grad=True)
    weight_VD = torch.randn(301, 16, generator=gen, requires_grad=True)
    targets_R = torch.randint(0, 301, (37,), generator=gen)
    upstream_R = torch.randn(37, generator=gen)

    plain_R = token_logprobs(hidden_RD @ weight_VD.t(), targets_R)
    plain_grads = torch.autograd.grad((plain_R * upstream_R).sum(), (hidden_RD, weight_VD))
    fused_R = chunked_token_logprobs(hidden_RD, weight_VD, targets_R, chunk_tokens)
    fused_grads = torch.autograd.grad((fused_R * upstream_R).sum(), (hidden_RD, weight_VD))

    assert fused_R.dtype == torch.float32
    assert (fused_R - plain_R).abs().max() < 1e-5
    for fused, plain in zip(fused_grads, plain_grads):
        assert (fused - plain).abs().max() < 1e-5
    with torch.no_grad():
        assert (chunked_token_logprobs(hidden_RD, weight_VD, targets_R, chunk_tokens) - plain_R).abs().max() < 1e-5


def test_fp32_head_on_bf16_values_equals_fp32_math_and_beats_the_bf16_head():
    """model.lm_head_fp32: the bf16 hidden states and weights, multiplied and kept in fp32. Values and gradients
    equal fp32 math on the same bf16 values; the bf16 head's rounded logits are further from the exact logprobs."""
    gen = torch.Generator().manual_seed(0)
    hidden_RD = (torch.randn(64, 96, generator=gen) * 2).bfloat16().requires_grad_()
    weight_VD = (torch.randn(500, 96, generator=gen) * 0.5).bfloat16().requires_grad_()
    targets_R = torch.randint(0, 500, (64,), generator=gen)
    upstream_R = torch.randn(64, generator=gen)

    exact_R = token_logprobs(hidden_RD.double() @ weight_VD.double().t(), targets_R)
    plain_R = token_logprobs(hidden_RD.float() @ weight_VD.float().t(), targets_R)
    plain_grads = torch.autograd.grad((plain_R * upstream_R).sum(), (hidden_RD, weight_VD))
    fused_R = chunked_token_logprobs(hidden_RD, weight_VD, targets_R, 16, fp32=True)
    fused_grads = torch.autograd.grad((fused_R * upstream_R).sum(), (hidden_RD, weight_VD))

    assert (fused_R - plain_R).abs().max() < 1e-5
    for fused, plain in zip(fused_grads, plain_grads):
        assert fused.dtype == torch.bfloat16
        assert (fused.float() - plain.float()).abs().max() <= 1e-2 * plain.float().abs().max()
    with torch.no_grad():
        bf16_R = chunked_token_logprobs(hidden_RD, weight_VD, targets_R, 16)
    fp32_error = (fused_R.detach().double() - exact_R.detach()).abs().mean()
    bf16_error = (bf16_R.double() - exact_R.detach()).abs().mean()
    assert fp32_error * 100 < bf16_error, (fp32_error, bf16_error)


def test_install_fp32_lm_head_gives_fp32_logits_of_the_bf16_weights():
    from torch import nn

    from services.common.lm_head import install_fp32_lm_head

    model = nn.Module()
    model.lm_head = nn.Linear(32, 100, bias=False).bfloat16()
    x = torch.randn(5, 32).bfloat16()
    install_fp32_lm_head(model)
    logits = model.lm_head(x)
    assert logits.dtype == torch.float32 and model.lm_head.weight.dtype == torch.bfloat16
    assert torch.equal(logits, x.float() @ model.lm_head.weight.float().t())
