"""Coverage and width of a study's verdict interval (``mempo.eval.stats.seed_task_t_interval``) against the exact
form of the crossed design's variance, in simulated studies of K seeds x T tasks with a known mean.

A paired difference d[s, t] = mu + u_t + v_s + e_st has Var(mean) = s_u^2 / T + s_v^2 / K + s_e^2 / (K T). The
verdict's interval estimates it by s^2(seed means) / K + s^2(task means) / T, whose expectation is that plus
s_e^2 / (K T): the interaction counted twice. The exact form subtracts the two-way ANOVA's residual mean square over
K T (each of the two terms kept at >= 0, Satterthwaite df over the terms kept). Regimes: the fits of docs/results.md
(S3-like: tasks dominate; seed-dominated: S2's seed spread), one where the interaction dominates, and EM itself (0/1
per task and run, a deterministic greedy warm start against an arm whose runs flip answers).

    python -m benchmarks.interval_coverage [--replicates 4000] [--k 3] [--t 128 256]

Prints per regime and (K, T): each interval's coverage of the true mean, its mean width, and its width over the ideal
one (the true standard error times the normal quantile). CPU only, numpy; seconds.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import numpy as np

from mempo.eval.stats import seed_task_t_interval, t_quantile

GAUSSIAN = {  # (s_u tasks, s_v seeds, s_e interaction); the first two as tests/eval/test_crossed_interval.py's
    "S3-like (tasks dominate)": (0.105, 0.002, 0.03),
    "seed-dominated (S2's seed spread)": (0.02, 0.03, 0.03),
    "interaction-dominated": (0.02, 0.005, 0.30),
}


def exact_interval(d: np.ndarray, level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high) on the unbiased variance of the crossed design's mean: seed term s^2(seed means)/K - r and task
    term s^2(task means)/T - r, each kept at >= 0, plus r = MS_resid / (K T); Satterthwaite df over what is kept."""
    k, t = d.shape
    seed_means, task_means = d.mean(axis=1), d.mean(axis=0)
    resid = d - seed_means[:, None] - task_means[None, :] + d.mean()
    r = float((resid**2).sum() / ((k - 1) * (t - 1))) / (k * t)
    seeds, tasks = float(seed_means.var(ddof=1)) / k, float(task_means.var(ddof=1)) / t
    a, b = seeds - r, tasks - r
    if a > 0 and b > 0:
        var = seeds + tasks - r
        df = var**2 / (seeds**2 / (k - 1) + tasks**2 / (t - 1) + r**2 / ((k - 1) * (t - 1)))
    elif a > 0:  # no task term left: var = the seed term + r = seeds
        var, df = seeds, k - 1.0
    elif b > 0:
        var, df = tasks, t - 1.0
    else:
        var, df = r, float((k - 1) * (t - 1))
    half = t_quantile(max(df, 1.0), level) * np.sqrt(var)
    mean = float(d.mean())
    return mean, mean - half, mean + half


def gaussian(sds: tuple[float, float, float], k: int, t: int) -> tuple[Callable, float, float]:
    """A sampler of [K, T] studies with mean 0, the true mean and the true SD of the mean."""
    su, sv, se = sds

    def draw(rng: np.random.Generator) -> np.ndarray:
        return rng.normal(0, su, (1, t)) + rng.normal(0, sv, (k, 1)) + rng.normal(0, se, (k, t))

    return draw, 0.0, float(np.sqrt(su**2 / t + sv**2 / k + se**2 / (k * t)))


def em_flips(k: int, t: int, *, shift: float = 0.3, seed_sd: float = 0.15) -> tuple[Callable, float, float]:
    """EM per task: a task's warm-start success probability p ~ Beta(2, 1) (mean 0.67, as the main job's ~0.7), the
    warm start scored once (greedy, the same in every comparison), each RL seed's run succeeding with
    sigmoid(logit p + shift + v_s), v_s ~ N(0, seed_sd). The true mean and SD by Monte Carlo over 200,000 draws."""

    def logit(p: np.ndarray) -> np.ndarray:
        return np.log(p) - np.log1p(-p)

    def draw(rng: np.random.Generator) -> np.ndarray:
        p = np.clip(rng.beta(2.0, 1.0, t), 1e-4, 1 - 1e-4)
        ws = rng.random(t) < p
        q = 1 / (1 + np.exp(-(logit(p)[None, :] + shift + rng.normal(0, seed_sd, (k, 1)))))
        return (rng.random((k, t)) < q).astype(float) - ws[None, :]

    rng = np.random.default_rng(12345)
    means = np.array([draw(rng).mean() for _ in range(200_000 // (k * t) + 2000)])
    return draw, float(means.mean()), float(means.std())


def run(draw: Callable, mu: float, sd: float, *, replicates: int, seed: int = 0) -> dict[str, tuple[float, ...]]:
    """-> interval name -> (coverage, mean width, width / ideal width)."""
    rng = np.random.default_rng(seed)
    hits, widths = {"verdict (conservative)": [], "exact": []}, {"verdict (conservative)": [], "exact": []}
    for _ in range(replicates):
        d = draw(rng)
        for name, (_, lo, hi) in (
            ("verdict (conservative)", seed_task_t_interval(d)[:3]),
            ("exact", exact_interval(d)),
        ):
            hits[name].append(lo <= mu <= hi)
            widths[name].append(hi - lo)
    ideal = 2 * 1.959964 * sd
    return {n: (float(np.mean(hits[n])), float(np.mean(widths[n])), float(np.mean(widths[n])) / ideal) for n in hits}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.interval_coverage",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--replicates", type=int, default=4000)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--t", type=int, nargs="+", default=[128, 256])
    args = ap.parse_args(argv)
    print(f"{args.replicates} simulated studies per row; 95% intervals; K = {args.k} seeds")
    print("| regime | T | interval | coverage | mean width | width / ideal |")
    print("| --- | --- | --- | --- | --- | --- |")
    for t in args.t:
        regimes = {name: gaussian(sds, args.k, t) for name, sds in GAUSSIAN.items()}
        regimes["EM 0/1, runs flip answers"] = em_flips(args.k, t)
        for name, (draw, mu, sd) in regimes.items():
            for interval, (cov, width, ratio) in run(draw, mu, sd, replicates=args.replicates).items():
                print(f"| {name} | {t} | {interval} | {cov:.3f} | {width:.4f} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
