"""Memory-credit records and their report: slot parsing, early answers on a real chain, and the per-step summary of
a small hand-written file, each value worked out by hand."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from torch.testing import assert_close

from mempo.core.format import format_turn, parse_turn
from mempo.core.tasks import Task
from mempo.data.synthetic import SyntheticWorld
from mempo.eval.memory_credit import (
    answered_early,
    load_credit,
    main,
    memory_slots,
    run_labels,
    runs_summary,
    states_every_value,
    summarize,
    within_group_correlation,
)
from mempo.rollout.agent import Trajectory, TurnSample


def test_slots_and_complete_memories():
    assert memory_slots("Q1: 2020. Q2: need the birth year of Ann Lee.") == {
        1: "2020.",
        2: "need the birth year of Ann Lee.",
    }
    assert states_every_value("Q1: 2020. Q2: 1990.", 2)
    assert not states_every_value("Q1: 2020. Q2: need the birth year of Ann Lee.", 2)
    assert not states_every_value("Q1: founder is Ann Lee; need her birth year. Q2: 1990.", 2)
    assert not states_every_value("Q1: 2020.", 2)  # the second objective has no slot
    assert states_every_value("Q1: Tridranesh. Q2: Tridranesh.", 2)  # a guessed slot states a value too
    assert states_every_value("Paris", 1) and not states_every_value("need the capital", 1)


@pytest.fixture(scope="module")
def chain():
    world = SyntheticWorld.generate(0)
    return next(q for q in world.all_questions() if q.template == "founder.birth_country")


def _traj(chain, turns: list[tuple[str, str]], finish: str) -> Trajectory:
    traj = Trajectory(0, 0, Task("t", (chain.question,)), finish=finish)
    for k, (action, argument) in enumerate(turns, start=1):
        text = format_turn("Q1: need it.", "thinking", action, argument)
        traj.turns.append(TurnSample(0, 0, k, [1], [2], [0.0], [False], text, parse_turn(text)))
    return traj


def test_answered_early_on_a_two_hop_chain(chain):
    h1, h2 = chain.hops
    chains = {chain.question.qid: chain}
    assert answered_early(_traj(chain, [("answer", "x")], "answer"), chains)  # no query at all
    assert answered_early(_traj(chain, [("search", h1.query), ("answer", "x")], "answer"), chains)  # hop 2 unnamed
    full = [("search", h1.entity.upper()), ("search", f"who is {h2.entity}"), ("answer", "x")]
    assert not answered_early(_traj(chain, full, "answer"), chains)  # both entities named (any case)
    assert not answered_early(_traj(chain, [("search", h1.query)], "max_turns"), chains)  # never answered
    assert answered_early(_traj(chain, [("answer", "x")], "answer"), {}) is None  # no chain known


def _rec(step, group, rollout, turn, p, adv, traj_adv, action="search: q", complete=False):
    return {"step": step, "task_id": f"t{group}", "group": group, "rollout": rollout, "turn": turn, "objectives": 2,
            "memory": "m", "p_ans": p, "mem_reward": p, "mem_adv": adv, "traj_adv": traj_adv, "traj_reward": 0.0,
            "action": action, "complete": complete}  # fmt: skip


# Step 1, group 0: a noise group (best P 0.008 < 0.01, A^M spans 2.0); group 1: A^M and A^T move together exactly.
# Step 2, group 0: A^T constant (left out of the correlation).
RECORDS = [
    _rec(1, 0, 0, 1, 0.002, -1.0, 1.0),
    _rec(1, 0, 1, 1, 0.008, 1.0, -1.0),
    _rec(1, 1, 2, 1, 0.1, -1.0, -0.5),
    _rec(1, 1, 2, 2, 0.3, 0.0, -0.5, action="answer: a; b", complete=True),
    _rec(1, 1, 3, 1, 0.5, 1.0, 1.5, action="answer: a; b", complete=True),
    _rec(2, 0, 0, 3, 0.4, 0.5, 0.0),
    _rec(2, 0, 1, 3, 0.6, -0.5, 0.0, complete=True),
]


def test_within_group_correlation_by_hand():
    # step 1 group 0: two points in opposite directions: r = -1. Group 1: A^M = [-1, 0, 1] against A^T =
    # [-0.5, -0.5, 1.5]: centred [-1, 0, 1] and [-2/3, -2/3, 4/3]: r = 2 / sqrt(2 * 8/3) = 0.8660.
    # step 2 group 0: A^T constant -> left out. Mean of (-1, 0.8660) = -0.0670.
    assert_close(within_group_correlation(RECORDS), (-1 + math.sqrt(3) / 2) / 2)
    assert math.isnan(within_group_correlation(RECORDS[5:]))


def test_summary_of_a_hand_written_file(tmp_path):
    path = tmp_path / "memory_credit.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    rows = summarize(load_credit(path))
    assert [r["step"] for r in rows] == [1, 2]
    one, two = rows
    assert one["memories"] == 5 and one["noise_groups"] == "1/2" and two["noise_groups"] == "0/1"
    assert_close(one["p_ans_mean"], (0.002 + 0.008 + 0.1 + 0.3 + 0.5) / 5)
    assert_close(one["complete_frac"], 0.4)
    assert_close(one["A^M turn 1"], (-1 + 1 - 1 + 1) / 4)  # 0.0
    assert_close(one["A^M turn 2"], 0.0)
    assert_close(one["A^M complete"], 0.5)  # (0 + 1) / 2
    assert_close(one["A^M not complete"], -1 / 3)  # (-1 + 1 - 1) / 3
    assert_close(one["A^M then answer"], 0.5)
    assert_close(two["A^M turn 3+"], 0.0)
    assert math.isnan(two["A^M turn 1"])
    assert math.isnan(two["adv_corr"])
    (tmp_path / "metrics.csv").write_text("step,memory/adv_share,rollout/early_answer_rate\n1,0.6,0.25\n2,0.5,\n")
    assert main([str(tmp_path)]) == 0
    report = (tmp_path / "memory_credit.md").read_text()
    assert "| 1 | 5 |" in report and "| 1 | 0.600 | 0.250 |" in report
    assert (tmp_path / "memory_credit.png").stat().st_size > 0


def test_a_bad_line_is_named_by_file_and_line(tmp_path):
    path = tmp_path / "memory_credit.jsonl"
    good = json.dumps(RECORDS[0])
    path.write_text(f"{good}\n{{not json\n")
    with pytest.raises(ValueError, match=r"memory_credit.jsonl:2: not valid JSON"):
        load_credit(path)
    path.write_text(f"{good}\n\n{json.dumps({'step': 1})}\n")
    with pytest.raises(ValueError, match=r"memory_credit.jsonl:3: record lacks task_id, group"):
        load_credit(path)
    with pytest.raises(FileNotFoundError, match="no memory_credit.jsonl"):
        main([str(tmp_path / "empty")])


# A second run: one step, two turn-1 memories of one group, A^M against A^T exactly opposite (r = -1).
OTHER = [_rec(3, 0, 0, 1, 0.2, -1.0, 1.0), _rec(3, 0, 1, 1, 0.4, 0.5, -1.0)]


def test_runs_side_by_side_by_hand():
    one, two = runs_summary({"a": RECORDS, "b": OTHER}, edge=1)
    assert (one["run"], one["steps"], one["memories"]) == ("a", 2, 7) and (two["steps"], two["memories"]) == (1, 2)
    assert_close(one["P first 1"], (0.002 + 0.008 + 0.1 + 0.3 + 0.5) / 5)  # step 1's memories
    assert_close(one["P last 1"], 0.5)  # step 2's: (0.4 + 0.6) / 2
    assert_close(one["complete first 1"], 0.4)
    assert_close(one["complete last 1"], 0.5)
    # turn 1: step 1's mean is 0.0 (not below 0), step 2 has none; turn 3+: only step 2, mean 0.0 (not above 0);
    # complete vs other: step 1 0.5 > -1/3, step 2 -0.5 < 0.5.
    assert (one["A^M turn 1 < 0"], one["A^M turn 3+ > 0"], one["A^M complete > other"]) == ("0/1", "0/1", "1/2")
    assert_close(one["adv_corr median"], (-1 + math.sqrt(3) / 2) / 2)  # step 2's is undefined: only step 1's
    assert_close(two["P first 1"], 0.3)
    assert_close(two["P last 1"], 0.3)
    assert (two["A^M turn 1 < 0"], two["A^M turn 3+ > 0"], two["A^M complete > other"]) == ("1/1", "0/0", "0/0")
    assert_close(two["adv_corr median"], -1.0)


def test_several_runs_are_reported_together_outside_the_runs(tmp_path):
    for name, records in (("a", RECORDS), ("b", OTHER)):
        (tmp_path / name / "mempo_s3").mkdir(parents=True)
        (tmp_path / name / "mempo_s3" / "memory_credit.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in records)
        )
    runs = [str(tmp_path / "a" / "mempo_s3"), str(tmp_path / "b" / "mempo_s3")]
    assert run_labels([Path(r) for r in runs]) == ["a/mempo_s3", "b/mempo_s3"]
    assert run_labels([tmp_path / "a", tmp_path / "b"]) == ["a", "b"]
    with pytest.raises(SystemExit):  # several runs and no --out: nothing is written into any run
        main(runs)
    assert main([*runs, "--out", str(tmp_path / "report")]) == 0
    report = (tmp_path / "report" / "memory_credit_runs.md").read_text()
    assert "| a/mempo_s3 | 2 | 7 |" in report and "| b/mempo_s3 | 1 | 2 |" in report
    assert report.count("## Memory credit of") == 2
    assert (tmp_path / "report" / "memory_credit_b_mempo_s3.png").stat().st_size > 0
    assert not list(tmp_path.glob("[ab]/mempo_s3/memory_credit.[mp]*"))  # the runs' folders are left as they were
