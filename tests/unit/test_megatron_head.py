"""The vocab-parallel fused logprob head over 2 gloo ranks equals the single-rank computation: values and grads."""

import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from services.common.ports import free_port
from services.trainer.head import chunked_token_logprobs
from services.trainer.megatron.head import token_logprobs

R, D, V, TP = 23, 8, 40, 2


def _inputs():
    gen = torch.Generator().manual_seed(0)
    return (torch.randn(R, D, generator=gen), torch.randn(V, D, generator=gen),
            torch.randint(0, V, (R,), generator=gen), torch.randn(R, generator=gen))  # fmt: skip


def _rank(rank: int, port: int, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=TP)
    hidden, weight, targets, upstream = _inputs()
    hidden = hidden.clone().requires_grad_(True)
    shard = weight.chunk(TP)[rank].clone().requires_grad_(True)
    logp = token_logprobs(hidden, shard, targets, 5, rank, dist.group.WORLD)
    (logp * upstream).sum().backward()
    out[rank] = (logp.detach(), hidden.grad, shard.grad)
    dist.destroy_process_group()


def test_vocab_parallel_logprobs_and_grads_equal_one_rank():
    hidden, weight, targets, upstream = _inputs()
    hidden.requires_grad_(True), weight.requires_grad_(True)
    ref = chunked_token_logprobs(hidden, weight, targets, 5)
    (ref * upstream).sum().backward()

    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_rank, args=(free_port(), out), nprocs=TP)
        results = dict(out)
    for rank in range(TP):
        logp, grad_hidden, grad_shard = results[rank]
        assert (logp - ref.detach()).abs().max() < 1e-5
        assert (grad_hidden - hidden.grad).abs().max() < 1e-5
        assert (grad_shard - weight.grad.chunk(TP)[rank]).abs().max() < 1e-5
