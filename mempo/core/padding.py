"""Right padding, the one way variable-length rows become [B, T] tensors (turn samples, warm-start examples,
memory-scoring prompts). Base layer: imports torch only."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def place(
    rows: Sequence[Sequence[float]], starts: Sequence[int], t_len: int, *, dtype: torch.dtype, fill: float = 0
) -> Tensor:
    """[B, t_len] filled with ``fill``, row i holding ``rows[i]`` from column ``starts[i]`` on."""
    out = torch.full((len(rows), t_len), fill, dtype=dtype)
    for i, (row, start) in enumerate(zip(rows, starts)):
        if len(row):
            out[i, start : start + len(row)] = torch.tensor(list(row), dtype=dtype)
    return out


def right_pad(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """-> input_ids [B, T] (``pad_id`` after each row), attention_mask [B, T] (True on the row's tokens);
    T = the longest row."""
    t_len = max((len(r) for r in rows), default=0)
    zeros = [0] * len(rows)
    ids = place(rows, zeros, t_len, dtype=torch.long, fill=pad_id)
    return ids, place([[True] * len(r) for r in rows], zeros, t_len, dtype=torch.bool)
