"""Rotary position embedding for packed rows, HF's default RoPE (rotate-half convention); pure torch, so the
CPU tests check it against transformers' own."""

from __future__ import annotations

import torch
from torch import Tensor


def rope_tables(position_ids_T: Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """HF's default RoPE (rotate-half convention): fp32 angles, cast to the compute dtype."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=position_ids_T.device).float() / head_dim)
    angles_TD = position_ids_T.float()[:, None] * inv_freq[None, :]
    emb_TD = torch.cat([angles_TD, angles_TD], dim=-1)
    return emb_TD.cos().to(dtype)[:, None, :], emb_TD.sin().to(dtype)[:, None, :]


def _rotate(x_THD: Tensor, cos_T1D: Tensor, sin_T1D: Tensor) -> Tensor:
    x1, x2 = x_THD.chunk(2, dim=-1)
    return x_THD * cos_T1D + torch.cat([-x2, x1], dim=-1) * sin_T1D


def _rotate_qk(q_THD: Tensor, k_TKD: Tensor, cos_T1D: Tensor, sin_T1D: Tensor) -> tuple[Tensor, Tensor]:
    return _rotate(q_THD, cos_T1D, sin_T1D), _rotate(k_TKD, cos_T1D, sin_T1D)


# One inductor kernel for both rotations, forward and backward (row lengths vary: dynamic shapes).
_rotate_qk_compiled = torch.compile(_rotate_qk, dynamic=True)


def rotate_qk(q_THD: Tensor, k_TKD: Tensor, cos_T1D: Tensor, sin_T1D: Tensor) -> tuple[Tensor, Tensor]:
    """q and k rotated by their tokens' positions; compiled into one kernel on CUDA."""
    fn = _rotate_qk_compiled if q_THD.is_cuda else _rotate_qk
    return fn(q_THD, k_TKD, cos_T1D, sin_T1D)
