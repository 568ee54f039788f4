"""Failure verdicts: one hand-written trajectory per verdict, on a real two-hop chain of the synthetic world."""

from __future__ import annotations

import pytest

from mempo.core.format import format_turn, parse_turn
from mempo.core.tasks import Task
from mempo.data.synthetic import SyntheticWorld
from mempo.eval.failures import VERDICTS, failure_tally, objective_verdict
from mempo.rollout.agent import Trajectory, TurnSample
from mempo.rollout.rewards import objective_scores


@pytest.fixture(scope="module")
def chain():
    world = SyntheticWorld.generate(0)
    return next(q for q in world.all_questions() if q.template == "founder.birth_country")


def make_traj(chain, turns: list[tuple[str, str, str]], finish: str, answer: str | None = None) -> Trajectory:
    """turns: (memory, action, argument) each; a well-formed turn text is built from them."""
    task = Task("t", (chain.question,))
    traj = Trajectory(0, 0, task, finish=finish, answer=answer)
    for k, (memory, action, argument) in enumerate(turns, start=1):
        text = format_turn(memory, "thinking", action, argument)
        traj.turns.append(TurnSample(0, 0, k, [1], [2], [0.0], [False], text, parse_turn(text)))
    traj.scores = objective_scores(answer, task.gold_answers)
    return traj


def test_each_verdict(chain) -> None:
    h1, h2 = chain.hops
    gold = chain.question.answers[0]
    ok = [("need founder", "search", h1.query), (f"founder is {h1.answer}", "search", h2.query)]
    cases = {
        "correct": make_traj(chain, [*ok, (f"Q1: {gold}.", "answer", gold)], "answer", gold),
        "wrong_query": make_traj(
            chain, [("need it", "search", "something else"), ("no", "answer", "x")], "answer", "x"
        ),  # fmt: skip
        "fact_not_carried": make_traj(
            chain, [("need founder", "search", h1.query), ("still need founder", "answer", "x")], "answer", "x"
        ),
        "memory_lost": make_traj(
            chain, [*ok, (f"Q1: {gold}.", "search", "more"), ("forgot", "answer", "x")], "answer", "x"
        ),  # fmt: skip
        "wrong_answer": make_traj(chain, [*ok, (f"Q1: {gold}.", "answer", "Nowhere")], "answer", "Nowhere"),
        "no_answer": make_traj(chain, [*ok, (f"Q1: {gold}.", "search", h2.query)], "max_turns"),
        "format": make_traj(chain, [*ok], "format_error"),
    }
    for expected, traj in cases.items():
        assert objective_verdict(traj, 0, chain) == expected, expected
    tally = failure_tally(list(cases.values()), {chain.question.qid: chain})
    assert list(tally) == list(VERDICTS) and all(tally[v] == 1 for v in VERDICTS)


def test_a_question_without_a_chain_is_named(chain) -> None:
    traj = make_traj(chain, [("m", "answer", "x")], "answer", "x")
    with pytest.raises(KeyError, match=chain.question.qid):
        failure_tally([traj], {})
