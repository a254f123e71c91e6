"""The built-in toy task: its prompts, and how its reward scores a random and a perfect policy."""

import itertools
import random

from services.common.rewards import BUILTIN
from services.common.tasks import SYMBOL_CLASSES, Prompt, builtin_prompts
from services.common.tokenizer import Vocab, build_char_tokenizer


def _score(prompt: Prompt, vocab: Vocab, response_ids: list[int]) -> float:
    completion = vocab.decode(response_ids)  # what the rollout worker hands the rewards
    return BUILTIN["class_continuation"](prompt.text, completion, prompt.answer, {"num_tokens": len(response_ids)})


def test_uniform_random_policy_scores_at_most_0_2_on_builtin_task():
    vocab = Vocab(build_char_tokenizer())
    size = vocab.tokenizer.get_vocab_size()
    rng = random.Random(0)
    scores = [
        _score(p, vocab, [rng.randrange(size) for _ in range(8)])
        for p in itertools.islice(builtin_prompts(seed=0, prompt_len=4), 500)
    ]
    assert 0.0 < sum(scores) / len(scores) <= 0.2


def test_perfect_answer_scores_one_and_prompts_are_one_class():
    vocab = Vocab(build_char_tokenizer())
    for p in itertools.islice(builtin_prompts(seed=1, prompt_len=4), 20):
        assert p.answer in SYMBOL_CLASSES and p.metadata == {}
        assert len(p.text) == 4 and all(c in p.answer for c in p.text)
        assert _score(p, vocab, vocab.encode(p.answer[:3] * 2)) == 1.0


def test_builtin_prompts_are_seeded():
    first = [p.text for p in itertools.islice(builtin_prompts(seed=3, prompt_len=4), 10)]
    assert first == [p.text for p in itertools.islice(builtin_prompts(seed=3, prompt_len=4), 10)]
    assert first != [p.text for p in itertools.islice(builtin_prompts(seed=4, prompt_len=4), 10)]
