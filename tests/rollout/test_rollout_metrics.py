"""rollout/zero_adv_groups: the fraction of groups whose rollouts all got the same reward."""

from __future__ import annotations

import pytest

from mempo.core.tasks import Question, Task
from mempo.losses import grpo_advantage
from mempo.rollout.agent import RolloutBatch, Trajectory, rollout_metrics

TASK = Task("t", (Question("q?", ("a",)),))


def batch(rewards_by_group: list[list[float]]) -> RolloutBatch:
    trajs, i = [], 0
    for g, rewards in enumerate(rewards_by_group):
        for r in rewards:
            trajs.append(Trajectory(i, g, TASK, reward=r, finish="answer"))
            i += 1
    return RolloutBatch(trajs)


@pytest.mark.parametrize(
    ("groups", "expected"),
    [
        ([[1.0, 1.0], [0.0, 1.0], [0.0, 0.0]], 2 / 3),  # all-correct and all-wrong groups both count
        ([[0.5, 0.5, 0.5, 0.5]], 1.0),  # mean_f1 rewards: equal non-binary values count too
        ([[0.0, 1.0, 0.0, 0.0], [0.25, 0.5, 0.5, 0.5]], 0.0),
    ],
)
def test_zero_adv_groups(groups: list[list[float]], expected: float) -> None:
    b = batch(groups)
    assert rollout_metrics(b)["rollout/zero_adv_groups"] == pytest.approx(expected)
    # Independently: the groups the metric counts are exactly those whose GRPO advantages are all 0.
    x = b.to_tensors(pad_id=0)
    adv = grpo_advantage(x.rewards, x.traj_group_ids)
    zero = [bool((adv[x.traj_group_ids == g] == 0).all()) for g in range(len(groups))]
    assert sum(zero) / len(groups) == pytest.approx(expected)
