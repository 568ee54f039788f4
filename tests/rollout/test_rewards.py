"""EM / F1 against hand-computed values, answer splitting and the trajectory reward with its format gate."""

from __future__ import annotations

import pytest

from mempo.core.tasks import ANSWER_SEPARATOR, Question, Task
from mempo.rollout.rewards import (
    REWARD_KINDS,
    exact_match,
    f1_score,
    normalize_answer,
    objective_scores,
    split_answers,
    trajectory_reward,
)


@pytest.mark.parametrize(
    "raw, normalized",
    [
        ("The Eiffel Tower!", "eiffel tower"),
        ("  an   apple,  a pear ", "apple pear"),
        ("Theory of the Leisure Class", "theory of leisure class"),  # "the" only as a whole word
        ("U.S.A.", "usa"),
        ("", ""),
    ],
)
def test_normalize_answer(raw, normalized):
    assert normalize_answer(raw) == normalized


def test_exact_match_uses_best_alias_and_normalization():
    assert exact_match("the Paris.", ["Lutetia", "paris"]) == 1.0
    assert exact_match("Paris France", ["paris"]) == 0.0
    assert exact_match("paris", "Paris") == 1.0  # a bare string is one alias
    assert exact_match("paris", []) == 0.0


def test_f1_hand_computed():
    # pred tokens {barack, obama, jr}, gold {barack, obama}: p = 2/3, r = 1, f1 = 2 * (2/3) / (5/3) = 0.8
    assert f1_score("Barack Obama Jr.", ["Barack Obama"]) == pytest.approx(0.8)
    # best alias: "obama" gives p = 1/3, r = 1 -> 0.5; "barack hussein obama" gives p = r = 2/3
    assert f1_score("Barack Obama Jr.", ["Obama", "Barack Hussein Obama"]) == pytest.approx(2 / 3)
    # repeated tokens count with multiplicity: common = 1 "new", p = 1/2, r = 1/2
    assert f1_score("new new", ["new york"]) == pytest.approx(0.5)
    assert f1_score("rome", ["paris"]) == 0.0
    assert f1_score("", ["paris"]) == 0.0
    assert f1_score("the", ["a"]) == 1.0  # both normalize to empty
    assert f1_score("paris", []) == 0.0


def test_split_answers_separator_padding_and_extras():
    assert split_answers("Paris; Rome", 2) == ["Paris", "Rome"]
    assert split_answers("Paris;Rome ;  Oslo", 3) == ["Paris", "Rome", "Oslo"]
    assert split_answers("Paris", 3) == ["Paris", "", ""]
    assert split_answers("a; b; c; d", 2) == ["a", "b"]  # extras ignored
    assert split_answers(None, 2) == ["", ""]
    assert split_answers("(1) Paris; (2) Rome", 2) == ["Paris", "Rome"]  # the question's own numbering
    assert split_answers("Tom; Jerry", 1) == ["Tom; Jerry"]  # one objective: the whole answer
    with pytest.raises(ValueError, match="n must be >= 1"):
        split_answers("x", 0)


def test_objective_scores_per_objective():
    gold = (("Paris",), ("New York City", "NYC"))
    assert objective_scores("paris; new york", gold) == [(1.0, 1.0), (0.0, pytest.approx(0.8))]
    assert objective_scores(None, gold) == [(0.0, 0.0), (0.0, 0.0)]
    with pytest.raises(ValueError, match="gold_answers is empty"):
        objective_scores("x", ())


def test_trajectory_reward_kinds_and_format_gate():
    task = Task("t1", (Question("Capital of France?", ("Paris",)), Question("Largest US city?", ("New York City",))))
    gold = task.gold_answers
    assert trajectory_reward(task.gold, gold, format_ok=True) == 1.0
    assert task.gold == f"Paris{ANSWER_SEPARATOR}New York City"
    half = "Paris; New York"  # second: p = 1, r = 2/3 -> f1 = 0.8
    assert trajectory_reward(half, gold, format_ok=True, kind="all_em") == 0.0
    assert trajectory_reward(half, gold, format_ok=True, kind="mean_em") == 0.5
    assert trajectory_reward(half, gold, format_ok=True, kind="mean_f1") == pytest.approx(0.9)
    for kind in REWARD_KINDS:
        assert trajectory_reward(task.gold, gold, format_ok=False, kind=kind) == 0.0
        assert trajectory_reward(None, gold, format_ok=True, kind=kind) == 0.0


def test_unknown_reward_kind_names_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown 'em'.*\['all_em', 'mean_em', 'mean_f1'\]"):
        trajectory_reward("x", (("x",),), format_ok=True, kind="em")
