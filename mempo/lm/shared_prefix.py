"""The decoder's forward over rows that begin with the same tokens, those tokens computed once (optim.shared_prefix).

Every turn sample of an RL step begins with the same system prompt and chat-template tokens, and the samples of one
task with the same question after them: on the synthetic world about 86 of a turn sample's ~265 tokens (a third)
are the same in every row of a micro-batch. A causal decoder's states at those positions are the same in every row,
so they need computing once. ``shared_prefix_layout`` repacks a right-padded micro-batch [N, T] of rows whose first
``p`` tokens agree as N + 1 rows: row 0 holds the prefix, row r the rest of original row r - 1 (its positions numbered
from p on, as they were). A 4D mask lets row 0 attend causally to itself and every other row to row 0's prefix and
causally to itself; ``prefix_attention`` (installed by ``shared_prefix_attention``) gives each row the prefix's keys and
values from row 0 before SDPA. ``unpack`` gathers the states back to the [N, T] layout, so everything after the decoder
(the scored positions, the head, the log-softmax) is what it was. The same function of the weights: the prefix's
states reach every row's loss, and its gradient is the sum over rows, as in the unshared forward; only the order of
float additions differs (tests/lm/test_shared_prefix.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

ATTENTION_NAME = "mempo_shared_prefix"
# Below this many shared tokens the repacking is not worth its extra row.
MIN_PREFIX = 8


@dataclass(frozen=True)
class PrefixLayout:
    """A micro-batch repacked by ``shared_prefix_layout``."""

    input_ids: Tensor  # [N + 1, T2]: row 0 the prefix, row r original row r - 1 after it
    position_ids: Tensor  # [N + 1, T2]
    mask: Tensor  # [N + 1, 1, T2, p + T2] bool: keys are row 0's first p positions, then the row's own
    gather: Tensor  # [N * T] long: for each original (row, position) its flat index into the [N + 1, T2] states
    prefix_len: int
    computed: int  # positions the repacked forward computes ((N + 1) * T2), against N * T unshared


def common_prefix_len(input_ids: Tensor, attention_mask: Tensor) -> int:
    """The number of leading positions where every row holds the same real token."""
    mask = attention_mask.bool()
    same = (input_ids == input_ids[:1]).all(0) & mask.all(0)  # [T]
    return int(same.long().cumprod(0).sum())


def _prefix_and_width(input_ids: Tensor, mask: Tensor) -> tuple[int, int] | None:
    """(p, T2) of the repacked micro-batch, or None where repacking would not compute fewer positions."""
    n, t = input_ids.shape
    lengths = mask.sum(-1)
    if n < 2 or not torch.equal(mask, torch.arange(t, device=mask.device)[None] < lengths[:, None]):
        return None  # only right padding: row i's tokens are positions [0, lengths[i])
    # Each row keeps at least one token of its own, so every row of the repacked batch has a query to attend with;
    # rows are max(p, longest rest) long, so a prefix longer than half the longest row is shared only up to that half.
    p = min(common_prefix_len(input_ids, mask), int(lengths.min()) - 1, (int(lengths.max()) + 1) // 2)
    if p < MIN_PREFIX:
        return None
    t2 = max(p, int(lengths.max()) - p)
    return None if (n + 1) * t2 >= n * t else (p, t2)


def shared_prefix_layout(input_ids: Tensor, attention_mask: Tensor) -> PrefixLayout | None:
    """The repacked micro-batch, or None where it would not compute fewer positions (fewer than 2 rows, left padding
    or holes, a common prefix under ``MIN_PREFIX`` tokens)."""
    mask = attention_mask.bool()
    plan = _prefix_and_width(input_ids, mask)
    if plan is None:
        return None
    p, t2 = plan
    n, t = input_ids.shape
    rest = mask.sum(-1) - p  # [N] each row's own tokens
    dev = input_ids.device
    cols = torch.arange(t2, device=dev)
    ids = torch.zeros((n + 1, t2), dtype=input_ids.dtype, device=dev)
    ids[0, :p] = input_ids[0, :p]
    own = cols[None] < rest[:, None]  # [N, T2]
    src = (cols[None] + p).clamp(max=t - 1).expand(n, t2)
    ids[1:] = torch.where(own, input_ids.gather(1, src), ids.new_zeros(()))
    # Row 0 counts from 0, the others from p; a padding position gets its row's next number (it reads nothing used).
    position_ids = torch.cat([cols[None], (cols + p)[None].expand(n, t2)])
    real = torch.cat([cols[None] < p, own])  # [N + 1, T2] real tokens
    causal = cols[:, None] >= cols[None, :]  # [T2 (query), T2 (key)]
    self_keys = causal[None] & real[:, None, :]  # [N + 1, T2, T2]
    prefix_keys = torch.zeros((n + 1, t2, p), dtype=torch.bool, device=dev)
    prefix_keys[1:] = True  # row 0 reads its own prefix through its own keys
    mask4 = torch.cat([prefix_keys, self_keys], dim=-1)[:, None]  # [N + 1, 1, T2, p + T2]
    # Original (i, j): j < p -> row 0, column j; else row i + 1, column j - p (padding: any index, never read).
    j = torch.arange(t, device=dev)[None].expand(n, t)
    rows = torch.where(j < p, torch.zeros_like(j), torch.arange(1, n + 1, device=dev)[:, None])
    gather = (rows * t2 + torch.where(j < p, j, (j - p).clamp(max=t2 - 1))).reshape(-1)
    return PrefixLayout(ids, position_ids, mask4, gather, p, (n + 1) * t2)


def computed_positions(input_ids: Tensor, attention_mask: Tensor, shared_prefix: bool) -> int:
    """The positions a forward of this micro-batch computes: [rows x longest row], or the repacked batch's (counted
    without building it)."""
    plan = _prefix_and_width(input_ids, attention_mask.bool()) if shared_prefix else None
    n, t = input_ids.shape
    return n * t if plan is None else (n + 1) * plan[1]


def unpack(hidden: Tensor, layout: PrefixLayout, n: int, t: int) -> Tensor:
    """[N + 1, T2, H] states of the repacked rows -> [N, T, H] in the original layout (differentiable)."""
    flat = hidden.reshape(-1, hidden.shape[-1])
    return flat.index_select(0, layout.gather).view(n, t, -1)


def prefix_attention(
    module: torch.nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None, **kwargs: Any
) -> tuple[Tensor, Any]:
    """SDPA where the mask has ``p`` more key columns than the rows have keys: those are row 0's first ``p`` keys and
    values, prepended to every row's (``shared_prefix_layout``); any other call is plain SDPA."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if attention_mask is not None and attention_mask.dim() == 4 and attention_mask.shape[-1] > key.shape[-2]:
        p = attention_mask.shape[-1] - key.shape[-2]
        b = key.shape[0]
        key = torch.cat([key[:1, :, :p].expand(b, -1, -1, -1), key], dim=2)
        value = torch.cat([value[:1, :, :p].expand(b, -1, -1, -1), value], dim=2)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def shared_prefix_active(model: torch.nn.Module) -> bool:
    """Whether ``model``'s attention is ``prefix_attention`` now (inside ``shared_prefix_attention``)."""
    return model.config._attn_implementation == ATTENTION_NAME


@contextmanager
def shared_prefix_attention(model: torch.nn.Module) -> Iterator[None]:
    """Inside: ``model``'s attention is ``prefix_attention`` (registered with transformers once); nested, the outer
    one holds it. Hold it across the backward where layers recompute their forward there (gradient checkpointing):
    the RL update does. Only from SDPA: other implementations (eager, flash) are refused."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    config = model.config
    before = config._attn_implementation
    if before == ATTENTION_NAME:
        yield
        return
    if before != "sdpa":
        raise ValueError(
            f"optim.shared_prefix needs the model's attention to be sdpa, got {before!r}; set optim.shared_prefix=false"
        )
    AttentionInterface.register(ATTENTION_NAME, prefix_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)  # a micro-batch not repacked: SDPA's own mask
    config._attn_implementation = ATTENTION_NAME
    try:
        yield
    finally:
        config._attn_implementation = before
