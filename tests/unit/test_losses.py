"""GRPO losses against independent plain-Python formulas; packing against unpacked forwards."""

import math
import random

import pytest
import torch
from random_seqs import random_seqs

from services.trainer.losses import grpo_token_loss, k3_kl, mult_prob_error, token_logprobs
from services.trainer.packing import plan, response_offsets, split_microbatches, split_ranks


def _rand(n: int, seed: int, scale: float = 1.0) -> list[float]:
    rng = random.Random(seed)
    return [rng.gauss(0.0, scale) for _ in range(n)]


def test_token_logprobs_matches_logsumexp_loop():
    logits = [_rand(7, seed=r, scale=3.0) for r in range(5)]
    targets = [3, 0, 6, 2, 2]
    got = token_logprobs(torch.tensor(logits, dtype=torch.float64), torch.tensor(targets))
    for row, t, g in zip(logits, targets, got.tolist()):
        expected = row[t] - math.log(sum(math.exp(x) for x in row))
        assert abs(g - expected) < 1e-6


def test_grpo_token_loss_matches_case_by_case_formula():
    n, eps = 64, 0.2
    logp, old = _rand(n, 1, 0.5), _rand(n, 2, 0.5)
    adv = _rand(n, 3)
    got = grpo_token_loss(*(torch.tensor(x, dtype=torch.float64) for x in (logp, old, adv)), clip_eps=eps)
    for i in range(n):
        r = math.exp(logp[i] - old[i])
        # Written as the PPO case analysis instead of min(): a positive advantage is capped at 1+eps,
        # a negative one at 1-eps; the other side of the ratio is never clipped.
        if adv[i] >= 0:
            surrogate = min(r, 1 + eps) * adv[i]
        else:
            surrogate = max(r, 1 - eps) * adv[i]
        assert abs(got[i].item() - (-surrogate)) < 1e-6


def test_grpo_token_loss_gradient_vanishes_outside_the_clip_range():
    logp = torch.tensor([0.5, -0.5, 0.0], requires_grad=True)
    old = torch.zeros(3)
    adv = torch.tensor([1.0, -1.0, 1.0])
    grpo_token_loss(logp, old, adv, clip_eps=0.2).sum().backward()
    # ratio e^0.5 > 1.2 with A > 0 and e^-0.5 < 0.8 with A < 0 are clipped; ratio 1 is not.
    assert logp.grad.tolist() == pytest.approx([0.0, 0.0, -1.0])


def test_k3_kl_matches_formula_and_is_nonnegative():
    logp, ref = _rand(50, 4), _rand(50, 5)
    got = k3_kl(torch.tensor(logp, dtype=torch.float64), torch.tensor(ref, dtype=torch.float64))
    for a, b, g in zip(logp, ref, got.tolist()):
        ratio = math.exp(b) / math.exp(a)
        assert abs(g - (ratio - math.log(ratio) - 1)) < 1e-6
        assert g >= 0


def test_mult_prob_error_matches_loop():
    a, b = _rand(40, 6, 0.3), _rand(40, 7, 0.3)
    got = mult_prob_error(*(torch.tensor(x, dtype=torch.float64) for x in (a, b))).item()
    errors = [math.exp(abs(x - y)) for x, y in zip(a, b)]
    assert abs(got - sum(errors) / len(errors)) < 1e-6
    same = torch.tensor(a)
    assert mult_prob_error(same, same).item() == 1.0


def test_rank_split_is_balanced_and_microbatches_cover_every_sequence_once():
    seqs = random_seqs(23, seed=0, vocab=50)
    lengths = [s.num_tokens for s in seqs]
    for world in (1, 2, 3):
        ranks = split_ranks(lengths, world)
        assert split_ranks(lengths, world) == ranks, "the split must be deterministic"
        loads = [sum(lengths[i] for i in r) for r in ranks]
        assert max(loads) - min(loads) <= max(lengths)
        seen = []
        for indices in ranks:
            for mb in split_microbatches(indices, lengths, max_tokens=20):
                assert sum(lengths[i] for i in mb) <= 20
                seen.extend(mb)
        assert sorted(seen) == list(range(len(seqs)))


def test_split_ranks_gives_empty_ranks_when_there_are_fewer_sequences():
    assert split_ranks([5], 3) == [[0], [], []]


def test_packed_logprobs_equal_unpacked(tiny_model):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32, attn_implementation="sdpa")
    vocab = model.config.vocab_size
    seqs = random_seqs(9, seed=1, vocab=vocab)
    offsets = response_offsets(seqs)
    got = torch.full((offsets[-1],), float("nan"))
    with torch.no_grad():
        for rank_mbs in plan(seqs, world=2, max_tokens=24):
            for mb in rank_mbs:
                assert mb.input_ids_1T.shape[1] <= 24
                logits = model(input_ids=mb.input_ids_1T, position_ids=mb.position_ids_1T, use_cache=False).logits
                got[mb.token_index_R] = token_logprobs(logits[0, mb.logit_index_R], mb.targets_R)
        for i, s in enumerate(seqs):
            ids = torch.tensor([s.prompt_ids + s.response_ids])
            logp = torch.log_softmax(model(input_ids=ids, use_cache=False).logits[0], dim=-1)
            p = len(s.prompt_ids)
            expected = [logp[p + j - 1, t].item() for j, t in enumerate(s.response_ids)]
            assert (got[offsets[i] : offsets[i + 1]] - torch.tensor(expected)).abs().max() < 1e-5
