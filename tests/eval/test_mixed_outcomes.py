"""Evaluation aggregation over mixed outcomes: partial credit on a multi-objective task, a format failure and a
max-turn ending in one evaluation. Expected values are written by hand from the scripted answers (EM and F1 as
SQuAD defines them), not computed with the code under test: summary, records, table.csv and table.md.
"""

from __future__ import annotations

import csv
import json

import pytest
from scripted import CORPUS, TASK, TASK_B, ScriptedSampler

from mempo.core.format import Tags, format_turn
from mempo.core.tasks import Question, Task
from mempo.eval.compare import EvalConfig, evaluate_grid
from mempo.eval.evaluate import evaluate_agent
from mempo.eval.report import write_report
from mempo.rollout.agent import AgentConfig
from mempo.rollout.env import SearchEnv
from mempo.rollout.prompts import PromptBuilder
from mempo.rollout.retrievers import BM25Retriever
from mempo.rollout.sampler import SamplingConfig

TASK_C = Task("t2", (Question("Who founded Ometh Works?", ("Ilsa Varn",)),))


def script(text: str) -> str:
    if "When was Brask" in text:  # TASK_B: a malformed first turn (two actions)
        return "<mem>m</mem><think>t</think><search>a</search><search>b</search>"
    if "Who founded Ometh" in text:  # TASK_C: searches until max_turns
        return format_turn("still looking", "again", "search", "Ometh Works")
    # TASK: objective 1 exactly right, objective 2 partly: F1("Raitukrum city", "Raitukrum") = 2 * (1/2 * 1) / 1.5
    return format_turn("Q1: Brask Holdings.", "answer", "answer", "Brask Holdings; Raitukrum city")


@pytest.fixture(scope="module")
def parts(smollm2_tokenizer):
    builder = PromptBuilder(smollm2_tokenizer, Tags())
    env = SearchEnv(BM25Retriever(CORPUS), smollm2_tokenizer, topk=1, max_passage_tokens=32)
    return builder, env, AgentConfig(max_turns=3)


SAMPLING = SamplingConfig(max_new_tokens=64)


F1_PARTIAL = 2 * 0.5 * 1.0 / 1.5
# Per task: (em, f1, reward under mean_f1, format fail, turns, finish)
EXPECTED = {
    "t0": (0.5, (1.0 + F1_PARTIAL) / 2, (1.0 + F1_PARTIAL) / 2, 0.0, 1, "answer"),
    "t1": (0.0, 0.0, 0.0, 1.0, 1, "format_error"),
    "t2": (0.0, 0.0, 0.0, 0.0, 3, "max_turns"),
}


def test_summary_of_mixed_outcomes(parts):
    builder, env, agent = parts
    sampler = ScriptedSampler(builder.tokenizer, script)
    metrics, batch = evaluate_agent(
        sampler, env, [TASK, TASK_B, TASK_C], builder, agent, sampling=SAMPLING, reward_kind="mean_f1"
    )
    assert [t.finish for t in batch.trajectories] == [EXPECTED[k][5] for k in ("t0", "t1", "t2")]
    for i, key in enumerate(("em", "f1", "reward", "format_fail", "turns")):
        assert metrics[f"val/{key}"] == pytest.approx(sum(v[i] for v in EXPECTED.values()) / 3), key
    assert metrics["val/em"] == pytest.approx(0.5 / 3) and metrics["val/format_fail"] == pytest.approx(1 / 3)


def test_records_and_table_of_mixed_outcomes(parts, tmp_path):
    builder, env, agent = parts
    sampler = ScriptedSampler(builder.tokenizer, script)
    evaluation = EvalConfig(objectives=[1, 2], agents=["memory"], turn_slack=None)
    grid = evaluate_grid(
        sampler, env, builder, {1: [TASK_B, TASK_C], 2: [TASK]}, agent, SAMPLING, evaluation, checkpoint="s",
        reward_kind="mean_f1",
    )  # fmt: skip
    write_report(tmp_path, grid, num_tasks=2)
    records = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [r["task_id"] for r in records] == ["t1", "t2", "t0"]
    for r in records:
        em, f1, reward, fail, turns, finish = EXPECTED[r["task_id"]]
        assert (r["em"], r["reward"], r["turns"], r["finish"]) == (
            pytest.approx(em),
            pytest.approx(reward),
            turns,
            finish,
        )
        assert r["f1"] == pytest.approx(f1)
    assert records[0]["error"].startswith("turn 1:") and records[1]["error"] is None
    table = {int(r["objectives"]): r for r in csv.DictReader((tmp_path / "table.csv").open())}
    n1 = [EXPECTED["t1"], EXPECTED["t2"]]
    for n, rows in ((1, n1), (2, [EXPECTED["t0"]])):
        for i, key in enumerate(("em", "f1", "reward", "format_fail", "turns")):
            assert float(table[n][key]) == pytest.approx(sum(v[i] for v in rows) / len(rows)), (n, key)
        assert int(table[n]["tasks"]) == len(rows)
    md = (tmp_path / "table.md").read_text().splitlines()
    head = [c.strip() for c in md[0].strip("|").split("|")]
    cols = ["agent", "objectives", "tasks", "em", "f1", "reward", "format_fail", "turns"]

    def md_row(line: str) -> list[str]:
        cells = dict(zip(head, (c.strip() for c in line.strip("|").split("|"))))
        return [cells[c] for c in cols]

    assert md_row(md[2]) == ["memory", "1", "2", "0.000", "0.000", "0.000", "0.500", "2.000"]
    assert md_row(md[3]) == ["memory", "2", "1", "0.500", f"{(1 + F1_PARTIAL) / 2:.3f}", "0.833", "0.000", "1.000"]
