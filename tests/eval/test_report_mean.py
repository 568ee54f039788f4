"""``python -m mempo.eval.report --mean NAME=A,B``: a checkpoint whose per-task values are the means of A's and B's
(a recipe's seeds), checked against hand-computed values."""

from __future__ import annotations

import pytest

from mempo.eval.report import MEAN_FIELDS, interval_table, mean_checkpoint


def _rec(ckpt: str, task: str, em: float, tt: float) -> dict:
    return {"checkpoint": ckpt, "agent": "memory", "objectives": 2, "task_id": task} | {
        f: 0.0 for f in MEAN_FIELDS
    } | {"em": em, "f1": em, "tt": tt}  # fmt: skip


EM = {"base": [0, 0, 1, 0], "s0": [1, 0, 1, 1], "s1": [0, 0, 1, 1]}  # tasks t0..t3


def _records() -> list[dict]:
    return [_rec(c, f"t{i}", v, 100.0 * (i + 1) + (c == "s1")) for c, ems in EM.items() for i, v in enumerate(ems)]


def test_mean_checkpoint_averages_each_task_over_its_labels():
    rows, recs = mean_checkpoint(_records(), "two_seeds", ["s0", "s1"])
    assert [r["em"] for r in recs] == [0.5, 0.0, 1.0, 1.0]  # (1+0)/2, (0+0)/2, (1+1)/2, (1+1)/2
    assert [r["tt"] for r in recs] == [100.5, 200.5, 300.5, 400.5]
    (row,) = rows
    assert row["checkpoint"] == "two_seeds" and row["tasks"] == 4
    assert row["em"] == pytest.approx(2.5 / 4)
    assert row["em_lo"] <= row["em"] <= row["em_hi"]


def test_the_mean_is_paired_against_the_first_checkpoint():
    rows, recs = mean_checkpoint(_records(), "two_seeds", ["s0", "s1"])
    base = [r for r in _records() if r["checkpoint"] == "base"]
    base_row = {"checkpoint": "base", "agent": "memory", "objectives": 2, "tasks": 4, "em": 0.25, "em_lo": 0.0,
                "em_hi": 0.75, "f1": 0.25, "f1_lo": 0.0, "f1_hi": 0.75, "format_fail": 0.0, "turns": 0.0, "tt": 0.0,
                "pt": 0.0}  # fmt: skip
    table = interval_table([base_row, *rows], base + recs)
    line = next(x for x in table.splitlines() if x.startswith("| two_seeds - base"))
    assert "| 0.375 [" in line  # mean over tasks of (0.5-0, 0-0, 1-1, 1-0) = 1.5 / 4


def test_labels_that_scored_different_tasks_are_an_error():
    records = [r for r in _records() if not (r["checkpoint"] == "s1" and r["task_id"] == "t3")]
    with pytest.raises(ValueError, match=r"did not score the same tasks at agent=memory, N=2"):
        mean_checkpoint(records, "two_seeds", ["s0", "s1"])
    with pytest.raises(ValueError, match="needs at least two checkpoints"):
        mean_checkpoint(records, "one", ["s0"])


def test_base_pairs_against_a_mean_checkpoint():
    # Seed means of two recipes, paired against the first recipe's mean, not against the first checkpoint:
    # recipe a = mean(base, s1) = [0, 0, 1, 0.5]; recipe b = mean(s0, s1) = [0.5, 0, 1, 1]; b - a = [0.5, 0, 0, 0.5]
    # -> 1.0 / 4.
    records = _records()
    rows: list[dict] = []
    for name, labels in (("b", ["s0", "s1"]), ("a", ["base", "s1"])):  # b first: without base, a - b
        r, rec = mean_checkpoint(records, name, labels)
        rows += r
        records += rec
    table = interval_table(rows, records, base="a")
    line = next(x for x in table.splitlines() if x.startswith("| b - a"))
    assert "| 0.250 [" in line
    assert not any(x.startswith("| a - b") for x in table.splitlines())
    with pytest.raises(ValueError, match=r"base checkpoint 'c' is not among \['b', 'a'\]"):
        interval_table(rows, records, base="c")
