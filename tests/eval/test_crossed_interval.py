"""The study's verdict interval under its crossed design (every seed scored on the same tasks): the seed-plus-task
t-interval and the crossed bootstrap (mempo.eval.stats) worked out by hand, and their coverage of a known mean in
simulated studies d[s, t] = mu + u_t + v_s + e_st, against the seed-only t-interval that S1-S4 read.

Variances: "S3-like" is the fit to S3's mempo - warm_start row (K = 3, T = 128; seed-only t-interval [0.007, 0.019],
two-level bootstrap [0.001, 0.024]): s_u = 0.105 (tasks), s_v = 0.002 (seeds), s_e = 0.03; simulated, the seed-only
t-interval is 0.014 wide there, as S3's 0.012. "Seed-dominated": s_u = 0.02, s_v = 0.03, s_e = 0.03, the seed-to-seed
spread of S2 (about 0.03 EM) with a small task term."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mempo.eval.seeds import compare, comparison_table
from mempo.eval.stats import crossed_bootstrap, seed_task_t_interval, t_interval, t_quantile

K, T = 3, 128
S3_LIKE = (0.105, 0.002, 0.03)  # s_u (task), s_v (seed), s_e (rest)
SEED_DOMINATED = (0.02, 0.03, 0.03)


def crossed(sds: tuple[float, float, float], replicates: int, seed: int) -> np.ndarray:
    """[replicates, K, T] paired differences of simulated studies with true mean 0."""
    su, sv, se = sds
    rng = np.random.default_rng(seed)
    return (
        rng.normal(0.0, su, (replicates, 1, T))
        + rng.normal(0.0, sv, (replicates, K, 1))
        + rng.normal(0.0, se, (replicates, K, T))
    )


def test_the_seed_plus_task_interval_by_hand() -> None:
    # d [K = 2, T = 3]. Seed means 0.2, 0.4: s^2 = 0.02, / K = 0.01. Task means over the seeds 0.1, 0.3, 0.5:
    # s^2 = 0.04, / T = 0.04 / 3. Var = 0.01 + 0.013333 = 0.023333.
    # Satterthwaite df = Var^2 / (0.01^2 / 1 + 0.013333^2 / 2) = 0.00054444 / 0.00018889 = 2.8824.
    # t quantile at 0.95 between df 2 (4.3027) and 3 (3.1824), harmonic in 1 / df:
    # w = (1/2 - 1/2.8824) / (1/2 - 1/3) = 0.91837 -> 4.3027 - 0.91837 * 1.1203 = 3.2739 (the exact t(2.8824) is
    # 3.2572: the interpolation is 0.5% wider). Half-width 3.2739 * sqrt(0.023333) = 0.50010.
    d = [[0.0, 0.2, 0.4], [0.2, 0.4, 0.6]]
    mean, low, high, df = seed_task_t_interval(d)
    var = 0.02 / 2 + 0.04 / 3
    df_hand = var**2 / ((0.02 / 2) ** 2 / 1 + (0.04 / 3) ** 2 / 2)
    w = (1 / 2 - 1 / df_hand) / (1 / 2 - 1 / 3)
    half = (4.3027 - w * (4.3027 - 3.1824)) * math.sqrt(var)
    assert df == pytest.approx(2.882352941) and df == pytest.approx(df_hand)
    assert (mean, low, high) == pytest.approx((0.3, 0.3 - half, 0.3 + half))
    assert half == pytest.approx(0.50010, abs=1e-4)
    # The seed-only t sees the seed means alone: 0.3 +- 12.7062 * sqrt(0.02) / sqrt(2) = 0.3 +- 1.27062
    assert t_interval([0.2, 0.4]) == pytest.approx((0.3, 0.3 - 1.27062, 0.3 + 1.27062))


def test_a_task_term_alone_is_seen_where_the_seed_only_t_is_zero_wide() -> None:
    # Every seed's mean is 0.25 (the seed-only t: [0.25, 0.25]); the task means over seeds are 0.2, 0.2, 0.3, 0.3:
    # s^2 = 0.0033333, / T = 0.00083333; seed term 0, so df = T - 1 = 3 exactly, t(3) = 3.1824:
    # 0.25 +- 3.1824 * sqrt(0.00083333) = 0.25 +- 0.091868.
    d = [[0.1, 0.3, 0.2, 0.4], [0.3, 0.1, 0.4, 0.2], [0.2, 0.2, 0.3, 0.3]]
    assert t_interval([0.25, 0.25, 0.25]) == pytest.approx((0.25, 0.25, 0.25))
    mean, low, high, df = seed_task_t_interval(d)
    half = 3.1824 * math.sqrt((0.01 / 3) / 4)
    assert df == pytest.approx(3.0) and (mean, low, high) == pytest.approx((0.25, 0.25 - half, 0.25 + half))
    with pytest.raises(ValueError, match=r"\[seeds, tasks\] matrix with >= 2 seeds"):
        seed_task_t_interval([[0.1, 0.2]])
    with pytest.raises(ValueError, match="NaN"):
        seed_task_t_interval([[0.1, float("nan")], [0.2, 0.3]])


def test_the_t_quantile_between_whole_df_is_at_or_just_above_the_exact_one() -> None:
    mpmath = pytest.importorskip("mpmath")  # torch's own dependency (sympy's); the exact quantiles come from it

    def exact(df: float) -> float:  # the upper 2.5% point: I_{df / (df + x^2)}(df / 2, 1 / 2) / 2 = 0.025
        f = lambda x: mpmath.betainc(df / 2, 0.5, 0, df / (df + x * x), regularized=True) / 2 - 0.025  # noqa: E731
        return float(mpmath.findroot(f, 2.5))

    for df in (2.2, 2.5, 2.88, 3.5, 5.5, 10.5, 29.5, 30.5, 47.3, 113.7):
        got, want = t_quantile(df), exact(df)
        assert want - 1e-4 <= got <= want * (1.02 if df >= 2 else 1.2), (df, got, want)
    assert t_quantile(1.5) == pytest.approx(12.7062 - (1 - 1 / 1.5) * 2 * (12.7062 - 4.3027))
    with pytest.raises(ValueError, match="df must be >= 1"):
        t_quantile(0.5)


def test_the_crossed_bootstrap_draws_one_task_vector_for_every_seed() -> None:
    """Two identical seeds of 0/1 tasks: the crossed bootstrap is the tasks' bootstrap over T (one shared task draw);
    one drawn per seed, as the nested bootstrap did, would narrow it by sqrt(2). The normal interval of a proportion
    0.5 over 100 tasks is +-1.96 * 0.05 = +-0.098."""
    row = [0.0] * 50 + [1.0] * 50
    mean, low, high = crossed_bootstrap([row, row], n_resamples=20_000)
    # Monte Carlo error of the percentile endpoints with 20k resamples is ~0.001; 0.006 leaves room for it.
    assert mean == 0.5 and abs((high - low) / 2 - 0.098) < 0.006
    # Constant within each seed: only the seeds vary. Seeds 0 and 1: a draw's mean is 0, 0.5 or 1 with
    # probabilities 1/4, 1/2, 1/4, so the 2.5% and 97.5% points are exactly 0 and 1.
    assert crossed_bootstrap([[0.0] * 5, [1.0] * 5]) == (0.5, 0.0, 1.0)
    assert crossed_bootstrap([[0.25] * 4, [0.25] * 4]) == (0.25, 0.25, 0.25)


def coverage(intervals: list[tuple[float, float]], mu: float = 0.0) -> float:
    return float(np.mean([lo <= mu <= hi for lo, hi in intervals]))


@pytest.mark.parametrize(("sds", "old_in_band"), [(S3_LIKE, False), (SEED_DOMINATED, True)])
def test_coverage_of_the_seed_plus_task_interval_by_simulation(sds, old_in_band) -> None:
    """4000 simulated studies (K = 3, T = 128, true mean 0): the verdict's interval covers at 0.92-0.98 (Monte Carlo
    SE 0.0035) in both regimes; the seed-only t (S1-S4's) only where the seeds dominate: about 0.52 at S3-like."""
    d = crossed(sds, 4000, seed=0)
    new = coverage([seed_task_t_interval(x)[1:3] for x in d])
    old = coverage([t_interval(x.mean(axis=1))[1:] for x in d])
    assert 0.92 <= new <= 0.98, new
    assert (0.92 <= old <= 0.98) == old_in_band, old
    if not old_in_band:
        assert old < 0.6, old


@pytest.mark.parametrize(("sds", "in_band"), [(S3_LIKE, True), (SEED_DOMINATED, False)])
def test_coverage_of_the_crossed_bootstrap_by_simulation(sds, in_band) -> None:
    """400 studies, 1000 resamples each (SE about 0.011): the crossed bootstrap covers near 95% where the tasks
    dominate and about 0.75 where 3 seeds dominate (3 seeds give 10 distinct draws, no t correction): why the
    verdict reads the t-interval."""
    d = crossed(sds, 400, seed=1)
    got = coverage([crossed_bootstrap(x, n_resamples=1000, seed=i)[1:] for i, x in enumerate(d)])
    assert (got >= 0.92) == in_band, got
    if not in_band:
        assert got < 0.85, got


def test_the_verdict_of_a_null_effect_says_includes_0_at_the_nominal_rate() -> None:
    """Through ``compare`` (what the study and ``report --arm`` read): 1000 simulated S3-like studies of two arms
    with no difference (true mean 0). The verdict must say "includes 0" in 92-98% of them; a verdict from the
    seed-only t says "above 0" or "below 0" in about half."""
    d = crossed(S3_LIKE, 1000, seed=2)
    tasks = [f"t{j:03d}" for j in range(T)]
    zeros = {s: dict.fromkeys(tasks, 0.0) for s in range(K)}
    verdicts = [compare(zeros, {s: dict(zip(tasks, x[s])) for s in range(K)}, n_resamples=50)["verdict"] for x in d]
    includes = float(np.mean([v == "includes 0" for v in verdicts]))
    assert 0.92 <= includes <= 0.98, includes


def test_one_seed_shows_no_interval_and_no_df_0() -> None:
    """At K = 1 there is no seed term to estimate: no interval, the verdict says so, and the table shows "(one seed)"
    in the interval column (no "df=0" anywhere); the bootstrap column is then the tasks' bootstrap."""
    a = {0: {"t0": 0.0, "t1": 1.0, "t2": 0.0}}
    b = {0: {"t0": 1.0, "t1": 1.0, "t2": 0.0}}
    r = compare(a, b)
    text = comparison_table([{"arm": "b", "against": "a", "N": 2, "em": r}], ("em",))
    assert "df=0" not in text and "df = 0" not in text
    row = next(line for line in text.splitlines() if line.startswith("| b - a"))
    assert "| (one seed) |  |" in row  # the interval column, then an empty df column
    assert r["interval"] is None and r["df"] is None and r["verdict"] == "one seed: no interval"
