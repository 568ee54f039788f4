"""The headline table (``mempo.eval.headline``): means, bootstrap intervals against an independent computation and
hand-checked cases, token ratios at the largest N, and the files it writes."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from mempo.eval.headline import HEADLINE_COLUMNS, headline_rows, token_ratios, write_headline

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def make_records(seed: int = 1) -> list[dict]:
    """Two arms (a memory agent, a full-history agent) x N in {1, 3}, 12 tasks each, with spread in every metric."""
    rng = np.random.default_rng(seed)
    records = []
    for arm, agent, scale in (("mem_arm", "memory", 1.0), ("react_arm", "full_history", 3.0)):
        for n in (3, 1):  # out of order on purpose: rows come out with N ascending
            for i in range(12):
                records.append({
                    "checkpoint": arm, "agent": agent, "objectives": n, "task_id": f"n{n}-t{i}",
                    "em": float(rng.integers(0, 2)), "f1": float(rng.random()),
                    "format_fail": float(rng.random() < 0.2), "turns": int(rng.integers(1, 2 * n + 2)),
                    "tt": int(scale * n * rng.integers(200, 400)), "pt": int(scale * rng.integers(100, 300)),
                })  # fmt: skip
    return records


def percentile_bootstrap(values: list[float], *, seed: int = 0, n_resamples: int = 10_000) -> tuple[float, float]:
    """An independent reference: a resample loop and np.percentile over the same index draws."""
    x = np.asarray(values, dtype=float)
    idx = np.random.default_rng(seed).integers(0, len(x), size=(n_resamples, len(x)))
    means = np.array([x[i].sum() / len(x) for i in idx])
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(lo), float(hi)


def test_rows_are_plain_means_with_independently_computed_intervals():
    records = make_records()
    rows = headline_rows(records)
    assert [(r["arm"], r["agent"], r["objectives"]) for r in rows] == [
        ("mem_arm", "memory", 1), ("mem_arm", "memory", 3), ("react_arm", "full_history", 1),
        ("react_arm", "full_history", 3),
    ]  # fmt: skip
    for row in rows:
        cell = [r for r in records if (r["checkpoint"], r["objectives"]) == (row["arm"], row["objectives"])]
        assert row["tasks"] == len(cell) == 12
        for m in ("em", "f1", "format_fail", "turns", "tt", "pt"):
            assert row[m] == pytest.approx(sum(r[m] for r in cell) / len(cell)), m
        for m in ("em", "f1", "tt", "pt"):
            lo, hi = percentile_bootstrap([r[m] for r in cell])
            assert (row[f"{m}_lo"], row[f"{m}_hi"]) == (pytest.approx(lo), pytest.approx(hi)), m
            assert row[f"{m}_lo"] < row[m] < row[f"{m}_hi"], m  # every metric has spread here


def test_hand_checked_intervals():
    """All-equal values: a zero-width interval at the value. Two tasks scoring 0 and 1: resampled means are 0, 0.5
    and 1 with probabilities 1/4, 1/2, 1/4, so the 2.5% and 97.5% percentiles are exactly 0 and 1."""
    base = {"checkpoint": "a", "agent": "memory", "objectives": 2, "format_fail": 0.0, "turns": 5}
    same = [{**base, "task_id": f"t{i}", "em": 1.0, "f1": 0.5, "tt": 700, "pt": 180} for i in range(9)]
    (row,) = headline_rows(same)
    for m, v in (("em", 1.0), ("f1", 0.5), ("tt", 700.0), ("pt", 180.0)):
        assert (row[m], row[f"{m}_lo"], row[f"{m}_hi"]) == (v, v, v)
    two = [{**base, "task_id": "t0", "em": 0.0, "f1": 0.0, "tt": 100, "pt": 10},
           {**base, "task_id": "t1", "em": 1.0, "f1": 1.0, "tt": 300, "pt": 30}]  # fmt: skip
    (row,) = headline_rows(two)
    assert (row["em"], row["em_lo"], row["em_hi"]) == (0.5, 0.0, 1.0)
    assert (row["tt"], row["tt_lo"], row["tt_hi"]) == (200.0, 100.0, 300.0)
    assert (row["pt"], row["pt_lo"], row["pt_hi"]) == (20.0, 10.0, 30.0)


def test_an_arm_evaluated_with_two_agents_is_an_error():
    records = make_records()
    records[0] = {**records[0], "agent": "full_history"}
    with pytest.raises(ValueError, match="mem_arm"):
        headline_rows(records)


def test_token_ratios_pair_memory_arms_with_react_arms_at_the_largest_n():
    rows = headline_rows(make_records())
    (ratio,) = token_ratios(rows)
    mem, react = (next(r for r in rows if r["arm"] == a and r["objectives"] == 3) for a in ("mem_arm", "react_arm"))
    assert (ratio["memory_arm"], ratio["react_arm"], ratio["objectives"]) == ("mem_arm", "react_arm", 3)
    assert ratio["pt_ratio"] == pytest.approx(mem["pt"] / react["pt"])
    assert ratio["tt_ratio"] == pytest.approx(mem["tt"] / react["tt"])


def test_written_table_and_figures(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    ylims: dict[str, tuple[float, float]] = {}
    save = Figure.savefig

    def spy(fig, path, **kw):
        ylims[str(path).rsplit("/", 1)[-1]] = fig.axes[0].get_ylim()
        return save(fig, path, **kw)

    monkeypatch.setattr(Figure, "savefig", spy)
    files, rows, ratios = write_headline(tmp_path, make_records(), num_tasks=12)
    assert ylims["pt_vs_n.png"][0] == 0 and ylims["tt_vs_n.png"][0] == 0  # token axes start at zero
    assert ylims["f1_vs_n.png"] == (-0.05, 1.05)
    with files["table_csv"].open(newline="") as f:
        table = list(csv.DictReader(f))
    assert list(table[0]) == HEADLINE_COLUMNS and len(table) == 4
    assert [float(t["pt_hi"]) for t in table] == pytest.approx([r["pt_hi"] for r in rows])
    md = files["table_md"].read_text()
    assert md.splitlines()[0] == "| " + " | ".join(HEADLINE_COLUMNS) + " |"
    assert f"- mem_arm / react_arm: PT {ratios[0]['pt_ratio']:.3f}, TT {ratios[0]['tt_ratio']:.3f}" in md
    for name in ("f1_vs_n", "pt_vs_n", "tt_vs_n"):
        assert files[name].read_bytes()[:8] == PNG_MAGIC, name
