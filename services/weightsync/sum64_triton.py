"""Triton kernels for the device checksum: sum64 in one read, and a copy that checksums what it moves.

They give exactly checksum.sum64_reference's three int64 values (wrapping mod 2**64), so GPU and CPU
peers agree. Imported only where they run: CUDA tensors, or CPU tensors under TRITON_INTERPRET=1.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

LINE_WORDS = 8  # 64-byte lines, as in checksum.py
BLOCK_LINES = 256
"""Lines per program: 16 KiB, 16 words per thread at 4 warps, enough loads in flight to stream HBM."""


@triton.jit
def _sum64_kernel(src, dst, partials, num_words, first_line, COPY: tl.constexpr, WHOLE_LINES: tl.constexpr,
                  BLOCK_LINES: tl.constexpr):  # fmt: skip
    # One tile of BLOCK_LINES x 8 words; its three partial sums go to partials[pid]. Line k of the bucket
    # (first_line + local line) weighs k + 1 and column c weighs c + 1, as in the torch reference.
    pid = tl.program_id(0)
    line = pid.to(tl.int64) * BLOCK_LINES + tl.arange(0, BLOCK_LINES)
    col = tl.arange(0, 8)
    offs = line[:, None] * 8 + col[None, :]
    if WHOLE_LINES:  # a mask constant along each line keeps the loads vectorized
        mask = line[:, None] * 8 < num_words
    else:
        mask = offs < num_words
    w = tl.load(src + offs, mask=mask, other=0)
    if COPY:
        tl.store(dst + offs, w, mask=mask)
    line_sums = tl.sum(w, axis=1)
    col_sums = tl.sum(w, axis=0)
    tl.store(partials + pid * 3, tl.sum(col_sums, axis=0))
    tl.store(partials + pid * 3 + 1, tl.sum(line_sums * (line + first_line + 1), axis=0))
    tl.store(partials + pid * 3 + 2, tl.sum(col_sums * (col + 1), axis=0))


def words(t: torch.Tensor) -> torch.Tensor | None:
    """t's bytes as int64 words, without copying; None where t is not contiguous whole aligned words."""
    if not t.is_contiguous():
        return None
    b = t.reshape(-1).view(torch.uint8)
    if b.numel() % 8 or b.data_ptr() % 8:
        return None
    return b.view(torch.int64)


def _num_tiles(num_words: int) -> int:
    return triton.cdiv(triton.cdiv(num_words, LINE_WORDS), BLOCK_LINES)


Piece = tuple[torch.Tensor | None, torch.Tensor, int]
"""(source words or None, destination words, line of the bucket where the destination starts)."""


def sum64_pieces(pieces: list[Piece]) -> torch.Tensor:
    """sum64 of a bucket made of pieces, int64[3] on its device: a piece with a source is copied into its
    destination while summed; one without is summed where it lies. Every byte is read once.

    sum64 adds up one term per word, so a bucket's value is the sum of its pieces' values; bytes that
    no piece covers must be zero (zero words add nothing).
    """
    device = pieces[0][1].device
    partials = torch.empty(sum(_num_tiles(d.numel()) for _, d, _ in pieces), 3, dtype=torch.int64, device=device)
    row = 0
    for src, dst, first_line in pieces:
        assert dst.dtype == torch.int64 and dst.is_contiguous() and (src is None or src.shape == dst.shape)
        tiles = _num_tiles(dst.numel())
        if tiles == 0:
            continue
        _sum64_kernel[(tiles,)](
            dst if src is None else src, dst, partials[row : row + tiles], dst.numel(), first_line,
            COPY=src is not None, WHOLE_LINES=dst.numel() % LINE_WORDS == 0, BLOCK_LINES=BLOCK_LINES,
        )  # fmt: skip
        row += tiles
    return partials.sum(0)


def sum64(buf: torch.Tensor) -> torch.Tensor:
    """checksum.sum64 of a uint8 bucket in one read."""
    return sum64_pieces([(None, buf.view(torch.int64), 0)])


def copy_sum64(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    """dst.copy_(src) for uint8 buckets, returning sum64 of the bytes, in one read and one write."""
    return sum64_pieces([(src.view(torch.int64), dst.view(torch.int64), 0)])
