"""Bootstrap intervals, checked against closed forms."""

from __future__ import annotations

import math

import pytest

from mempo.eval.stats import bootstrap_ci, fmt_ci, paired_bootstrap_diff


def test_interval_of_a_bernoulli_mean_matches_the_normal_approximation() -> None:
    values = [1.0] * 200 + [0.0] * 200
    mean, low, high = bootstrap_ci(values, n_resamples=20_000)
    half = 1.959964 * math.sqrt(0.25 / 400)  # 0.049: the normal interval of a proportion
    assert mean == 0.5
    # Monte Carlo error of the percentile endpoints with 20k resamples is ~0.001; 0.005 leaves room for it.
    assert abs((0.5 - low) - half) < 0.005 and abs((high - 0.5) - half) < 0.005


def test_constant_values_and_single_values_give_zero_width() -> None:
    assert bootstrap_ci([0.25] * 10) == (0.25, 0.25, 0.25)
    assert bootstrap_ci([1.0]) == (1.0, 1.0, 1.0)


def test_paired_difference_removes_the_task_spread() -> None:
    """b is a + 0.1 on every task: the tasks spread widely, the difference does not."""
    a = [0.0, 0.2, 0.4, 0.6, 0.8, 0.1, 0.3, 0.5]
    b = [x + 0.1 for x in a]
    mean, low, high = paired_bootstrap_diff(a, b)
    assert mean == pytest.approx(0.1) and low == pytest.approx(0.1) and high == pytest.approx(0.1)
    _, lo_a, hi_a = bootstrap_ci(a)
    assert hi_a - lo_a > 0.2


def test_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        bootstrap_ci([])
    with pytest.raises(ValueError, match="the tasks must be the same"):
        paired_bootstrap_diff([1.0, 0.0], [1.0])
    assert fmt_ci(0.5, 0.25, 0.75) == "0.500 [0.250, 0.750]"


def test_interval_table_pairs_tasks_by_id_and_flags_significance() -> None:
    from mempo.eval.report import interval_table

    def recs(ckpt: str, ems: list[float]) -> list[dict]:
        return [{"checkpoint": ckpt, "agent": "memory", "objectives": 2, "task_id": f"t{i}", "em": e, "f1": e}
                for i, e in enumerate(ems)]  # fmt: skip

    base, better = [0.0] * 30 + [1.0] * 30, [1.0] * 60
    records = recs("a", base) + recs("b", list(reversed(better)))
    rows = [{"checkpoint": c, "agent": "memory", "objectives": 2, "tasks": 60, "em": m, "em_lo": m, "em_hi": m,
             "f1": m, "f1_lo": m, "f1_hi": m, "format_fail": 0.0, "turns": 3.0, "tt": 1.0, "pt": 1.0}
            for c, m in (("a", 0.5), ("b", 1.0))]  # fmt: skip
    text = interval_table(rows, records)
    assert "| b - a | 2 | 60 | 0.500 [" in text and text.count("excludes 0") == 2
    # Same tasks, same scores: the difference is exactly 0 and does not exclude it.
    same = interval_table(rows, recs("a", base) + recs("b", base))
    assert "0.000 [0.000, 0.000] includes 0" in same
