"""Random prompt/response pairs for packing tests (imported by tests in this folder)."""

import random

from services.trainer.packing import Seq


def random_seqs(num: int, seed: int, vocab: int) -> list[Seq]:
    rng = random.Random(seed)
    return [
        Seq(
            [rng.randrange(vocab) for _ in range(rng.randint(1, 9))],
            [rng.randrange(vocab) for _ in range(rng.randint(1, 9))],
        )
        for _ in range(num)
    ]
