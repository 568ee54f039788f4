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
