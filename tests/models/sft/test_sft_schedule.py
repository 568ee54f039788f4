"""The warm start's learning-rate schedule and its target-only output head."""

from __future__ import annotations

import math

import pytest
import torch

from mempo.models.sft import SFTExample, SFTModule, collate_sft, lr_factor


def test_warmup_then_cosine_down_to_the_floor() -> None:
    kw = {"warmup_steps": 4, "total_steps": 24, "schedule": "cosine", "min_lr_ratio": 0.1}
    assert [lr_factor(s, **kw) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    # Halfway through the decay (step 4 + 10) the cosine is at the midpoint between 1 and the floor.
    assert lr_factor(14, **kw) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lr_factor(24, **kw) == pytest.approx(0.1) and lr_factor(30, **kw) == pytest.approx(0.1)
    assert lr_factor(10, **{**kw, "schedule": "constant"}) == 1.0
    with pytest.raises(ValueError, match="sft.lr_schedule"):
        SFTModule(torch.nn.Linear(1, 1), lr_schedule="linear")


def test_target_only_head_gives_the_hand_computed_nll(tiny_policy) -> None:
    """The loss equals -mean log p(target token | prefix) from one plain full-vocabulary forward."""
    policy, _ = tiny_policy
    batch = collate_sft([SFTExample([5, 6, 7], [8, 9]), SFTExample([5, 6], [10, 11, 12])], pad_id=0)
    module = SFTModule(policy)
    module.log = lambda *a, **k: None  # no trainer attached
    module.optimizers = lambda: torch.optim.SGD(policy.parameters(), lr=0.0)
    loss = module.training_step(batch, 0)
    logits = policy(input_ids=torch.tensor([[5, 6, 7, 8, 9], [5, 6, 10, 11, 12]])).logits.float()
    logp = torch.log_softmax(logits, -1)
    terms = [logp[0, 2, 8], logp[0, 3, 9], logp[1, 1, 10], logp[1, 2, 11], logp[1, 3, 12]]
    torch.testing.assert_close(loss, -torch.stack(terms).mean())
