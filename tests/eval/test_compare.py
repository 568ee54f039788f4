"""The evaluation grid on scripted trajectories (exact token accounting, memory scoring) and the report files.

``ScriptedSampler`` (tests/support/scripted.py) writes the turns: what is under test is the accounting and the
report, not the model. The tiny model still scores the memories.
"""

from __future__ import annotations

import csv
import json

import pytest
from scripted import CORPUS, TASK, TASK_B, ScriptedSampler
from torch.testing import assert_close

from mempo.core.format import Tags
from mempo.eval.compare import EvalConfig, evaluate_grid
from mempo.eval.report import P_ANS_COLUMNS, TABLE_COLUMNS, write_report
from mempo.lm.scoring import answer_probabilities
from mempo.rollout.agent import AgentConfig
from mempo.rollout.env import SearchEnv
from mempo.rollout.prompts import PromptBuilder
from mempo.rollout.retrievers import BM25Retriever
from mempo.rollout.sampler import SamplingConfig

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def scripted(tiny_path):
    from mempo.lm.loading import load_policy

    policy, tok = load_policy(tiny_path)
    builder = PromptBuilder(tok, Tags())
    sampler = ScriptedSampler(tok)
    env = SearchEnv(BM25Retriever(CORPUS), tok, topk=1, max_passage_tokens=32)
    agent, sampling = AgentConfig(max_turns=4), SamplingConfig(max_new_tokens=64, temperature=1.0)
    evaluation = EvalConfig(objectives=[1, 2], agents=["memory", "full_history"], turn_slack=None)
    grid = evaluate_grid(
        sampler, env, builder, {1: [TASK_B], 2: [TASK]}, agent, sampling, evaluation, checkpoint="scripted",
        policy=policy,
        pad_id=tok.pad_token_id,
    )  # fmt: skip
    return grid, sampler, policy, builder


def test_token_accounting_matches_the_turns_the_sampler_saw(scripted):
    grid, sampler, _, _ = scripted
    # One task per N: the sampler saw each rollout's turns in order (N=1 memory, N=1 full, N=2 memory, N=2 full).
    assert [(r["objectives"], r["agent"]) for r in grid.records] == [
        (1, "memory"), (1, "full_history"), (2, "memory"), (2, "full_history"),
    ]  # fmt: skip
    pos = 0
    for rec in grid.records:
        turns = sampler.turns[pos : pos + rec["turns"]]
        pos += rec["turns"]
        assert rec["tt"] == sum(p + g for p, g in turns)
        assert rec["pt"] == max(p + g for p, g in turns)
        assert [s["context_tokens"] for s in rec["trace"]] == [p for p, _ in turns]
    assert pos == len(sampler.turns)
    by = {(r["objectives"], r["agent"]): r for r in grid.records}
    assert [s["action"] for s in by[(2, "memory")]["trace"]] == ["search", "search", "answer"]
    assert by[(2, "memory")]["trace"][1]["memory"] == "Q1: Brask Holdings. Q2: need Ometh Works."
    for rec in grid.records:
        assert (rec["em"], rec["f1"], rec["reward"], rec["finish"]) == (1.0, 1.0, 1.0, "answer")
    # Same turns, same generations: the full history's last prompt holds every earlier turn, the memory's does not.
    assert by[(2, "full_history")]["pt"] > by[(2, "memory")]["pt"]
    assert by[(2, "full_history")]["tt"] > by[(2, "memory")]["tt"]
    rows = {(r["objectives"], r["agent"]): r for r in grid.rows}
    for key, rec in by.items():
        assert (rows[key]["tt"], rows[key]["pt"], rows[key]["turns"]) == (rec["tt"], rec["pt"], rec["turns"])


def test_every_memory_is_scored_with_the_policy(scripted):
    grid, _, policy, builder = scripted
    expected = [(rec, s) for rec in grid.records for s in rec["trace"] if s["memory"]]
    assert len(grid.p_ans) == len(expected) == 2 * 2 + 2 * 3
    for row, (rec, step) in zip(grid.p_ans, expected):
        assert (row["task_id"], row["turn"], row["agent"]) == (rec["task_id"], step["turn"], rec["agent"])
        alone = answer_probabilities(
            policy,
            [builder.scoring_prompt(rec["question"], step["memory"])],
            [builder.answer_ids(rec["gold"])],
            pad_id=0,
        )
        assert_close(row["p_ans"], float(alone[0]))
        assert step["p_ans"] == row["p_ans"]
        assert 0.0 < row["p_ans"] <= 1.0


def test_report_files(scripted, tmp_path):
    grid, _, _, _ = scripted
    files = write_report(tmp_path, grid, num_tasks=1)
    lines = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert lines == json.loads(json.dumps(grid.records))
    table = list(csv.DictReader((tmp_path / "table.csv").open()))
    assert list(table[0]) == TABLE_COLUMNS and len(table) == 4
    for row in table:
        recs = [r for r in lines if (r["agent"], r["objectives"]) == (row["agent"], int(row["objectives"]))]
        for key in ("tt", "pt", "turns", "f1"):
            assert float(row[key]) == pytest.approx(sum(r[key] for r in recs) / len(recs))
    md = (tmp_path / "table.md").read_text().splitlines()
    assert md[0] == "| " + " | ".join(TABLE_COLUMNS) + " |" and len(md) == 2 + 4
    p_rows = list(csv.DictReader((tmp_path / "memory_p_ans.csv").open()))
    assert list(p_rows[0]) == P_ANS_COLUMNS and len(p_rows) == len(grid.p_ans)
    for name in ("f1_vs_objectives", "tokens_vs_objectives", "p_ans_by_turn"):
        data = files[name].read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 10_000, name


def test_a_report_without_scored_memories_draws_no_memory_figure(scripted, tmp_path):
    """eval.score_memories=false: no P(ans | q, m) exists, so no figure claims anything about memories (it once said
    "no well-formed memories were written" whenever scoring was off); an earlier run's figure and CSV are removed."""
    grid, _, _, _ = scripted
    write_report(tmp_path, grid, num_tasks=1)
    assert (tmp_path / "p_ans_by_turn.png").is_file() and (tmp_path / "memory_p_ans.csv").is_file()
    files = write_report(tmp_path, grid, num_tasks=1, memories_scored=False)
    assert "p_ans_by_turn" not in files and "memory_p_ans" not in files
    assert not (tmp_path / "p_ans_by_turn.png").exists() and not (tmp_path / "memory_p_ans.csv").exists()
    assert files["f1_vs_objectives"].read_bytes()[:8] == PNG_MAGIC


def test_the_f1_figure_draws_each_points_interval(monkeypatch, tmp_path):
    """At a single N (the demo's), two checkpoints: both points with their 95% intervals, set apart along N."""
    import matplotlib.axes

    import mempo.eval.report as report

    drawn = []
    real = matplotlib.axes.Axes.errorbar
    monkeypatch.setattr(matplotlib.axes.Axes, "errorbar", lambda ax, x, y, **kw: drawn.append((x, y, kw["yerr"]))
                        or real(ax, x, y, **kw))  # fmt: skip
    rows = [{"checkpoint": c, "agent": "memory", "objectives": 2, "f1": f, "f1_lo": lo, "f1_hi": hi}
            for c, f, lo, hi in (("warm_start", 0.4, 0.3, 0.55), ("rl", 0.5, 0.35, 0.6))]  # fmt: skip
    report.plot_f1(rows, tmp_path / "f1.png", num_tasks=64)
    (x0, y0, e0), (x1, y1, e1) = drawn
    assert (y0, y1) == ([0.4], [0.5]) and x0[0] < 2 < x1[0]
    assert_close(e0, [[0.1], [0.15]])  # distances below and above each mean
    assert_close(e1, [[0.15], [0.1]])
