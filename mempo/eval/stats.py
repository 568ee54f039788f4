"""Percentile bootstrap intervals for per-task metrics (EM, F1), and for paired differences between two models
evaluated on the same tasks."""

from __future__ import annotations

from collections.abc import Sequence

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


# Seed-level statistics: an RL run's seed is the unit of evidence (docs/results.md, section 2: the spread
# between RL seeds, about 0.03-0.04 EM, is larger than the tasks' at 64 tasks). A comparison of two arms pairs their
# runs by seed and their per-task scores by task; each seed gives one paired difference (the mean over its tasks).

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


def t_quantile(df: int, level: float = 0.95) -> float:
    """The two-sided Student-t quantile of ``level`` (0.90, 0.95 or 0.99) with ``df`` degrees of freedom."""
    if level not in T_QUANTILES:
        raise ValueError(f"t_quantile: level must be one of {sorted(T_QUANTILES)}, got {level}")
    if df < 1:
        raise ValueError(f"t_quantile: df must be >= 1, got {df}")
    if df <= len(T_QUANTILES[level]):
        return T_QUANTILES[level][df - 1]
    z, v = NORMAL_QUANTILES[level], float(df)
    return (
        z
        + (z**3 + z) / (4 * v)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * v**3)
    )


def t_interval(values: Sequence[float], *, level: float = 0.95) -> tuple[float, float, float]:
    """-> (mean, low, high): the t-interval of the mean of ``values`` (one per seed), df = K - 1. Needs K >= 2."""
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or x.size < 2:
        raise ValueError(f"t_interval needs at least two values (one per seed), got {x.size}")
    half = t_quantile(x.size - 1, level) * x.std(ddof=1) / np.sqrt(x.size)
    return float(x.mean()), float(x.mean() - half), float(x.mean() + half)


def two_level_bootstrap(
    groups: Sequence[Sequence[float]], *, level: float = 0.95, n_resamples: int = 10_000, seed: int = 0
) -> tuple[float, float, float]:
    """-> (mean, low, high) for per-seed groups of per-task values (a seed's paired differences over its tasks):
    the mean of the seeds' means, and its percentile bootstrap interval resampling seeds with replacement, then
    tasks with replacement within each drawn seed. With few seeds it is anti-conservative (3 seeds give 10 distinct
    resamples of seeds): the t-interval (``t_interval`` over the seed means) is the one to read."""
    if not groups or any(len(g) == 0 for g in groups):
        raise ValueError("two_level_bootstrap needs at least one seed, each with at least one task")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    rng = np.random.default_rng(seed)
    arrays = [np.asarray(g, dtype=np.float64) for g in groups]
    k = len(arrays)
    drawn = rng.integers(0, k, size=(n_resamples, k))  # [n_resamples, K]: which seed fills each slot
    means = np.zeros(n_resamples)
    for s, a in enumerate(arrays):  # every slot that drew seed s gets a fresh resample of s's tasks
        slots = np.flatnonzero(drawn.ravel() == s)
        task_means = a[rng.integers(0, a.size, size=(slots.size, a.size))].mean(axis=1)
        np.add.at(means, slots // k, task_means)
    means /= k
    alpha = (1.0 - level) / 2.0
    low, high = np.quantile(means, [alpha, 1.0 - alpha])
    return float(np.mean([a.mean() for a in arrays])), float(low), float(high)


def verdict(low: float, high: float) -> str:
    """ "above 0", "below 0" or "includes 0": where an interval of a difference lies."""
    return "above 0" if low > 0 else "below 0" if high < 0 else "includes 0"
