"""Packed rows through the sdpa_varlen attention (and shared-prompt blocks through both sdpa paths) equal
each sequence run alone."""

import itertools

import pytest
import torch
import torch.nn.functional as F
from random_seqs import random_seqs

from services.trainer.attention import SDPA_VARLEN, block_masks, row_mask, shared_flash_layout, shared_prompt_mask
from services.trainer.fsdp2.build import load_model
from services.trainer.losses import token_logprobs
from services.trainer.packing import Seq, plan, response_offsets


def test_rows_carry_sequence_lengths_and_segments():
    seqs = random_seqs(7, seed=3, vocab=50)
    for mb in (mb for rank in plan(seqs, world=2, max_tokens=20) for mb in rank):
        assert sum(mb.seq_lens) == mb.input_ids_1T.shape[1]
        assert mb.seq_lens == tuple(seqs[i].num_tokens for i in mb.seq_indices)
        expected = [k for k, i in enumerate(mb.seq_indices) for _ in seqs[i].response_ids]
        assert mb.segment_R.tolist() == expected


def test_shared_prompts_appear_once_per_block_and_every_response_once():
    seqs = random_seqs(12, seed=5, vocab=50, samples=4)  # 3 prompts x 4 responses
    mbs = [mb for rank in plan(seqs, world=2, max_tokens=30, share_prompts=True) for mb in rank]
    assert sorted(i for mb in mbs for i in mb.seq_indices) == list(range(12))
    prompt_copies = 0
    for mb in mbs:
        assert mb.input_ids_1T.shape[1] == sum(mb.seq_lens) <= 30
        prompt_copies += len(mb.seq_lens)
        for n, responses in zip(mb.seq_lens, mb.block_responses):
            assert n - sum(responses) in {len(s.prompt_ids) for s in seqs}
        expected = [k for k, i in enumerate(mb.seq_indices) for _ in seqs[i].response_ids]
        assert mb.segment_R.tolist() == expected
    assert 3 <= prompt_copies < 12, "blocks are cut only where max_tokens or the ranks ask for it"
    assert any(mb.shares_prompts for mb in mbs)
    unshared = [mb for rank in plan(seqs, world=2, max_tokens=30) for mb in rank]
    assert sum(mb.input_ids_1T.shape[1] for mb in mbs) < sum(mb.input_ids_1T.shape[1] for mb in unshared)


def test_a_shared_group_is_halved_so_every_rank_gets_work():
    seqs = random_seqs(4, seed=1, vocab=50, samples=4)  # one prompt, two ranks
    ranks = plan(seqs, world=2, max_tokens=100, share_prompts=True)
    assert [sorted(i for mb in rank for i in mb.seq_indices) for rank in ranks] == [[0, 1], [2, 3]]


def test_shared_prompt_mask_lets_each_response_see_the_prompt_and_itself():
    mask = shared_prompt_mask(2, [2, 1]).int().tolist()
    assert mask == [
        [1, 0, 0, 0, 0],  # prompt: causal
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],  # response 0: prompt + itself
        [1, 1, 1, 1, 0],
        [1, 1, 0, 0, 1],  # response 1: prompt + itself, not response 0
    ]
    assert block_masks((3, 5), ((2,), (2, 1)))[0] is None
    assert torch.equal(row_mask((3, 5), ((2,), (2, 1)))[0, 0, 3:, 3:], shared_prompt_mask(2, [2, 1]))


@pytest.mark.parametrize("impl", ["sdpa", SDPA_VARLEN])
def test_shared_prompt_rows_give_each_sequence_its_unpacked_logprobs(tiny_model, impl):
    model = load_model(str(tiny_model), torch.float32, impl)
    plain = load_model(str(tiny_model), torch.float32, "sdpa")
    seqs = random_seqs(10, seed=4, vocab=model.config.vocab_size, samples=3)
    seqs.append(Seq(seqs[0].prompt_ids, []))  # an empty response contributes no token
    offsets = response_offsets(seqs)
    got = torch.full((offsets[-1],), float("nan"))
    with torch.no_grad():
        for mb in (mb for rank in plan(seqs, world=2, max_tokens=32, share_prompts=True) for mb in rank):
            if impl == "sdpa":
                attention = {"attention_mask": row_mask(mb.seq_lens, mb.block_responses)}
            else:
                attention = {
                    "packed_seq_lens": mb.seq_lens,
                    "packed_block_masks": block_masks(mb.seq_lens, mb.block_responses),
                }
            logits = model(
                input_ids=mb.input_ids_1T,
                position_ids=mb.position_ids_1T,
                use_cache=False,
                logits_to_keep=mb.logit_index_R,
                **attention,
            ).logits
            got[mb.token_index_R] = token_logprobs(logits[0], mb.targets_R)
        for i, s in enumerate(seqs[:-1]):
            logp = torch.log_softmax(plain(input_ids=torch.tensor([s.prompt_ids + s.response_ids])).logits[0], -1)
            p = len(s.prompt_ids)
            expected = torch.stack([logp[p + j - 1, t] for j, t in enumerate(s.response_ids)])
            assert (got[offsets[i] : offsets[i + 1]] - expected).abs().max() < 1e-5


def test_sdpa_varlen_packed_logprobs_equal_unpacked_sdpa(tiny_model):
    varlen = load_model(str(tiny_model), torch.float32, SDPA_VARLEN)
    plain = load_model(str(tiny_model), torch.float32, "sdpa")
    seqs = random_seqs(9, seed=1, vocab=varlen.config.vocab_size)
    offsets = response_offsets(seqs)
    got = torch.full((offsets[-1],), float("nan"))
    with torch.no_grad():
        for mb in (mb for rank in plan(seqs, world=2, max_tokens=24) for mb in rank):
            logits = varlen(
                input_ids=mb.input_ids_1T,
                position_ids=mb.position_ids_1T,
                use_cache=False,
                logits_to_keep=mb.logit_index_R,
                packed_seq_lens=mb.seq_lens,
            ).logits
            got[mb.token_index_R] = token_logprobs(logits[0], mb.targets_R)
        for i, s in enumerate(seqs):
            logp = torch.log_softmax(plain(input_ids=torch.tensor([s.prompt_ids + s.response_ids])).logits[0], -1)
            p = len(s.prompt_ids)
            expected = torch.stack([logp[p + j - 1, t] for j, t in enumerate(s.response_ids)])
            assert (got[offsets[i] : offsets[i + 1]] - expected).abs().max() < 1e-5


def _reference_flash_varlen(q_THD, k_TKD, v_TKD, cu_q, cu_k, max_q, max_k, scale):
    """What aten's flash varlen kernel computes (it needs CUDA): sdpa per query span [cu_q[i], cu_q[i+1]) over key
    span [cu_k[i], cu_k[i+1]), causal aligned to the bottom right (query j of Lq sees keys up to j + Lk - Lq)."""
    q_spans, k_spans = list(itertools.pairwise(cu_q.tolist())), list(itertools.pairwise(cu_k.tolist()))
    assert (max_q, max_k) == (max(b - a for a, b in q_spans), max(b - a for a, b in k_spans))
    outs = []
    for (qa, qb), (ka, kb) in zip(q_spans, k_spans, strict=True):
        lq, lk = qb - qa, kb - ka
        mask = torch.ones(lq, lk, dtype=torch.bool).tril(diagonal=lk - lq)
        q, k, v = q_THD[qa:qb].transpose(0, 1), k_TKD[ka:kb].transpose(0, 1), v_TKD[ka:kb].transpose(0, 1)
        outs.append(
            F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True).transpose(0, 1)
        )
    return torch.cat(outs)


def _flash_on_cpu(monkeypatch) -> list:
    """The one-call paths' layout and plumbing, with the CUDA kernel replaced by its definition; the calls made."""
    from services.trainer import attention

    calls = []
    monkeypatch.setattr(attention, "flash_varlen_supported", lambda q: True)
    monkeypatch.setattr(attention, "_flash_varlen_forward", lambda *a: calls.append(1) or _reference_flash_varlen(*a))
    return calls


def test_flash_varlen_row_equals_per_sequence_sdpa(tiny_model, monkeypatch):
    model = load_model(str(tiny_model), torch.float32, SDPA_VARLEN)
    seqs = random_seqs(6, seed=2, vocab=model.config.vocab_size)
    mb = plan(seqs, world=1, max_tokens=64)[0][0]
    cu_seqlens = torch.tensor([0, *torch.tensor(mb.seq_lens).cumsum(0).tolist()], dtype=torch.int32)

    def logits(**packed):
        with torch.no_grad():
            ids, pos = mb.input_ids_1T, mb.position_ids_1T
            return model(input_ids=ids, position_ids=pos, use_cache=False, packed_seq_lens=mb.seq_lens, **packed).logits

    expected = logits()
    calls = _flash_on_cpu(monkeypatch)
    flash = logits(packed_cu_seqlens=cu_seqlens)
    assert len(calls) == model.config.num_hidden_layers
    assert (flash - expected).abs().max() < 1e-5


def _shared_row(model):
    seqs = random_seqs(9, seed=6, vocab=model.config.vocab_size, samples=4)  # groups of 4, 4 and 1
    seqs.insert(1, Seq(seqs[0].prompt_ids, []))  # an empty response: no query span of its own
    mb = plan(seqs, world=1, max_tokens=200, share_prompts=True)[0][0]
    assert mb.shares_prompts and len(mb.seq_lens) == 3
    return mb


def _loss_and_grads(model, mb, **attention) -> tuple[float, dict]:
    device = next(model.parameters()).device
    model.zero_grad()
    logits = model(
        input_ids=mb.input_ids_1T.to(device),
        position_ids=mb.position_ids_1T.to(device),
        use_cache=False,
        logits_to_keep=mb.logit_index_R.to(device),
        packed_seq_lens=mb.seq_lens,
        packed_block_masks=[m if m is None else m.to(device) for m in block_masks(mb.seq_lens, mb.block_responses)],
        **attention,
    ).logits
    loss = token_logprobs(logits[0].float(), mb.targets_R.to(device)).sum()
    loss.backward()
    return loss.item(), {n: p.grad.float().clone() for n, p in model.named_parameters()}


def test_flash_varlen_over_shared_prompts_equals_the_masked_blocks(tiny_model, monkeypatch):
    """Values and gradients: the gathered keys' backward must add each response's share into its prompt."""
    model = load_model(str(tiny_model), torch.float32, SDPA_VARLEN)
    mb = _shared_row(model)
    loss, grads = _loss_and_grads(model, mb)
    calls = _flash_on_cpu(monkeypatch)
    layout = shared_flash_layout(mb.seq_lens, mb.block_responses)
    flash_loss, flash_grads = _loss_and_grads(model, mb, packed_shared_flash=layout)
    assert len(calls) == model.config.num_hidden_layers
    assert abs(flash_loss - loss) < 1e-4
    assert max((flash_grads[n] - grads[n]).abs().max().item() for n in grads) < 1e-5


def test_a_flash_layout_where_the_kernel_cannot_run_fails_naming_the_option(tiny_model):
    model = load_model(str(tiny_model), torch.float32, SDPA_VARLEN)
    mb = _shared_row(model)
    layout = shared_flash_layout(mb.seq_lens, mb.block_responses)
    with pytest.raises(RuntimeError, match="trainer.fsdp2.flash_varlen = false"):
        _loss_and_grads(model, mb, packed_shared_flash=layout)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (aten's flash varlen kernel)")
def test_cuda_flash_kernel_over_shared_prompts_equals_the_masked_blocks(tiny_model, monkeypatch):
    """The real kernel: its causal alignment for keys longer than queries is bottom-right (else every response
    would see only the first tokens of its prompt), in bf16, against the per-block masked sdpa."""
    from services.trainer import attention

    model = load_model(str(tiny_model), torch.float32, SDPA_VARLEN).to("cuda", torch.bfloat16)
    mb = _shared_row(model)
    loss, grads = _loss_and_grads(model, mb)
    calls, kernel = [], attention._flash_varlen_forward
    monkeypatch.setattr(attention, "_flash_varlen_forward", lambda *a, **k: calls.append(1) or kernel(*a, **k))
    layout = shared_flash_layout(mb.seq_lens, mb.block_responses).to(torch.device("cuda"))
    flash_loss, flash_grads = _loss_and_grads(model, mb, packed_shared_flash=layout)
    assert len(calls) == model.config.num_hidden_layers
    assert abs(flash_loss - loss) <= 2e-2 * abs(loss)
    scale = max(g.abs().max().item() for g in grads.values())
    assert max((flash_grads[n] - grads[n]).abs().max().item() for n in grads) <= 3e-2 * scale
