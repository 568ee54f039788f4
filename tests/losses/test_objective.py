import math

import pytest
import torch
from torch.testing import assert_close

from mempo.losses import (
    AGG_MODES,
    KL_KINDS,
    LossConfig,
    aggregate,
    clipped_surrogate,
    engine_mismatch,
    kl_penalty,
    policy_objective,
    sampled_token_entropy,
    tis_weights,
)
from mempo.losses.aggregate import loss_weights


def test_clipped_surrogate_hand_computed():
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.1, 0.7]]))
    old = torch.zeros(1, 4)
    adv = torch.tensor([[1.0, -1.0, 1.0, 1.0]])
    mask = torch.tensor([[1, 1, 1, 0]], dtype=torch.bool)
    loss, stats = clipped_surrogate(logp, old, adv, mask, eps_low=0.2, eps_high=0.3)
    # r=1.5,A=1 -> min(1.5, 1.3) = 1.3; r=0.5,A=-1 -> min(-0.5, -0.8) = -0.8; r=1.1 unclipped; masked -> 0
    assert_close(loss, torch.tensor([[-1.3, 0.8, -1.1, 0.0]]))
    assert_close(stats["clip_frac"], torch.tensor(2 / 3))
    assert_close(stats["clip_frac_high"], torch.tensor(1 / 3))
    assert_close(stats["clip_frac_low"], torch.tensor(1 / 3))


def test_kl_kinds_hand_computed():
    logp = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-1.5, -1.0]])
    assert_close(kl_penalty(logp, ref, "k1"), torch.tensor([[0.5, -1.0]]))
    assert_close(kl_penalty(logp, ref, "k2"), torch.tensor([[0.125, 0.5]]))
    d = ref - logp
    assert_close(kl_penalty(logp, ref, "k3"), torch.exp(d) - d - 1)
    assert (kl_penalty(logp, ref, "k3") >= 0).all()
    assert_close(kl_penalty(ref, ref, "k3"), torch.zeros(1, 2))
    with pytest.raises(ValueError, match="kl_kind"):
        kl_penalty(logp, ref, "k4")


def naive_aggregate(loss, mask, mode, traj_ids):
    rows = [[loss[i, t].item() for t in range(loss.shape[1]) if mask[i, t]] for i in range(loss.shape[0])]
    if mode == "token_mean":
        flat = [x for r in rows for x in r]
        return sum(flat) / len(flat)
    if mode == "seq_mean_token_mean":
        means = [sum(r) / len(r) for r in rows if r]
        return sum(means) / len(means)
    if mode == "seq_mean_token_sum_norm":
        return sum(sum(r) / loss.shape[1] for r in rows) / len(rows)
    per_traj = {}
    for i, r in enumerate(rows):
        per_traj.setdefault(int(traj_ids[i]), []).extend(r)
    means = [sum(v) / len(v) for v in per_traj.values() if v]
    return sum(means) / len(means)


@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("seed", range(4))
def test_aggregate_matches_naive_loop(mode, seed):
    gen = torch.Generator().manual_seed(seed)
    n, t = int(torch.randint(2, 9, (1,), generator=gen)), int(torch.randint(3, 11, (1,), generator=gen))
    loss = torch.randn(n, t, generator=gen, dtype=torch.float64)
    mask = torch.rand(n, t, generator=gen) > 0.4
    mask[0] = False  # a sample with no tokens
    mask[1, 0] = True
    traj_ids = torch.randint(0, 3, (n,), generator=gen)
    got = aggregate(loss, mask, mode, traj_ids=traj_ids)
    assert_close(got, torch.tensor(naive_aggregate(loss, mask, mode, traj_ids), dtype=torch.float64))


def test_traj_mean_differs_from_seq_mean():
    """A trajectory with two turn samples counts once, weighted by its tokens, under traj_mean_token_mean."""
    loss = torch.tensor([[1.0, 1.0], [3.0, 0.0], [5.0, 5.0]])
    mask = torch.tensor([[1, 1], [1, 0], [1, 1]], dtype=torch.bool)
    traj = torch.tensor([0, 0, 1])
    assert_close(aggregate(loss, mask, "traj_mean_token_mean", traj_ids=traj), torch.tensor((5 / 3 + 5) / 2))
    assert_close(aggregate(loss, mask, "seq_mean_token_mean"), torch.tensor((1 + 3 + 5) / 3))
    assert_close(aggregate(loss, mask, "seq_mean_token_sum_norm"), torch.tensor((2 / 2 + 3 / 2 + 10 / 2) / 3))
    assert_close(aggregate(loss, mask, "token_mean"), torch.tensor(15 / 5))
    with pytest.raises(ValueError, match="traj_ids"):
        aggregate(loss, mask, "traj_mean_token_mean")
    with pytest.raises(ValueError, match="loss.agg"):
        aggregate(loss, mask, "sum")


def test_token_mean_over_two_shards_equals_global():
    """Data parallel: each shard divides by the global token count; the shard losses add to the global mean
    (DDP averages gradients over ranks, so each rank scales by world size; the sum is the invariant)."""
    gen = torch.Generator().manual_seed(0)
    loss = torch.randn(6, 7, generator=gen, dtype=torch.float64)
    mask = torch.rand(6, 7, generator=gen) > 0.3
    total = mask.sum()
    shard_a = aggregate(loss[:2], mask[:2], "token_mean", num_tokens=total)
    shard_b = aggregate(loss[2:], mask[2:], "token_mean", num_tokens=total)
    assert_close(shard_a + shard_b, aggregate(loss, mask, "token_mean"))
    # Without the global count, averaging shard means is not the global token mean (shards differ in size).
    naive = (aggregate(loss[:2], mask[:2], "token_mean") + aggregate(loss[2:], mask[2:], "token_mean")) / 2
    assert not torch.allclose(naive, aggregate(loss, mask, "token_mean"))


@pytest.mark.parametrize("mode", AGG_MODES)
def test_micro_batches_with_global_weights_reproduce_full_batch(mode):
    gen = torch.Generator().manual_seed(3)
    loss = torch.randn(8, 5, generator=gen, dtype=torch.float64)
    mask = torch.rand(8, 5, generator=gen) > 0.3
    traj = torch.tensor([0, 0, 1, 1, 1, 2, 3, 3])
    w = loss_weights(mask, mode, traj_ids=traj).to(loss.dtype)
    parts = sum((loss[s] * w[s]).sum() for s in (slice(0, 3), slice(3, 6), slice(6, 8)))
    assert_close(parts, aggregate(loss, mask, mode, traj_ids=traj))


@pytest.mark.parametrize("kind", KL_KINDS)
@pytest.mark.parametrize("mode", AGG_MODES)
def test_policy_objective_gradients_flow_only_through_logp(kind, mode):
    gen = torch.Generator().manual_seed(1)
    logp = (torch.randn(4, 6, generator=gen) * 0.1 - 1).requires_grad_()
    old = (logp.detach() + torch.randn(4, 6, generator=gen) * 0.1).requires_grad_()
    ref = (logp.detach() + torch.randn(4, 6, generator=gen) * 0.1).requires_grad_()
    adv = torch.randn(4, 6, generator=gen).requires_grad_()
    mask = torch.rand(4, 6, generator=gen) > 0.3
    cfg = LossConfig(kl_coef=0.1, kl_kind=kind, agg=mode)
    loss, metrics = policy_objective(logp, old, adv, mask, cfg, ref_logp=ref, traj_ids=torch.tensor([0, 0, 1, 2]))
    loss.backward()
    assert logp.grad is not None and logp.grad.abs().sum() > 0
    assert old.grad is None and ref.grad is None and adv.grad is None
    assert (logp.grad[~mask] == 0).all()  # masked tokens carry no loss
    assert all(not v.requires_grad for v in metrics.values())


def test_policy_objective_composes_terms():
    gen = torch.Generator().manual_seed(2)
    logp = torch.randn(3, 5, generator=gen) * 0.1 - 1
    old = logp + torch.randn(3, 5, generator=gen) * 0.3
    ref = logp + torch.randn(3, 5, generator=gen) * 0.3
    adv = torch.randn(3, 5, generator=gen)
    mask = torch.rand(3, 5, generator=gen) > 0.2
    traj = torch.tensor([0, 1, 1])
    cfg = LossConfig(eps_low=0.2, eps_high=0.28, kl_coef=0.05, kl_kind="k3")
    loss, metrics = policy_objective(logp, old, adv, mask, cfg, ref_logp=ref, traj_ids=traj)
    pg, _ = clipped_surrogate(logp, old, adv, mask, eps_low=0.2, eps_high=0.28)
    kl = kl_penalty(logp, ref, "k3")
    expected_pg = aggregate(pg, mask, cfg.agg, traj_ids=traj)
    expected_kl = aggregate(kl, mask, cfg.agg, traj_ids=traj)
    assert_close(metrics["pg_loss"], expected_pg)
    assert_close(metrics["kl"], expected_kl)
    assert_close(loss, expected_pg + 0.05 * expected_kl)
    no_kl, m2 = policy_objective(logp, old, adv, mask, LossConfig(kl_coef=0.0, eps_high=0.28), traj_ids=traj)
    assert_close(no_kl, expected_pg)
    assert m2["kl"].item() == 0.0
    with pytest.raises(ValueError, match="ref_logp"):
        policy_objective(logp, old, adv, mask, cfg, traj_ids=traj)


def test_truncated_importance_sampling_weights():
    logp = torch.zeros(1, 3)
    old = torch.zeros(1, 3)
    sampler = torch.log(torch.tensor([[0.5, 2.0, 1.0]]))  # pi_old / pi_sampler = 2, 0.5, 1
    adv = torch.ones(1, 3)
    mask = torch.ones(1, 3, dtype=torch.bool)
    cfg = LossConfig(kl_coef=0.0, agg="token_mean", tis_cap=1.5)
    loss, _ = policy_objective(logp, old, adv, mask, cfg, sampler_logp=sampler)
    assert_close(loss, torch.tensor(-(1.5 + 0.5 + 1.0) / 3))


def test_the_largest_ratio_deviation_is_over_the_masked_tokens():
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.1, 9.0]]))  # the 9.0 is masked out
    _, stats = clipped_surrogate(logp, torch.zeros(1, 4), torch.ones(1, 4), torch.tensor([[1, 1, 1, 0]]).bool())
    assert_close(stats["ratio_dev_max"], torch.tensor(0.5))  # |0.5 - 1| beats |1.5 - 1| = 0.5 and |1.1 - 1|
    _, same = clipped_surrogate(logp, logp.clone(), torch.ones(1, 4), torch.ones(1, 4).bool())
    assert same["ratio_dev_max"].item() == 0.0  # new and old log-probs from the same forward: exactly 1


def test_engine_mismatch_hand_computed():
    """Known engine and trainer log-probs of a tiny batch: the gap is the mean absolute difference over the masked
    tokens, the clipped share counts the tokens whose pi_old / pi_engine exceeds the cap."""
    old = torch.log(torch.tensor([[0.5, 0.5, 0.5, 0.5], [0.2, 0.9, 0.1, 0.3]]))
    engine = torch.log(torch.tensor([[0.2, 0.5, 0.4, 0.9], [0.2, 0.3, 0.1, 0.01]]))
    mask = torch.tensor([[1, 1, 1, 0], [0, 1, 1, 0]], dtype=torch.bool)  # 5 tokens: ratios 2.5, 1, 1.25, 3, 1
    out = engine_mismatch(old, engine, mask, tis_cap=2.0)
    gaps = [abs(math.log(2.5)), 0.0, abs(math.log(1.25)), abs(math.log(3.0)), 0.0]
    assert_close(out["logp_gap"], torch.tensor(sum(gaps) / 5))
    assert_close(out["row_gap"], torch.tensor([sum(gaps[:3]) / 3, sum(gaps[3:]) / 2]))
    assert_close(out["tis_clip_frac"], torch.tensor(2 / 5))  # 2.5 and 3 exceed 2; the masked-out 30 does not count
    assert engine_mismatch(old, engine, mask, tis_cap=None)["tis_clip_frac"].item() == 0.0
    same = engine_mismatch(engine, engine, mask, tis_cap=2.0)  # old log-probs that are the engine's own
    assert same["logp_gap"].item() == 0.0 and same["tis_clip_frac"].item() == 0.0
    assert_close(tis_weights(old, engine, 2.0)[0], torch.tensor([2.0, 1.0, 1.25, 0.5 / 0.9]))


@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"eps_low": 0.0}, "eps_low"),
        ({"eps_low": 1.0}, "eps_low"),
        ({"eps_high": -0.1}, "eps_high"),
        ({"kl_coef": -1.0}, "kl_coef"),
        ({"kl_kind": "k9"}, "kl_kind"),
        ({"agg": "mean"}, "agg"),
        ({"tis_cap": 0.5}, "tis_cap"),
    ],
)
def test_loss_config_validation_names_the_key(kwargs, key):
    with pytest.raises(ValueError, match=f"loss.{key}"):
        LossConfig(**kwargs)


def test_sampled_token_entropy_estimates_the_sampling_distributions_entropy():
    """Tokens drawn from a known categorical distribution: the mean of -log p over them is within 4 standard errors
    of H(p) = -sum p log p, computed in closed form; masked-out positions count for nothing."""
    gen = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(50, generator=gen, dtype=torch.float64) * 2, -1)
    exact = float(-(p * p.log()).sum())
    y = torch.multinomial(p, 20000, replacement=True, generator=gen)
    logp = p.log()[y].reshape(100, 200)
    mask = torch.ones(100, 200, dtype=torch.bool)
    mask[:, 150:] = False
    garbage = logp.clone()
    garbage[:, 150:] = -1e4  # what the mask leaves out may hold anything
    se = float((-logp[mask]).std()) / math.sqrt(int(mask.sum()))
    got = float(sampled_token_entropy(garbage, mask))
    assert abs(got - exact) < 4 * se, (got, exact, se)
    assert float(sampled_token_entropy(logp, torch.zeros_like(mask))) == 0.0
