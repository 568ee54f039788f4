"""Intervals for evaluations: percentile bootstraps over tasks for per-task metrics (EM, F1) and for paired
differences between two models evaluated on the same tasks; for a study's arms (RL seeds x the same tasks, a crossed
design) the seed-plus-task t-interval its verdict reads and the crossed bootstrap beside it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def bootstrap_ci(
    values: Sequence[float], *, level: float = 0.95, n_resamples: int = 10_000, seed: int = 0
) -> tuple[float, float, float]:
    """-> (mean, low, high): the mean of ``values`` and the percentile bootstrap interval of the mean, resampling
    tasks with replacement. One value gives a zero-width interval."""
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"bootstrap_ci needs a non-empty 1-D sequence, got shape {x.shape}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(n_resamples, x.size))].mean(axis=1)  # [n_resamples]
    alpha = (1.0 - level) / 2.0
    low, high = np.quantile(means, [alpha, 1.0 - alpha])
    return float(x.mean()), float(low), float(high)


def paired_bootstrap_diff(
    a: Sequence[float], b: Sequence[float], *, level: float = 0.95, n_resamples: int = 10_000, seed: int = 0
) -> tuple[float, float, float]:
    """-> (mean of b - a, low, high) over tasks scored by both models (``a[i]`` and ``b[i]`` are the same task):
    the tasks are resampled together, so the interval reflects the models' difference, not the tasks' spread."""
    if len(a) != len(b):
        raise ValueError(f"paired_bootstrap_diff: {len(a)} values against {len(b)}; the tasks must be the same")
    return bootstrap_ci(np.asarray(b, float) - np.asarray(a, float), level=level, n_resamples=n_resamples, seed=seed)


def fmt_ci(mean: float, low: float, high: float) -> str:
    """Formats as 0.712 [0.650, 0.771]."""
    return f"{mean:.3f} [{low:.3f}, {high:.3f}]"


# Seed-level statistics: an RL run's seed is the unit of evidence (the spread between RL seeds, about 0.03-0.04 EM at
# N = 2, is larger than the tasks' at 64 tasks: docs/results.md, S2's result). A comparison of two arms pairs their
# runs by seed and their per-task scores by task: a K x T matrix of paired differences (``seed_task_t_interval``).

# Two-sided t quantiles t_{1 - (1 - level) / 2, df} for df = 1..30 (computed by integrating Student's t density;
# df = 1, 2, 30 at 0.95: 12.706, 4.303, 2.042 as in every printed table). Beyond 30: the Cornish-Fisher expansion
# around the normal quantile (``t_quantile``), within 1e-4 there.
T_QUANTILES: dict[float, tuple[float, ...]] = {
    0.90: (
        6.3138, 2.9200, 2.3534, 2.1318, 2.0150, 1.9432, 1.8946, 1.8595, 1.8331, 1.8125,
        1.7959, 1.7823, 1.7709, 1.7613, 1.7531, 1.7459, 1.7396, 1.7341, 1.7291, 1.7247,
        1.7207, 1.7171, 1.7139, 1.7109, 1.7081, 1.7056, 1.7033, 1.7011, 1.6991, 1.6973,
    ),
    0.95: (
        12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281,
        2.2010, 2.1788, 2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860,
        2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423,
    ),
    0.99: (
        63.6567, 9.9248, 5.8409, 4.6041, 4.0321, 3.7074, 3.4995, 3.3554, 3.2498, 3.1693,
        3.1058, 3.0545, 3.0123, 2.9768, 2.9467, 2.9208, 2.8982, 2.8784, 2.8609, 2.8453,
        2.8314, 2.8188, 2.8073, 2.7969, 2.7874, 2.7787, 2.7707, 2.7633, 2.7564, 2.7500,
    ),
}  # fmt: skip
NORMAL_QUANTILES = {0.90: 1.6448536, 0.95: 1.9599640, 0.99: 2.5758293}


def t_quantile(df: float, level: float = 0.95) -> float:
    """The two-sided Student-t quantile of ``level`` (0.90, 0.95 or 0.99) with ``df`` degrees of freedom (>= 1; a
    Satterthwaite df need not be whole). Whole df up to 30: the table. Between two of them: harmonic interpolation (in
    1 / df), at or above the exact quantile since the quantile is convex in 1 / df: 18% above at df = 1.5, under 2%
    from df = 2 on, under 0.1% from df = 5 on. Beyond 30: the Cornish-Fisher expansion around the normal quantile,
    within 1e-4."""
    if level not in T_QUANTILES:
        raise ValueError(f"t_quantile: level must be one of {sorted(T_QUANTILES)}, got {level}")
    if not df >= 1:
        raise ValueError(f"t_quantile: df must be >= 1, got {df}")
    table = T_QUANTILES[level]
    if df <= len(table):
        lo = int(df)
        if lo == df:
            return table[lo - 1]
        w = (1.0 / lo - 1.0 / df) / (1.0 / lo - 1.0 / (lo + 1))
        return table[lo - 1] + w * (table[lo] - table[lo - 1])
    z, v = NORMAL_QUANTILES[level], float(df)
    return (
        z
        + (z**3 + z) / (4 * v)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * v**3)
    )


def t_interval(values: Sequence[float], *, level: float = 0.95) -> tuple[float, float, float]:
    """-> (mean, low, high): the t-interval of the mean of ``values``, df = K - 1. Needs K >= 2. Over the per-seed
    differences of a study it is the seed-only interval S1-S4 read: it leaves out the task term of the crossed design
    (``seed_task_t_interval``), so it is not a study's verdict any more."""
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or x.size < 2:
        raise ValueError(f"t_interval needs at least two values (one per seed), got {x.size}")
    half = t_quantile(x.size - 1, level) * x.std(ddof=1) / np.sqrt(x.size)
    return float(x.mean()), float(x.mean() - half), float(x.mean() + half)


# A study is a crossed design: every seed's checkpoint is evaluated on the same T held-out tasks (against one warm
# start, or against another arm's checkpoint of the same seed). A paired difference is then
#     d[s, t] = mu + u_t + v_s + e_st      (u: the task, v: the seed, e: the rest; each with its variance)
# and the mean over the K x T matrix has Var = s_u^2 / T + s_v^2 / K + s_e^2 / (K T). The task term u_t is the same in
# every seed, so an interval over the K seed means alone (``t_interval``) cannot see it, and a bootstrap that draws
# tasks afresh within each seed sees it divided by K. The two below see both terms.


def _matrix(d: Any, what: str, *, min_seeds: int, min_tasks: int) -> np.ndarray:
    """``d`` as a finite float64 [K, T] array, at least ``min_seeds`` x ``min_tasks``; else a ValueError naming it."""
    x = np.asarray(d, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] < min_seeds or x.shape[1] < min_tasks:
        raise ValueError(
            f"{what} needs a [seeds, tasks] matrix with >= {min_seeds} seeds and >= {min_tasks} tasks, got {x.shape}"
        )
    if not np.isfinite(x).all():
        raise ValueError(f"{what}: the matrix holds NaN or infinite values")
    return x


def seed_task_t_interval(d: Any, *, level: float = 0.95) -> tuple[float, float, float, float]:
    """-> (mean, low, high, df) of a crossed design's paired differences ``d`` [K seeds, T tasks] (row s, column t: seed
    s's difference on task t; every seed the same tasks in the same column order): the t-interval on

        Var(mean) = s^2(the K seed means) / K + s^2(the T task means over seeds) / T

    with the Welch-Satterthwaite df = Var^2 / ((s^2_seeds / K)^2 / (K - 1) + (s^2_tasks / T)^2 / (T - 1)), between
    min(K, T) - 1 and K + T - 2. Each term holds its own factor plus the interaction's share, so s_e^2 / (K T) is
    counted twice: conservative by that much. Needs K >= 2 and T >= 2. This is the interval a study's verdict reads: in
    simulation (tests/eval/test_crossed_interval.py) it covers at about 95% both where the tasks' variance dominates
    (S3-like) and where the seeds' does, which neither the seed-only ``t_interval`` (53% at S3-like variances) nor the
    ``crossed_bootstrap`` (under 92% with 3 seeds when the seeds dominate) does."""
    x = _matrix(d, "seed_task_t_interval", min_seeds=2, min_tasks=2)
    var, df = crossed_variance(x)
    half = t_quantile(df, level) * np.sqrt(var)
    mean = float(x.mean())
    return mean, float(mean - half), float(mean + half), df


def crossed_variance(d: Any) -> tuple[float, float]:
    """-> (Var(mean), df) of ``seed_task_t_interval``'s mean of ``d`` [K >= 2 seeds, T >= 2 tasks]: the two terms'
    sum and their Welch-Satterthwaite df (K - 1 where both terms are 0)."""
    x = _matrix(d, "crossed_variance", min_seeds=2, min_tasks=2)
    k, t = x.shape
    seeds = x.mean(axis=1).var(ddof=1) / k  # [K] seed means -> their variance / K
    tasks = x.mean(axis=0).var(ddof=1) / t  # [T] task means over seeds -> their variance / T
    var = float(seeds + tasks)
    df = float(var**2 / (seeds**2 / (k - 1) + tasks**2 / (t - 1))) if var > 0 else float(k - 1)
    return var, df


def stratified_t_interval(
    means: Sequence[float],
    variances: Sequence[float],
    dfs: Sequence[float],
    *,
    weights: Sequence[float] | None = None,
    level: float = 0.95,
) -> tuple[float, float, float, float]:
    """-> (estimate, low, high, df) of sum_w c_w means[w] over W strata (e.g. synthetic worlds, each its own study),
    each estimate with Var ``variances[w]`` and df ``dfs[w]`` (``crossed_variance``); ``weights`` c (default 1 / W:
    the unweighted mean; [-1, 1]: the second minus the first):

        Var = sum_w c_w^2 Var_w,   df = Var^2 / sum_w ((c_w^2 Var_w)^2 / df_w)   (Welch-Satterthwaite)

    The strata are fixed, not drawn: the interval is about these W worlds (with W = 2, a random-effects interval over
    worlds would have df = 1). Needs W >= 1 and every df >= 1."""
    m, v, f = (np.asarray(a, dtype=np.float64) for a in (means, variances, dfs))
    if not (m.ndim == 1 and m.size >= 1 and m.shape == v.shape == f.shape):
        raise ValueError(f"stratified_t_interval: one mean, variance and df per stratum, got {m.shape}, {v.shape}, "
                         f"{f.shape}")  # fmt: skip
    if (v < 0).any() or (f < 1).any() or not (np.isfinite(m).all() and np.isfinite(v).all()):
        raise ValueError("stratified_t_interval: variances must be finite and >= 0, and every df >= 1")
    c = np.full(m.size, 1.0 / m.size) if weights is None else np.asarray(weights, dtype=np.float64)
    if c.shape != m.shape:
        raise ValueError(f"stratified_t_interval: one weight per stratum, got {c.shape} for {m.shape}")
    parts = c**2 * v
    var = float(parts.sum())
    df = float(var**2 / (parts**2 / f).sum()) if var > 0 else float(f.min())
    half = t_quantile(df, level) * np.sqrt(var)
    mean = float(c @ m)
    return mean, mean - half, mean + half, df


def crossed_bootstrap(
    d: Any, *, level: float = 0.95, n_resamples: int = 10_000, seed: int = 0
) -> tuple[float, float, float]:
    """-> (mean, low, high) of a crossed design's paired differences ``d`` [K seeds, T tasks], the percentile interval
    of a bootstrap that draws, per replicate, K seeds with replacement and ONE vector of T tasks with replacement,
    shared by every drawn seed (the tasks are the same in every seed, so they are drawn once). Shown beside the
    verdict's ``seed_task_t_interval``, not read: with 2-3 seeds there are 3-10 distinct draws of seeds and no t
    correction, so it is too narrow where the seeds' variance dominates. One seed (K = 1) gives the tasks' bootstrap."""
    x = _matrix(d, "crossed_bootstrap", min_seeds=1, min_tasks=1)
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    k, t = x.shape
    rng = np.random.default_rng(seed)
    means = np.empty(n_resamples)
    for start in range(0, n_resamples, 2048):  # chunks keep the [chunk, T] counts small
        n = min(2048, n_resamples - start)
        seeds = rng.multinomial(k, np.full(k, 1.0 / k), size=n)  # [n, K]: how often each seed is drawn
        tasks = rng.multinomial(t, np.full(t, 1.0 / t), size=n)  # [n, T]: how often each task is drawn
        means[start : start + n] = ((seeds @ x) * tasks).sum(axis=1) / (k * t)
    alpha = (1.0 - level) / 2.0
    low, high = np.quantile(means, [alpha, 1.0 - alpha])
    return float(x.mean()), float(low), float(high)


def verdict(low: float, high: float) -> str:
    """ "above 0", "below 0" or "includes 0": where an interval of a difference lies."""
    return "above 0" if low > 0 else "below 0" if high < 0 else "includes 0"
