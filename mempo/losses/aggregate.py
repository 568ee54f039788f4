"""Loss aggregation modes (docs/algorithm.md §4, ``loss.agg``).

Every mode is a weighted token sum: ``aggregate(loss) == (loss * loss_weights(mask)).sum()``. Computing the
weights once on the whole batch and slicing them per micro-batch makes gradient accumulation reproduce the
full-batch objective exactly, whatever the mode (a trajectory's turns may land in different micro-batches).
"""

from __future__ import annotations

import torch
from torch import Tensor

AGG_MODES = ("traj_mean_token_mean", "token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")


def loss_weights(
    mask: Tensor,
    mode: str,
    *,
    traj_ids: Tensor | None = None,
    num_tokens: float | Tensor | None = None,
    max_len: int | None = None,
) -> Tensor:
    """[N, T] weight of each token's loss under ``mode`` (zero outside ``mask``).

    token_mean:              1 / token count (DAPO). ``num_tokens`` replaces the local count with a global one, so
                             data-parallel shards that each divide by it add up to the global token mean.
    seq_mean_token_mean:     token mean inside each sample, then the mean over samples that have tokens.
    seq_mean_token_sum_norm: token sum of each sample / ``max_len`` (default T, the padded length), then the mean
                             over samples (Dr. GRPO).
    traj_mean_token_mean:    token mean inside each trajectory across all of its turn samples (``traj_ids`` [N]),
                             then the mean over trajectories that have tokens (Eq. 10 over turn samples).
    """
    m = mask.to(torch.float32) if not mask.is_floating_point() else mask
    if mode == "token_mean":
        denom = m.sum() if num_tokens is None else torch.as_tensor(num_tokens, dtype=m.dtype, device=m.device)
        return m / denom.clamp(min=1)
    if mode == "seq_mean_token_mean":
        count = m.sum(-1, keepdim=True)  # [N, 1]
        n_seq = (count > 0).sum().clamp(min=1)
        return m / count.clamp(min=1) / n_seq
    if mode == "seq_mean_token_sum_norm":
        length = m.shape[-1] if max_len is None else max_len
        return m / length / max(m.shape[0], 1)
    if mode == "traj_mean_token_mean":
        if traj_ids is None:
            raise ValueError("loss.agg='traj_mean_token_mean' needs traj_ids")
        ids = torch.unique(traj_ids, return_inverse=True)[1]  # [N] -> 0..K-1
        k = int(ids.max()) + 1 if ids.numel() else 0
        tok_cnt = torch.zeros(k, dtype=m.dtype, device=m.device).index_add(0, ids, m.sum(-1))  # [K]
        n_traj = (tok_cnt > 0).sum().clamp(min=1)
        return m / tok_cnt[ids].clamp(min=1)[:, None] / n_traj
    raise ValueError(f"loss.agg must be one of {AGG_MODES}, got {mode!r}")


def aggregate(
    loss: Tensor,
    mask: Tensor,
    mode: str,
    *,
    traj_ids: Tensor | None = None,
    num_tokens: float | Tensor | None = None,
) -> Tensor:
    """Reduce a per-token loss [N, T] under ``mask`` [N, T] to a scalar (modes: see ``loss_weights``)."""
    weights = loss_weights(mask, mode, traj_ids=traj_ids, num_tokens=num_tokens).to(loss.dtype)
    return (loss * weights).sum()
