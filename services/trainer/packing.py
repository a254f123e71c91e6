"""Split a batch over data-parallel ranks and token-bounded micro-batches; pack each into one row."""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True, slots=True)
class Seq:
    prompt_ids: list[int]
    response_ids: list[int]

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


@dataclass(frozen=True, slots=True)
class Packed:
    """One micro-batch packed into a single row of T tokens holding R response tokens.

    The batch's response tokens form one flat layout (N tokens, sequence after sequence); a row carries
    the flat indices of its tokens, so per-token values (old, reference and rollout logprobs,
    advantages) are looked up by index instead of being split again per row.
    """

    seq_indices: list[int]
    """Batch indices of the sequences in this row, in row order."""
    input_ids_1T: Tensor
    position_ids_1T: Tensor
    """Restart at 0 for each sequence, which is what makes attention block-diagonal."""
    logit_index_R: Tensor
    """Row positions whose logits predict the response tokens."""
    targets_R: Tensor
    """The response token ids, in the flat layout's order."""
    token_index_R: Tensor
    """Positions of these response tokens in the batch's flat response-token layout."""
    segment_R: Tensor
    """Row-local sequence index (0 .. len(seq_indices) - 1) of each response token."""
    seq_lens: tuple[int, ...]
    """Tokens (prompt + response) of each sequence in the row, in row order; they sum to T."""


def response_offsets(seqs: list[Seq]) -> list[int]:
    """Start of each sequence's response tokens in the flat layout; the last entry is the total N."""
    offsets = [0]
    for s in seqs:
        offsets.append(offsets[-1] + len(s.response_ids))
    return offsets


def split_ranks(lengths: list[int], world: int) -> list[list[int]]:
    """Sequence indices per rank, balanced by tokens: longest first to the least loaded rank.

    Deterministic (ties break on index and rank) because every rank computes the same split on its own.
    The spread between the most and least loaded rank is at most the longest sequence.
    """
    loads = [(0, rank) for rank in range(world)]
    out: list[list[int]] = [[] for _ in range(world)]
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        load, rank = heapq.heappop(loads)
        out[rank].append(i)
        heapq.heappush(loads, (load + lengths[i], rank))
    return [sorted(indices) for indices in out]


def split_microbatches(indices: list[int], lengths: list[int], max_tokens: int) -> list[list[int]]:
    """First-fit decreasing into bins of at most max_tokens tokens; each sequence lands in exactly one."""
    bins: list[list[int]] = []
    used: list[int] = []
    for i in sorted(indices, key=lambda i: (-lengths[i], i)):
        assert lengths[i] <= max_tokens, f"sequence {i} has {lengths[i]} tokens > {max_tokens}"
        slot = next((b for b, u in enumerate(used) if u + lengths[i] <= max_tokens), len(bins))
        if slot == len(bins):
            bins.append([])
            used.append(0)
        bins[slot].append(i)
        used[slot] += lengths[i]
    return [sorted(b) for b in bins]


def pack(seqs: list[Seq], seq_indices: list[int], offsets: list[int]) -> Packed:
    """Concatenate the chosen sequences into one row; response token j of a sequence with prompt
    length P is predicted by the logits at row position start + P + j - 1."""
    ids, pos, logit_index, token_index, segment = [], [], [], [], []
    start = 0
    for local, i in enumerate(seq_indices):
        s = seqs[i]
        ids.extend(s.prompt_ids + s.response_ids)
        pos.extend(range(s.num_tokens))
        first = start + len(s.prompt_ids) - 1
        logit_index.extend(range(first, first + len(s.response_ids)))
        token_index.extend(range(offsets[i], offsets[i + 1]))
        segment.extend([local] * len(s.response_ids))
        start += s.num_tokens
    targets = [t for i in seq_indices for t in seqs[i].response_ids]
    return Packed(
        seq_indices=list(seq_indices),
        input_ids_1T=torch.tensor([ids], dtype=torch.long),
        position_ids_1T=torch.tensor([pos], dtype=torch.long),
        logit_index_R=torch.tensor(logit_index, dtype=torch.long),
        targets_R=torch.tensor(targets, dtype=torch.long),
        token_index_R=torch.tensor(token_index, dtype=torch.long),
        segment_R=torch.tensor(segment, dtype=torch.long),
        seq_lens=tuple(seqs[i].num_tokens for i in seq_indices),
    )


def plan(seqs: list[Seq], world: int, max_tokens: int) -> list[list[Packed]]:
    """Packed micro-batches of every rank (each rank computes all of it and keeps its own row)."""
    lengths = [s.num_tokens for s in seqs]
    offsets = response_offsets(seqs)
    return [
        [pack(seqs, mb, offsets) for mb in split_microbatches(indices, lengths, max_tokens)]
        for indices in split_ranks(lengths, world)
    ]
