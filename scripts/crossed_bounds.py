"""What S1-S4's committed study.json files allow about their verdicts under the crossed-design interval.

The studies committed per-seed means and two intervals per comparison, not the per-task differences the
seed-plus-task t-interval (``mempo.eval.stats.seed_task_t_interval``) needs. Its seed term, s^2(seed means) / K, is in
study.json exactly. Its task term, s^2(task means over seeds) / T, is not; but the two-level bootstrap interval that
study.json holds fixes sw2, the within-seed variance of the per-task differences (the mean over seeds of each seed's
variance over its tasks): this script finds the sw2 that makes that bootstrap (as it ran: seed 0, 10,000 resamples)
give the recorded width. The variance of the task means over seeds is then, exactly, sw2 minus the mean squared
seed x task interaction, and under the crossed model

    var(task means over seeds) = sw2 * (r + (1 - r) / K)

where r (0..1) is the share of the within-seed task variance that is common to every seed (s_u^2 / (s_u^2 + s_e^2)):
r = 0 when each seed's changes fall on its own tasks, r = 1 when every seed changes the same tasks the same way. r is
not in study.json. For each comparison the script prints the interval at r = 0 and r = 1 and the r at which the
verdict would change.

    python scripts/crossed_bounds.py docs/studies/s1 docs/studies/s2 docs/studies/s3 docs/studies/s4
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from mempo.eval.stats import t_quantile, verdict


def nested_bootstrap(groups: np.ndarray, *, n_resamples: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """The two-level bootstrap S1-S4 ran (mempo/eval/stats.py before the crossed interval): seeds resampled, then
    tasks afresh within each drawn seed -> its 95% percentile interval. ``groups``: [K, T]."""
    rng = np.random.default_rng(seed)
    k, t = groups.shape
    drawn = rng.integers(0, k, size=(n_resamples, k))
    means = np.zeros(n_resamples)
    for s in range(k):
        slots = np.flatnonzero(drawn.ravel() == s)
        task_means = groups[s][rng.integers(0, t, size=(slots.size, t))].mean(axis=1)
        np.add.at(means, slots // k, task_means)
    low, high = np.quantile(means / k, [0.025, 0.975])
    return float(low), float(high)


def within_seed_variance(per_seed: list[float], width: float, tasks: int) -> float:
    """sw2 such that the nested bootstrap of seeds with these means, each over ``tasks`` tasks of that variance
    (normal scores, the same shape in every seed), is ``width`` wide: bisection on sw (the width grows with it). 0
    when the seed means alone already make it that wide."""
    z = np.random.default_rng(1).standard_normal(tasks)
    z = (z - z.mean()) / z.std()  # population variance 1

    def width_at(sw: float) -> float:
        low, high = nested_bootstrap(np.asarray(per_seed)[:, None] + sw * z[None, :])
        return high - low

    if width_at(0.0) >= width:
        return 0.0
    lo, hi = 0.0, 1.0
    while width_at(hi) < width:
        hi *= 2
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if width_at(mid) < width else (lo, mid)
    return ((lo + hi) / 2) ** 2


def interval(per_seed: list[float], sw2: float, tasks: int, r: float) -> tuple[float, float, float]:
    """The seed-plus-task t-interval -> (low, high, df) at share ``r``."""
    k = len(per_seed)
    seeds = float(np.var(per_seed, ddof=1)) / k
    task_var = sw2 * (r + (1 - r) / k) * tasks / (tasks - 1)  # s^2 (ddof 1) of the task means over seeds
    task_term = task_var / tasks
    var = seeds + task_term
    df = var**2 / (seeds**2 / (k - 1) + task_term**2 / (tasks - 1)) if var > 0 else k - 1
    half = t_quantile(df) * var**0.5
    mean = float(np.mean(per_seed))
    return mean - half, mean + half, df


def flip_share(per_seed: list[float], sw2: float, tasks: int, was: str) -> float | None:
    """The smallest r (0..1, to 0.01) at which the verdict differs from ``was``; None when it holds for every r."""
    for r in np.linspace(0, 1, 101):
        if verdict(*interval(per_seed, sw2, tasks, float(r))[:2]) != was:
            return float(r)
    return None


def main(folders: list[str]) -> None:
    print("| study | comparison | metric | K | old t-interval (verdict) | r = 0 | r = 1 | verdict changes at r |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for folder in folders:
        study = json.loads((Path(folder) / "study.json").read_text())
        rows = [(c, "em") for c in study["comparisons"]]
        rows += [(c, "p_gold") for c in study.get("memory_scores", {}).get("comparisons", [])]
        for c, m in rows:
            r = c[m]
            tasks, per_seed = r["tasks"][0], r["per_seed"]
            if len(set(r["tasks"])) != 1:
                raise ValueError(f"{folder}: {c['arm']} - {c['against']} has seeds with other task counts")
            sw2 = within_seed_variance(per_seed, r["bootstrap"][1] - r["bootstrap"][0], tasks)
            d = 3 if m == "em" else 4
            cells = []
            for share in (0.0, 1.0):
                low, high, df = interval(per_seed, sw2, tasks, share)
                cells.append(f"[{low:.{d}f}, {high:.{d}f}] df {df:.0f}, {verdict(low, high)}")
            old = f"[{r['t_interval'][0]:.{d}f}, {r['t_interval'][1]:.{d}f}] ({r['verdict']})"
            flip = flip_share(per_seed, sw2, tasks, r["verdict"])
            changes = "never" if flip is None else ("at 0" if flip == 0 else f"{flip:.2f}")
            print(f"| {Path(folder).name} | {c['arm']} - {c['against']} | {m} | {len(per_seed)} | {old} | "
                  f"{cells[0]} | {cells[1]} | {changes} |")  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1:])
