"""RLOO's leave-one-out baseline as an advantage estimator
(``advantage.estimator=examples/rloo_advantage.py:rloo``).

Each trajectory's advantage is its reward minus the mean reward of the other trajectories of its task's group
(Kool et al. 2019; Ahmadian et al. 2024), on every response token of every turn it took; no std scaling, no memory
advantage (``needs_memory_scores = False``: the memory-scoring forward is skipped). A group of one gets 0.

    python experiments/run.py +exp=grpo_cpu advantage.estimator=examples/rloo_advantage.py:rloo
"""

from __future__ import annotations

import torch
from torch import Tensor

from mempo.losses import AdvantageConfig, AdvantageInputs, MemoryConfig


def rloo(x: AdvantageInputs, memory: MemoryConfig, advantage: AdvantageConfig) -> Tensor:
    """[N, T] token advantages: (R_i - mean of the group's other rewards) on trajectory i's response tokens."""
    groups = x.group_ids.long()
    r = x.rewards.float()
    total = torch.zeros(int(groups.max()) + 1, dtype=r.dtype, device=r.device).index_add_(0, groups, r)
    count = torch.zeros_like(total).index_add_(0, groups, torch.ones_like(r))
    others = (count[groups] - 1).clamp(min=1)
    adv = torch.where(count[groups] > 1, r - (total[groups] - r) / others, torch.zeros_like(r))  # [R]
    return adv[x.traj_ids.long()].unsqueeze(1) * x.response_mask.float()


rloo.needs_memory_scores = False
