"""MEM1's aggregation beside mempo's, and per-source rows, on hand-computed values."""

from __future__ import annotations

import pytest

from mempo.eval.compare import source_rows
from mempo.eval.mem1 import mem1_normalize, mem1_scores
from mempo.eval.report import real_data_tables
from mempo.rollout.rewards import objective_scores


@pytest.mark.parametrize(
    ("answer", "golds", "expected"),
    [
        ("Wilhelm Conrad Röntgen; yes", [["Wilhelm Conrad Röntgen"], ["yes"]], (2.0, 2.0)),  # sums, not means
        ("Röntgen; no", [["Wilhelm Conrad Röntgen"], ["yes"]], (0.0, 0.5)),  # set F1 2*(1*1/3)/(1+1/3) = 0.5
        ("Wilhelm Conrad Röntgen; yes; extra", [["Wilhelm Conrad Röntgen"], ["yes"]], (0.0, 0.0)),  # count rule
        ("yes", [["a"], ["yes"]], (0.0, 0.0)),  # too few parts: 0 (mempo pads instead)
        ("the Beatles; 2,718", [["Beatles"], ["2718"]], (0.0, 2 / 3)),  # articles kept; "2,718" -> "2 718"
        (None, [["a"]], (0.0, 0.0)),
    ],
)
def test_mem1_scores(answer, golds, expected):
    em, f1 = mem1_scores(answer, golds)
    assert (em, f1) == pytest.approx(expected)


def test_mem1_differs_from_mempo_where_the_review_says():
    assert mem1_normalize(" The  Beatles, 2,718! ") == "the beatles 2 718"
    # mempo: mean over objectives, the extra part ignored -> EM 1 per objective; MEM1 scores the task 0.
    assert objective_scores("a; b; c", [["a"], ["b"]]) == [(1.0, 1.0), (1.0, 1.0)]
    assert mem1_scores("a; b; c", [["a"], ["b"]]) == (0.0, 0.0)


def test_source_rows_only_with_more_than_one_source_and_in_the_report():
    keys = {"checkpoint": "c", "agent": "memory", "objectives": 2}
    recs = [
        {"data_source": "nq", "em": 1.0, "f1": 1.0},
        {"data_source": "nq", "em": 0.0, "f1": 0.5},
        {"data_source": "hotpotqa", "em": 0.5, "f1": 0.25},
    ]
    assert source_rows(recs[:2], keys, ("em", "f1")) == []
    rows = source_rows(recs, keys, ("em", "f1"))
    assert rows == [
        {**keys, "source": "nq", "tasks": 2, "em": 0.5, "f1": 0.75},
        {**keys, "source": "hotpotqa", "tasks": 1, "em": 0.5, "f1": 0.25},
    ]
    assert real_data_tables([{**keys, "tasks": 3, "em": 0.5, "f1": 0.6}], []) == ""  # single source: unchanged
    text = real_data_tables([{**keys, "tasks": 3, "em": 0.5, "f1": 0.6, "em_mem1": 1.0, "f1_mem1": 1.2}], rows)
    assert "MEM1's aggregation" in text and "| c | memory | 2 | nq | 2 | 0.500 | 0.750 |" in text


def test_a_pooled_tasks_source_does_not_depend_on_the_order_of_its_questions():
    """Per-source rows group by Task.source: a task of an NQ and a HotpotQA question is one group in either order."""
    from mempo.core.tasks import Question, Task

    nq, hp = Question("who?", ("a",), "q1", "nq"), Question("when?", ("b",), "q2", "hotpotqa")
    assert Task("t1", (nq, hp)).source == Task("t2", (hp, nq)).source == "hotpotqa+nq"
    assert Task("t3", (nq, Question("where?", ("c",), "q3", "nq"))).source == "nq"
