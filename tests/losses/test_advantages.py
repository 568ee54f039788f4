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
    grpo_advantage,
    memory_advantage,
    memory_rewards,
    register_advantage,
    scores_memories,
    token_advantages,
    uses_memory_rewards,
)


def naive_group_normalize(values, group_ids, scale=True, eps=1e-6):
    out = torch.zeros_like(values)
    for g in set(group_ids.tolist()):
        idx = [i for i, x in enumerate(group_ids.tolist()) if x == g]
        v = values[idx]
        centered = v - v.mean()
        if scale:
            std = v.std() if len(idx) > 1 else torch.tensor(0.0, dtype=values.dtype)
            centered = centered / (std + eps)
        out[idx] = centered
    return out


def test_group_normalize_hand_computed():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    groups = torch.tensor([0, 0, 0, 0, 7, 7])
    std = math.sqrt(1 / 3)  # unbiased std of [1, 0, 0, 1]
    expected = torch.tensor([0.5, -0.5, -0.5, 0.5, 0.0, 0.0]) / (std + 1e-6)
    expected[4:] = 0.0  # equal rewards: zero advantage, not NaN
    assert_close(grpo_advantage(rewards, groups), expected)
    assert_close(grpo_advantage(rewards, groups, scale=False), torch.tensor([0.5, -0.5, -0.5, 0.5, 0.0, 0.0]))


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("scale", [True, False])
def test_group_normalize_matches_naive_loop(seed, scale):
    gen = torch.Generator().manual_seed(seed)
    m = int(torch.randint(1, 40, (1,), generator=gen))
    values = torch.randn(m, generator=gen, dtype=torch.float64)
    groups = torch.randint(0, 6, (m,), generator=gen) * 3 - 5  # non-contiguous, negative ids
    assert_close(group_normalize(values, groups, scale=scale), naive_group_normalize(values, groups, scale=scale))


def test_degenerate_groups_are_zero_not_nan():
    values = torch.tensor([3.0, 2.0, 2.0, 2.0])
    groups = torch.tensor([0, 1, 1, 1])  # a group of one and a group of equal values
    out = group_normalize(values, groups)
    assert torch.isfinite(out).all()
    assert_close(out, torch.zeros(4))
    assert group_normalize(torch.empty(0), torch.empty(0, dtype=torch.long)).numel() == 0


def test_memory_advantage_pooled_vs_per_turn():
    r = torch.tensor([0.1, 0.3, 0.2, 0.6, 0.5, 0.5])
    groups = torch.tensor([0, 0, 0, 0, 1, 1])
    turns = torch.tensor([1, 2, 1, 2, 1, 1])
    pooled = memory_advantage(r, groups, turns, normalize="pooled")
    assert_close(pooled, naive_group_normalize(r, groups))
    per_turn = memory_advantage(r, groups, turns, normalize="per_turn")
    keys = torch.tensor([0, 1, 0, 1, 2, 2])
    assert_close(per_turn, naive_group_normalize(r, keys))
    with pytest.raises(ValueError, match="memory.normalize"):
        memory_advantage(r, groups, turns, normalize="global")


def test_answer_probability_is_geometric_mean():
    logp = torch.log(torch.tensor([[0.5, 0.25, 0.9], [0.8, 0.1, 0.1]]))
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    assert_close(answer_probability(logp, mask), torch.tensor([math.sqrt(0.5 * 0.25), 0.8]))


def test_memory_rewards_baselines():
    # Trajectory 3 writes memories at turns 1, 2, 3 (given out of order); trajectory 5 at turn 1 only.
    p = torch.tensor([0.4, 0.2, 0.3, 0.7])
    p_empty = torch.tensor([0.1, 0.1, 0.05, 0.1])
    traj = torch.tensor([3, 3, 5, 3])
    turn = torch.tensor([2, 1, 1, 3])
    prev = memory_rewards(p, p_empty, traj, turn, baseline="previous_memory")
    assert_close(prev, torch.tensor([0.4 - 0.2, 0.2 - 0.1, 0.3 - 0.05, 0.7 - 0.4]))
    assert_close(memory_rewards(p, p_empty, traj, turn, baseline="question_only"), p - p_empty)
    assert_close(memory_rewards(p, p_empty, traj, turn, baseline="none"), p)
    with pytest.raises(ValueError, match="memory.baseline"):
        memory_rewards(p, p_empty, traj, turn, baseline="oracle")


def naive_previous_memory(p, p_empty, traj, turn):
    out = []
    for i in range(len(p)):
        earlier = [j for j in range(len(p)) if traj[j] == traj[i] and turn[j] < turn[i]]
        base = p[max(earlier, key=lambda j: turn[j])] if earlier else p_empty[i]
        out.append(p[i] - base)
    return torch.stack(out) if out else p.clone()


@pytest.mark.parametrize("seed", range(5))
def test_memory_rewards_previous_matches_naive(seed):
    gen = torch.Generator().manual_seed(seed)
    n_traj = int(torch.randint(1, 6, (1,), generator=gen))
    traj, turn = [], []
    for t in range(n_traj):
        k = int(torch.randint(1, 5, (1,), generator=gen))
        turns = torch.randperm(8, generator=gen)[:k] + 1  # distinct turns, possibly with gaps
        traj += [t * 2] * k
        turn += turns.tolist()
    perm = torch.randperm(len(traj), generator=gen)
    traj, turn = torch.tensor(traj)[perm], torch.tensor(turn)[perm]
    p = torch.rand(len(traj), generator=gen)
    p_empty = torch.rand(len(traj), generator=gen)
    got = memory_rewards(p, p_empty, traj, turn, baseline="previous_memory")
    assert_close(got, naive_previous_memory(p, p_empty, traj, turn))


def _turn_batch(seed, n_traj=6, group_size=3, t_len=12):
    """A random batch of turn samples: each trajectory has 1-3 turns; memory spans inside responses."""
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.randint(0, 2, (n_traj,), generator=gen).float()
    group_ids = torch.arange(n_traj) // group_size
    traj_ids, turn_ids = [], []
    for r in range(n_traj):
        k = int(torch.randint(1, 4, (1,), generator=gen))
        traj_ids += [r] * k
        turn_ids += list(range(1, k + 1))
    n = len(traj_ids)
    response_mask = torch.zeros(n, t_len, dtype=torch.bool)
    mem_mask = torch.zeros(n, t_len, dtype=torch.bool)
    for i in range(n):
        start = int(torch.randint(1, 5, (1,), generator=gen))
        end = int(torch.randint(start + 2, t_len + 1, (1,), generator=gen))
        response_mask[i, start:end] = True
        mem_mask[i, start : start + 2] = True
    return AdvantageInputs(
        rewards=rewards,
        group_ids=group_ids,
        traj_ids=torch.tensor(traj_ids),
        turn_ids=torch.tensor(turn_ids),
        mem_rewards=torch.rand(n, generator=gen),
        mem_valid=torch.rand(n, generator=gen) > 0.2,
        response_mask=response_mask,
        mem_mask=mem_mask,
    )


@pytest.mark.parametrize("seed", range(4))
def test_mempo_estimator_matches_naive_loop(seed):
    x = _turn_batch(seed)
    adv = compute_advantages(x, MemoryConfig(alpha=0.7, normalize="pooled"), AdvantageConfig("mempo"))
    traj_adv = naive_group_normalize(x.rewards, x.group_ids)
    valid = [i for i in range(len(x.traj_ids)) if x.mem_valid[i]]
    mem_groups = x.group_ids[x.traj_ids][valid]
    mem_adv = dict(zip(valid, naive_group_normalize(x.mem_rewards[valid], mem_groups).tolist()))
    expected = torch.zeros_like(adv)
    for i in range(adv.shape[0]):
        for t in range(adv.shape[1]):
            if x.response_mask[i, t]:
                a = traj_adv[x.traj_ids[i]].item()
                if x.mem_mask[i, t] and i in mem_adv:
                    a += 0.7 * mem_adv[i]
                expected[i, t] = a
    assert_close(adv, expected)


@pytest.mark.parametrize("seed", range(4))
def test_alpha_zero_is_exactly_grpo(seed):
    x = _turn_batch(seed)
    grpo = compute_advantages(x, MemoryConfig(), AdvantageConfig("grpo"))
    nomem = compute_advantages(x, MemoryConfig(alpha=0.0), AdvantageConfig("mempo"))
    assert torch.equal(grpo, nomem)
    with_mem = compute_advantages(x, MemoryConfig(alpha=1.0), AdvantageConfig("mempo"))
    assert not torch.equal(grpo, with_mem)  # the memory term does change memory tokens
    assert torch.equal(grpo[~x.mem_mask], with_mem[~x.mem_mask])


def test_token_advantages_hand_computed():
    resp = torch.tensor([[0, 1, 1, 1, 0]], dtype=torch.bool)
    mem = torch.tensor([[1, 1, 1, 0, 0]], dtype=torch.bool)  # the prompt token is never an advantage carrier
    adv = token_advantages(torch.tensor([2.0]), torch.tensor([-1.0]), resp, mem, alpha=0.5)
    assert_close(adv, torch.tensor([[0.0, 1.5, 1.5, 2.0, 0.0]]))


def test_registry_rejects_unknown_and_duplicates():
    with pytest.raises(ValueError, match="advantage.estimator must be one of .* got 'nope'"):
        AdvantageConfig("nope")
    with pytest.raises(ValueError, match="already registered"):
        register_advantage("grpo", needs_memory_scores=False)(lambda x, m, a: x.response_mask.float())


def test_estimators_declare_whether_they_read_memory_scores():
    """The module skips the memory-scoring forward exactly when the estimator says it does not read R^M."""
    assert AdvantageConfig("mempo").needs_memory_scores
    assert not AdvantageConfig("grpo").needs_memory_scores
    x = _turn_batch(2)
    moved = AdvantageInputs(**{**x.__dict__, "mem_rewards": x.mem_rewards + 5.0 * torch.randn_like(x.mem_rewards)})
    for name in ("grpo", "mempo"):
        a, b = (compute_advantages(inp, MemoryConfig(), AdvantageConfig(name)) for inp in (x, moved))
        assert torch.equal(a, b) != AdvantageConfig(name).needs_memory_scores, name


def test_registry_accepts_a_new_estimator():
    @register_advantage("test_constant_one", needs_memory_scores=False)
    def const(x: AdvantageInputs, memory: MemoryConfig, advantage: AdvantageConfig) -> torch.Tensor:
        return x.response_mask.float()

    x = _turn_batch(1)
    out = compute_advantages(x, MemoryConfig(), AdvantageConfig("test_constant_one"))
    assert_close(out, x.response_mask.float())


@pytest.mark.parametrize(
    ("estimator", "alpha", "log_p_ans", "uses", "scores"),
    [
        ("mempo", 1.0, False, True, True),  # MemPO: R^M in the advantage, every memory scored
        ("mempo", 0.0, False, False, False),  # the ablation: no forward at all
        ("mempo", 0.0, True, False, True),  # the ablation that logs P(ans | q, m) only
        ("grpo", 1.0, False, False, False),  # GRPO reads no R^M whatever alpha says
        ("grpo", 1.0, True, False, True),
    ],
)
def test_which_runs_score_their_memories(estimator, alpha, log_p_ans, uses, scores) -> None:
    memory, advantage = MemoryConfig(alpha=alpha, log_p_ans=log_p_ans), AdvantageConfig(estimator=estimator)
    assert (uses_memory_rewards(memory, advantage), scores_memories(memory, advantage)) == (uses, scores)
