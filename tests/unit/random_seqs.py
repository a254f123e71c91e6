"""Random prompt/response pairs for packing tests (imported by tests in this folder)."""

import random

from services.trainer.packing import Seq


def random_seqs(num: int, seed: int, vocab: int, samples: int = 1) -> list[Seq]:
    """num sequences; each run of `samples` consecutive ones shares its prompt (a GRPO group)."""
    rng = random.Random(seed)
    seqs = []
    for i in range(num):
        if i % samples == 0:
            prompt = [rng.randrange(vocab) for _ in range(rng.randint(1, 9))]
        seqs.append(Seq(prompt, [rng.randrange(vocab) for _ in range(rng.randint(1, 9))]))
    return seqs
