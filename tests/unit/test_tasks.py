import random

import pytest

from services.common.tasks import builtin_prompts, class_continuation, exact_match, jsonl_prompts, reward_fn
from services.common.tokenizer import Vocab, build_char_tokenizer


def test_uniform_random_policy_scores_at_most_0_2_on_builtin_task():
    vocab = Vocab(build_char_tokenizer())
    size = vocab.tokenizer.get_vocab_size()
    rng = random.Random(0)
    prompts = builtin_prompts(seed=0, prompt_len=4)
    scores = []
    for _ in range(500):
        p = next(prompts)
        response = [rng.randrange(size) for _ in range(8)]
        scores.append(class_continuation(vocab.pieces(response), p.answer))
    assert sum(scores) / len(scores) <= 0.2


def test_perfect_answer_scores_one():
    p = next(builtin_prompts(seed=1, prompt_len=4))
    vocab = Vocab(build_char_tokenizer())
    assert class_continuation(vocab.pieces(vocab.encode(p.answer[:3] * 2)), p.answer) == 1.0
    assert all(c in p.answer for c in p.text)


def test_exact_match_and_unknown_reward():
    assert exact_match(list(" Paris."), "Paris") == 1.0
    assert exact_match(list("London"), "Paris") == 0.0
    with pytest.raises(ValueError, match="unknown reward"):
        reward_fn("nope")


def test_jsonl_prompts_cycle_and_bad_lines_name_the_line(tmp_path):
    good = tmp_path / "p.jsonl"
    good.write_text('{"prompt": "2+2=", "answer": "4"}\n\n{"prompt": "1+1=", "answer": "2"}\n')
    it = jsonl_prompts(good, seed=0)
    assert sorted(next(it).text for _ in range(2)) == ["1+1=", "2+2="]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "x"}\n{"answer": "4"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        next(jsonl_prompts(bad, seed=0))
