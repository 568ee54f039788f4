"""Dynamic sampling (DAPO's reading, ``data.dynamic_sampling``): a group without signal is dropped and more tasks
are rolled out until the step has its number of groups with signal.

A group has signal when some turn sample of it has a nonzero advantage on a response token (in a MemPO arm that
includes the memory advantage A^M). ``MemPOModule`` draws rounds (round 0: the step's own tasks; round r >= 1: tasks
from an injected deterministic stream keyed by step, round and rank) and this module's two functions pick and merge
what each round keeps. Advantages are computed per round and carried over, so every kept group trains on exactly the
advantages its signal was judged on (the estimators normalise within a group).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from mempo.rollout.agent import RolloutBatch, TurnBatch

PER_SAMPLE = ("mem_r", "mem_valid", "p_mem")  # the per-turn-sample tensors of a Draw


@dataclass(frozen=True)
class Draw:
    """One round's rollouts and what the step computes from them: R^M, its validity and P(ans | q, m) per turn sample
    ([N] each), the training tensors and the [N, T] token advantages."""

    rollouts: RolloutBatch
    x: TurnBatch
    adv: torch.Tensor
    mem_r: torch.Tensor
    mem_valid: torch.Tensor
    p_mem: torch.Tensor


def signal_group_ids(adv: torch.Tensor, response_mask: torch.Tensor, group_ids: torch.Tensor) -> list[int]:
    """The group ids (ascending) holding a turn sample with a nonzero advantage on some response token."""
    has = (adv.ne(0) & response_mask).any(-1)
    return sorted({int(g) for g, h in zip(group_ids.tolist(), has.tolist()) if h})


def merge_groups(kept: list[tuple[Draw, list[int]]], pad_id: int) -> Draw:
    """One ``Draw`` of the kept groups of each round, in round order then group order: group and trajectory ids
    renumbered from 0, per-sample tensors taken row for row, advantages cut or zero-padded to the merged width (the
    kept rows' tokens all lie within it)."""
    trajectories, rows, n_groups = [], [], 0
    for draw, gids in kept:
        new_gid = {g: n_groups + i for i, g in enumerate(gids)}
        n_groups += len(gids)
        for t in draw.rollouts.trajectories:
            if t.group_id in new_gid:
                tid, gid = len(trajectories), new_gid[t.group_id]
                turns = [replace(s, traj_id=tid, group_id=gid) for s in t.turns]
                trajectories.append(replace(t, traj_id=tid, group_id=gid, turns=turns))
        rows.append([i for i, s in enumerate(draw.rollouts.samples) if s.group_id in new_gid])
    merged = RolloutBatch(trajectories)
    x = merged.to_tensors(pad_id)
    width = x.input_ids.shape[1]

    def fit(a: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.pad(a, (0, width - a.shape[1])) if a.shape[1] < width else a[:, :width]

    draws = [draw for draw, _ in kept]
    adv = torch.cat([fit(d.adv[r]) for d, r in zip(draws, rows)])
    mem_r, mem_valid, p_mem = (torch.cat([getattr(d, k)[r] for d, r in zip(draws, rows)]) for k in PER_SAMPLE)
    return Draw(merged, x, adv, mem_r, mem_valid, p_mem)
