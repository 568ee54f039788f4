"""A user's advantage estimator given by file path, for the two-process check (tests/stages/test_plugins.py): each
rank that updates with it (torch.distributed initialised) touches ``$MEMPO_RANK_MARKERS/estimator-rank<r>``; its
advantages are +1 on every response token of an even trajectory and -1 on an odd one (a nonzero update whatever the
rewards, as fsdp_probe.py's probe_signed)."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from mempo.losses import AdvantageConfig, AdvantageInputs, MemoryConfig


def rank_signed(x: AdvantageInputs, memory: MemoryConfig, advantage: AdvantageConfig) -> torch.Tensor:
    folder = os.environ.get("MEMPO_RANK_MARKERS")
    if folder and torch.distributed.is_available() and torch.distributed.is_initialized():
        (Path(folder) / f"estimator-rank{torch.distributed.get_rank()}").touch()
    sign = 1.0 - 2.0 * (x.traj_ids % 2).float()  # [N]
    return sign[:, None] * x.response_mask.float()
