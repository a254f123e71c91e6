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
