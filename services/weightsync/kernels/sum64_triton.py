"""Triton kernels for the device checksum: sum64 in one read, and a copy that checksums what it moves.

They give exactly checksum.sum64_reference's three int64 values (wrapping mod 2**64), so GPU and CPU
peers agree. Imported only where they run: CUDA tensors, or CPU tensors under TRITON_INTERPRET=1.

A bucket is packed from hundreds of tensors; one launch per tensor cost more host time than the copies
(bench/README.md). So every piece of a bucket goes to one launch: a table gives each piece's addresses,
size, line and first tile, and each program finds its piece by binary search over the first tiles. A
whole version's buckets go to one launch too (sum64_ranges), and fp32 sources are cast to bf16 inside it
(mode CAST_BF16), so a trainer's fp32 master weights are read once and written once, as bf16.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

LINE_WORDS = 8  # 64-byte lines, as in checksum.py
BLOCK_LINES = 256
"""Lines per program: 16 KiB, 16 words per thread at 4 warps, enough loads in flight to stream HBM."""
SUM, COPY, ZERO, CAST_BF16 = 0, 1, 2, 3
"""What a piece's program does: sum the destination where it lies, copy the source into it while
summing, zero it (padding: adds nothing to the sum), or write the source's fp32 values into it as bf16
(four per word) while summing."""


@triton.jit
def _bf16_words(src, offs, mask):
    # The fp32 values behind each destination word, rounded to bf16 as torch rounds them (to nearest even;
    # NaN as 0x7FC0, torch's CPU value), in integer arithmetic so the interpreter rounds alike, and packed
    # little-endian four to a word.
    part = tl.arange(0, 4)
    bits = tl.load(src + offs[:, :, None] * 4 + part[None, None, :], mask=mask[:, :, None], other=0)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    half = tl.where((bits & 0x7FFFFFFF) > 0x7F800000, 0x7FC0, rounded).to(tl.int64)
    return tl.sum(half << (part[None, None, :] * 16).to(tl.int64), axis=2)


@triton.jit
def _pieces_kernel(table, num_pieces, partials, ALIGNED: tl.constexpr, BLOCK_LINES: tl.constexpr):
    # Program pid does tile pid - first_tile of the last piece whose first tile is <= pid; its three
    # partial sums go to partials[j * num_tiles + pid], j = 0, 1, 2. Line k of the bucket (the piece's
    # first line + local line) weighs k + 1 and column c weighs c + 1, as in the torch reference.
    pid = tl.program_id(0).to(tl.int64)
    lo = pid * 0
    hi = lo + num_pieces
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if tl.load(table + mid * 6 + 4) <= pid:
            lo = mid
        else:
            hi = mid
    row = table + lo * 6
    src = tl.load(row).to(tl.pointer_type(tl.int64))
    dst = tl.load(row + 1).to(tl.pointer_type(tl.int64))
    num_words = tl.load(row + 2)
    first_line = tl.load(row + 3)
    mode = tl.load(row + 5)
    if ALIGNED:  # 16-byte addresses and even word counts: two words per load and store
        src = tl.multiple_of(src, 16)
        dst = tl.multiple_of(dst, 16)
        num_words = tl.multiple_of(num_words, 2)
    line = (pid - tl.load(row + 4)) * BLOCK_LINES + tl.arange(0, BLOCK_LINES)
    col = tl.arange(0, 8)
    offs = line[:, None] * 8 + col[None, :]
    mask = offs < num_words
    if mode == 2:
        w = tl.zeros((BLOCK_LINES, 8), dtype=tl.int64)
    elif mode == 3:
        w = _bf16_words(tl.load(row).to(tl.pointer_type(tl.uint32)), offs, mask)
    else:
        w = tl.load(src + offs, mask=mask, other=0)
    if mode != 0:
        tl.store(dst + offs, w, mask=mask)
    line_sums = tl.sum(w, axis=1)
    col_sums = tl.sum(w, axis=0)
    num_tiles = tl.num_programs(0)
    tl.store(partials + pid, tl.sum(col_sums, axis=0))
    tl.store(partials + num_tiles + pid, tl.sum(line_sums * (line + first_line + 1), axis=0))
    tl.store(partials + 2 * num_tiles + pid, tl.sum(col_sums * (col + 1), axis=0))


def _num_tiles(num_words: int) -> int:
    return triton.cdiv(triton.cdiv(num_words, LINE_WORDS), BLOCK_LINES)


Piece = tuple[torch.Tensor | None, torch.Tensor, int, int]
"""(source words or None, destination words, line of the bucket where the destination starts, mode):
mode COPY needs a source; SUM and ZERO take None."""
Row = tuple[int, int, int, int, int]
"""A piece by address: (source address, destination address, words, first line, mode)."""


def sum64_pieces(pieces: list[Piece]) -> torch.Tensor:
    """sum64 of a bucket made of pieces, int64[3] on its device, in one launch: each piece is copied
    into its destination while summed, summed where it lies, or zeroed. Every byte is read at most once.

    sum64 adds up one term per word, so a bucket's value is the sum of its pieces' values; bytes that
    no piece covers must be zero (zero words add nothing).
    """
    rows = []
    for src, dst, first_line, mode in pieces:
        assert dst.dtype == torch.int64 and dst.is_contiguous(), dst
        assert (mode == COPY) == (src is not None) and (src is None or src.shape == dst.shape), mode
        rows.append(((src if src is not None else dst).data_ptr(), dst.data_ptr(), dst.numel(), first_line, mode))
    return sum64_rows(rows, pieces[0][1].device)


def sum64_rows(rows: list[Row], device: torch.device) -> torch.Tensor:
    """sum64_pieces for pieces given by address (no tensor view to build per piece, which costs host time)."""
    return sum64_ranges(rows, [(0, len(rows))], device)[0]


def sum64_each(rows: list[Row], device: torch.device) -> torch.Tensor:
    """int64[len(rows), 3]: each row's own sum64, in one launch for all (read-back checks of hundreds of
    small tensors, where a launch per tensor cost more host time than the reads take)."""
    return sum64_ranges(rows, [(i, i + 1) for i in range(len(rows))], device)


def sum64_ranges(rows: list[Row], ranges: list[tuple[int, int]], device: torch.device) -> torch.Tensor:
    """int64[len(ranges), 3]: for each (first, end) range of rows, the sum of those rows' values, all rows in one
    launch; ranges may overlap (a whole version's buckets, and the tensors inside them)."""
    partials, first_tiles = _launch(rows, device)
    # A range's value is the sum of its tiles' partials: a difference of prefix sums (wrapping, exact). One
    # flat scan (a scan along the tiles of a [tiles, 3] tensor runs three threads, tens of ms per version).
    prefix = torch.cat([partials.new_zeros(1), partials.cumsum(0)])
    tiles, n = first_tiles[-1], len(ranges)
    at = [[j * tiles + first_tiles[r[k]] for k in (0, 1) for r in ranges] for j in range(3)]
    at = torch.tensor(at, dtype=torch.int64, pin_memory=device.type == "cuda").to(device, non_blocking=True)
    return (prefix[at[:, n:]] - prefix[at[:, :n]]).t().contiguous()


def _launch(rows: list[Row], device: torch.device) -> tuple[torch.Tensor, list[int]]:
    """Run the pieces kernel over rows: the partial sums of every tile (int64[3 * tiles]: the three sums'
    partials one after the other), and each row's first tile (with the total tile count appended)."""
    entries, first_tiles, tiles, aligned = [], [], 0, True
    for src, dst, num_words, first_line, mode in rows:
        first_tiles.append(tiles)
        if num_words == 0:
            continue
        aligned &= src % 16 == 0 and dst % 16 == 0 and num_words % 2 == 0
        entries.append((src, dst, num_words, first_line, tiles, mode))
        tiles += _num_tiles(num_words)
    first_tiles.append(tiles)
    if tiles == 0:
        return torch.zeros(0, dtype=torch.int64, device=device), first_tiles
    partials = torch.empty(3 * tiles, dtype=torch.int64, device=device)
    table = torch.tensor(entries, dtype=torch.int64, pin_memory=device.type == "cuda").to(device, non_blocking=True)
    _pieces_kernel[(tiles,)](table, len(entries), partials, ALIGNED=aligned, BLOCK_LINES=BLOCK_LINES)
    return partials, first_tiles


def sum64(buf: torch.Tensor) -> torch.Tensor:
    """checksum.sum64 of a uint8 bucket in one read."""
    return sum64_pieces([(None, buf.view(torch.int64), 0, SUM)])


def copy_sum64(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    """dst.copy_(src) for uint8 buckets, returning sum64 of the bytes, in one read and one write."""
    return sum64_pieces([(src.view(torch.int64), dst.view(torch.int64), 0, COPY)])
