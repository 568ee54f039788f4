"""The memory-advantage switches of docs/algorithm.md §3.6 (std floor, centring only, per-objective scoring), each
against values worked out by hand in the comments."""

import math

import pytest
import torch
from torch.testing import assert_close

from mempo.losses import (
    AdvantageConfig,
    AdvantageInputs,
    MemoryConfig,
    answer_probability,
    compute_advantages,
    group_normalize,
    groups_with_signal,
    memory_advantage,
    memory_advantages,
    per_objective_answer_probability,
)


def test_std_floor_keeps_near_equal_scores_near_zero():
    # One group, R^M = [0.001, 0.003]: mean 0.002, centred -+0.001, unbiased std sqrt(2e-6) = 0.0014142.
    r = torch.tensor([0.001, 0.003], dtype=torch.float64)
    g = torch.zeros(2, dtype=torch.long)
    plain = memory_advantage(r, g, g)
    assert_close(plain, torch.tensor([-0.001, 0.001], dtype=torch.float64) / (math.sqrt(2e-6) + 1e-6))  # -+0.7066
    floored = memory_advantage(r, g, g, std_floor=0.1)  # the divisor is max(0.0014142, 0.1) + 1e-6 = 0.100001
    assert_close(floored, torch.tensor([-0.001, 0.001], dtype=torch.float64) / 0.100001)  # -+0.0099999
    # A floor below the group's std changes nothing: R^M = [0, 1] has std 0.7071.
    wide = torch.tensor([0.0, 1.0], dtype=torch.float64)
    assert_close(memory_advantage(wide, g, g, std_floor=0.1), memory_advantage(wide, g, g))


def test_unscaled_memory_advantage_is_only_centred():
    r = torch.tensor([0.2, 0.4, 0.9, 0.1])  # groups {0, 1}: mean 0.3; {2, 3}: mean 0.5
    g = torch.tensor([0, 0, 1, 1])
    assert_close(memory_advantage(r, g, g, scale=False), torch.tensor([-0.1, 0.1, 0.4, -0.4]))


def test_group_normalize_floor_default_is_the_plain_z_score():
    v, g = torch.tensor([1.0, 2.0, 4.0]), torch.zeros(3, dtype=torch.long)
    # mean 7/3, unbiased std sqrt(((4/3)^2 + (1/3)^2 + (5/3)^2) / 2) = sqrt(7/3) = 1.5275
    expected = (v - 7 / 3) / (math.sqrt(7 / 3) + 1e-6)
    assert_close(group_normalize(v, g), expected)
    assert_close(group_normalize(v, g, std_floor=0.0), expected)


def test_per_turn_with_floor_through_the_estimator_inputs():
    # One task (group 0), two rollouts of two turns; memories of turn 1 score 0.001 and 0.002, of turn 2 0.5, 0.7.
    x = AdvantageInputs(
        rewards=torch.tensor([1.0, 0.0]),
        group_ids=torch.tensor([0, 0]),
        traj_ids=torch.tensor([0, 0, 1, 1]),
        turn_ids=torch.tensor([1, 2, 1, 2]),
        mem_rewards=torch.tensor([0.001, 0.5, 0.002, 0.7]),
        mem_valid=torch.tensor([True, True, True, True]),
        response_mask=torch.ones(4, 3, dtype=torch.bool),
        mem_mask=torch.ones(4, 3, dtype=torch.bool),
    )
    adv = AdvantageConfig()
    # per_turn, floor 0.1: turn 1: centred -+0.0005, std 0.000707 -> floor 0.1: -+0.0005/0.100001;
    # turn 2: centred -+0.1, std 0.141421 (above the floor): -+0.1/0.141422 = -+0.70710.
    got = memory_advantages(x, MemoryConfig(normalize="per_turn", std_floor=0.1), adv)
    assert_close(got, torch.tensor([-0.0005 / 0.100001, -0.1 / (0.1 * math.sqrt(2) + 1e-6), 0.0005 / 0.100001,
                                    0.1 / (0.1 * math.sqrt(2) + 1e-6)]))  # fmt: skip
    # pooled (the paper's reading): the turn-1 plans sit far below every turn-2 memory.
    pooled = memory_advantages(x, MemoryConfig(), adv)
    assert (pooled[[0, 2]] < -0.8).all() and (pooled[[1, 3]] > 0.5).all()
    # An invalid memory gets 0 and stays out of its group's statistics.
    masked = AdvantageInputs(**{**x.__dict__, "mem_valid": torch.tensor([True, True, False, True])})
    got = memory_advantages(masked, MemoryConfig(normalize="per_turn", scale=False), adv)
    assert_close(got, torch.tensor([0.0, -0.1, 0.0, 0.1]))


def test_per_objective_probability_by_hand():
    # Row 0: objective 0 tokens p = 0.5, 0.5; a separator (p 0.9, unscored); objective 1 tokens p = 0.01, 0.04.
    #   per objective: exp(mean log) = 0.5 and sqrt(0.0004) = 0.02 -> mean 0.26.
    #   joint over the four answer tokens: (0.5 * 0.5 * 0.01 * 0.04) ** (1/4) = 0.0001 ** 0.25 = 0.1.
    # Row 1: one objective (tokens p = 0.2, 0.8), then padding (-1): per objective = joint = sqrt(0.16) = 0.4.
    logp = torch.log(torch.tensor([[0.5, 0.5, 0.9, 0.01, 0.04], [0.2, 0.8, 1.0, 1.0, 1.0]], dtype=torch.float64))
    ids = torch.tensor([[0, 0, -1, 1, 1], [0, 0, -1, -1, -1]])
    assert_close(per_objective_answer_probability(logp, ids), torch.tensor([0.26, 0.4], dtype=torch.float64))
    assert_close(answer_probability(logp, ids >= 0), torch.tensor([0.1, 0.4], dtype=torch.float64))
    none = per_objective_answer_probability(logp[:1], torch.full((1, 5), -1))
    assert_close(none, torch.zeros(1, dtype=torch.float64))


@pytest.mark.parametrize(
    "kwargs, key",
    [({"std_floor": -0.1}, "memory.std_floor"), ({"scoring": "max"}, "memory.scoring"),
     ({"scoring_context": "chat"}, "memory.scoring_context")],
)  # fmt: skip
def test_memory_config_names_the_bad_key(kwargs, key):
    with pytest.raises(ValueError, match=key):
        MemoryConfig(**kwargs)


def test_require_traj_signal_silences_groups_whose_rewards_are_equal():
    # Task 0: rewards 1, 0 (A^T +-0.7071); task 1: rewards 1, 1 (A^T 0). One memory a rollout, pooled per task:
    # task 0's R^M 0.2, 0.6 -> mean 0.4, centred -+0.2, unbiased std sqrt(0.08) = 0.28284 -> -+0.70711;
    # task 1's R^M 0.1, 0.5 -> the same -+0.70711 without the gate, 0 with it.
    x = AdvantageInputs(
        rewards=torch.tensor([1.0, 0.0, 1.0, 1.0]),
        group_ids=torch.tensor([0, 0, 1, 1]),
        traj_ids=torch.tensor([0, 1, 2, 3]),
        turn_ids=torch.tensor([1, 1, 1, 1]),
        mem_rewards=torch.tensor([0.2, 0.6, 0.1, 0.5]),
        mem_valid=torch.tensor([True, True, True, True]),
        response_mask=torch.ones(4, 2, dtype=torch.bool),
        mem_mask=torch.tensor([[True, False]] * 4),
    )
    z = 0.2 / (math.sqrt(0.08) + 1e-6)  # 0.70711
    adv = AdvantageConfig()
    assert_close(memory_advantages(x, MemoryConfig(), adv), torch.tensor([-z, z, -z, z]))
    gated = memory_advantages(x, MemoryConfig(require_traj_signal=True), adv)
    assert_close(gated, torch.tensor([-z, z, 0.0, 0.0]))
    # Through the estimator: task 1's tokens carry nothing at all (A^T = 0 and A^M = 0); task 0's memory token
    # gets A^T + A^M = +-z + -+z, its other token A^T alone.
    tokens = compute_advantages(x, MemoryConfig(require_traj_signal=True), adv)
    a_t = 0.5 / (math.sqrt(0.5) + 1e-6)  # rewards 1, 0: centred +-0.5, std sqrt(0.5) -> 0.70711
    expected = torch.tensor([[a_t - z, a_t], [-a_t + z, -a_t], [0.0, 0.0], [0.0, 0.0]])
    assert_close(tokens, expected)


def test_groups_with_signal():
    rewards = torch.tensor([0.5, 0.5, 0.0, 1.0, 0.3])
    groups = torch.tensor([7, 7, 2, 2, 9])  # a group of one has no signal
    assert groups_with_signal(rewards, groups).tolist() == [False, False, True, True, False]
