"""Split a batch over data-parallel ranks and token-bounded micro-batches; pack each into one row."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True, slots=True)
class Seq:
    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: Sequence[bool] = ()
    """One per response token: True on the policy's, False on those an environment wrote (a multi-turn episode's
    tool results). Empty: every response token is the policy's."""

    def mask(self) -> list[float]:
        """1.0 per policy token, 0.0 per environment token."""
        return [1.0 if m else 0.0 for m in self.loss_mask] if self.loss_mask else [1.0] * len(self.response_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


Unit = tuple[int, ...]
"""Batch indices of the sequences of one attention block: one sequence, or several with the same prompt ids
(share_prompts), whose prompt then appears once in the row, followed by each response."""


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
    """Restart at 0 for each block; a shared block's responses each continue from the prompt's end."""
    logit_index_R: Tensor
    """Row positions whose logits predict the response tokens (a shared prompt's last position predicts the
    first token of each of its responses)."""
    targets_R: Tensor
    """The response token ids, in the flat layout's order."""
    token_index_R: Tensor
    """Positions of these response tokens in the batch's flat response-token layout."""
    segment_R: Tensor
    """Row-local sequence index (0 .. len(seq_indices) - 1) of each response token."""
    seq_lens: tuple[int, ...]
    """Tokens of each attention block of the row, in row order; they sum to T. Without shared prompts a block is
    one sequence (prompt + response)."""
    block_responses: tuple[tuple[int, ...], ...]
    """Response lengths of each block, in row order: one entry for a block of one sequence (plain causal
    attention); several for a shared prompt, each response attending to the prompt and to itself only."""

    @property
    def shares_prompts(self) -> bool:
        return any(len(r) > 1 for r in self.block_responses)


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


def unit_tokens(seqs: list[Seq], unit: Unit) -> int:
    """Row tokens of a block: its prompt once, then every response."""
    return len(seqs[unit[0]].prompt_ids) + sum(len(seqs[i].response_ids) for i in unit)


def shared_units(seqs: list[Seq], world: int, max_tokens: int) -> list[Unit]:
    """The batch's sequences grouped by identical prompt ids, each group cut to blocks of at most max_tokens
    tokens; while ranks outnumber blocks, the largest block is halved, so no rank idles that sharing emptied.

    Sharing is exact: a prompt's hidden states do not depend on what follows it, so computing them once for
    all its responses gives the same logprobs and gradients (up to float summation order) in fewer FLOPs.
    """
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, s in enumerate(seqs):
        groups.setdefault(tuple(s.prompt_ids), []).append(i)
    units: list[Unit] = []
    for members in groups.values():
        block: list[int] = []
        used = len(seqs[members[0]].prompt_ids)  # the block's row tokens so far: its prompt, then each response
        for i in members:
            if block and used + len(seqs[i].response_ids) > max_tokens:
                units.append(tuple(block))
                block, used = [], len(seqs[i].prompt_ids)
            block.append(i)
            used += len(seqs[i].response_ids)
        units.append(tuple(block))
    while len(units) < world and any(len(u) > 1 for u in units):
        big = max((u for u in units if len(u) > 1), key=lambda u: (unit_tokens(seqs, u), -u[0]))
        units.remove(big)
        units += [big[: len(big) // 2], big[len(big) // 2 :]]
    return sorted(units)


def pack(seqs: list[Seq], units: Sequence[Unit], offsets: list[int]) -> Packed:
    """Concatenate the chosen blocks into one row. In a block of prompt length P, token j > 0 of a response
    starting at row position c is predicted by the logits at c + j - 1, its token 0 by the prompt's last
    position (start + P - 1): for a block of one sequence that is position start + P + j - 1 throughout."""
    ids, pos, logit_index, token_index, segment, order = [], [], [], [], [], []
    block_lens, block_responses = [], []
    start = 0
    for unit in units:
        prompt = seqs[unit[0]].prompt_ids
        assert all(seqs[i].prompt_ids == prompt for i in unit), "a block's sequences must share their prompt"
        ids.extend(prompt)
        pos.extend(range(len(prompt)))
        cursor = start + len(prompt)
        for i in unit:
            response = seqs[i].response_ids
            ids.extend(response)
            pos.extend(range(len(prompt), len(prompt) + len(response)))
            if response:
                logit_index.append(start + len(prompt) - 1)
                logit_index.extend(range(cursor, cursor + len(response) - 1))
            token_index.extend(range(offsets[i], offsets[i + 1]))
            segment.extend([len(order)] * len(response))
            order.append(i)
            cursor += len(response)
        block_lens.append(cursor - start)
        block_responses.append(tuple(len(seqs[i].response_ids) for i in unit))
        start = cursor
    targets = [t for i in order for t in seqs[i].response_ids]
    return Packed(
        seq_indices=order,
        input_ids_1T=torch.tensor([ids], dtype=torch.long),
        position_ids_1T=torch.tensor([pos], dtype=torch.long),
        logit_index_R=torch.tensor(logit_index, dtype=torch.long),
        targets_R=torch.tensor(targets, dtype=torch.long),
        token_index_R=torch.tensor(token_index, dtype=torch.long),
        segment_R=torch.tensor(segment, dtype=torch.long),
        seq_lens=tuple(block_lens),
        block_responses=tuple(block_responses),
    )


@dataclass(frozen=True, slots=True)
class BatchPlan:
    """A batch as a backend runs it, from packing to the loss: each data-parallel rank's micro-batches, padded with
    None (a dummy pass) so that every rank runs as many, and N, the size of the flat response-token layout."""

    rows: list[list[Packed | None]]
    num_tokens: int


def plan_batch(
    seqs: list[Seq], world: int, max_tokens: int, share_prompts: bool = False, min_microbatches: int = 0
) -> BatchPlan:
    """plan(), each rank's list padded to the longest (and to min_microbatches): collectives inside forward and
    backward (FSDP2's gathers, Megatron's gradient reduction) need every rank to run the same number."""
    plans: list[list[Packed | None]] = list(plan(seqs, world, max_tokens, share_prompts))
    num_steps = max(min_microbatches, max(len(p) for p in plans))
    return BatchPlan([p + [None] * (num_steps - len(p)) for p in plans], response_offsets(seqs)[-1])


def plan(seqs: list[Seq], world: int, max_tokens: int, share_prompts: bool = False) -> list[list[Packed]]:
    """Packed micro-batches of every rank (each rank computes all of it and keeps its own row); share_prompts:
    sequences with the same prompt share one copy of it (shared_units)."""
    units = shared_units(seqs, world, max_tokens) if share_prompts else [(i,) for i in range(len(seqs))]
    lengths = [unit_tokens(seqs, u) for u in units]
    offsets = response_offsets(seqs)
    return [
        [pack(seqs, [units[u] for u in mb], offsets) for mb in split_microbatches(indices, lengths, max_tokens)]
        for indices in split_ranks(lengths, world)
    ]
