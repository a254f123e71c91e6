"""Packed rows through the sdpa_varlen attention equal each sequence run alone."""

import torch
from random_seqs import random_seqs

from services.trainer.attention import SDPA_VARLEN
from services.trainer.build import load_model
from services.trainer.losses import token_logprobs
from services.trainer.packing import plan, response_offsets


def test_rows_carry_sequence_lengths_and_segments():
    seqs = random_seqs(7, seed=3, vocab=50)
    for mb in (mb for rank in plan(seqs, world=2, max_tokens=20) for mb in rank):
        assert sum(mb.seq_lens) == mb.input_ids_1T.shape[1]
        assert mb.seq_lens == tuple(seqs[i].num_tokens for i in mb.seq_indices)
        expected = [k for k, i in enumerate(mb.seq_indices) for _ in seqs[i].response_ids]
        assert mb.segment_R.tolist() == expected


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


def _reference_flash_varlen(q_THD, k_TKD, v_TKD, cu_seqlens_S1, max_len, scale):
    """What aten's flash varlen kernel computes (it needs CUDA): causal sdpa per [cu[i], cu[i+1]) span."""
    cu = cu_seqlens_S1.tolist()
    assert max_len == max(b - a for a, b in zip(cu, cu[1:]))
    outs = [
        torch.nn.functional.scaled_dot_product_attention(
            *(x[a:b].transpose(0, 1) for x in (q_THD, k_TKD, v_TKD)), is_causal=True, scale=scale, enable_gqa=True
        ).transpose(0, 1)
        for a, b in zip(cu, cu[1:])
    ]
    return torch.cat(outs)


def test_flash_varlen_row_equals_per_sequence_sdpa(tiny_model, monkeypatch):
    """The one-call path's layout and cu_seqlens plumbing, with the CUDA kernel replaced by its definition."""
    from services.trainer import attention

    model = load_model(str(tiny_model), torch.float32, SDPA_VARLEN)
    seqs = random_seqs(6, seed=2, vocab=model.config.vocab_size)
    mb = plan(seqs, world=1, max_tokens=64)[0][0]
    cu_seqlens = torch.tensor([0, *torch.tensor(mb.seq_lens).cumsum(0).tolist()], dtype=torch.int32)
    calls = []
    monkeypatch.setattr(attention, "flash_varlen_supported", lambda q: True)
    monkeypatch.setattr(attention, "_flash_varlen_forward", lambda *a: calls.append(1) or _reference_flash_varlen(*a))

    def logits(**packed):
        with torch.no_grad():
            ids, pos = mb.input_ids_1T, mb.position_ids_1T
            return model(input_ids=ids, position_ids=pos, use_cache=False, packed_seq_lens=mb.seq_lens, **packed).logits

    flash = logits(packed_cu_seqlens=cu_seqlens)
    assert len(calls) == model.config.num_hidden_layers
    assert (flash - logits()).abs().max() < 1e-5
