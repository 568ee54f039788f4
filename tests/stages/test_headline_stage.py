"""The ``headline`` stage end to end on the tiny model (``+exp=headline_quick +debug=default``): five arms x N rows,
each arm evaluated with its own agent on the same tasks, the RL arms on one budget, the ReAct warm start built
from full-history renderings of the same teacher trajectories, and a second run that retrains nothing.

That the full-history renderings equal the agent loop's prompts token for token is tests/models/sft/test_sft_wiring.py.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import mempo.stages.train
from mempo.eval.headline import HEADLINE_COLUMNS
from mempo.eval.report import read_records
from mempo.stages import run_stage
from mempo.stages.config import compose_config
from mempo.stages.headline import ARMS

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
AGENTS = {"warm_start": "memory", "mempo": "memory", "ablation_nomem": "memory",
          "react_warm_start": "full_history", "react_grpo": "full_history"}  # fmt: skip
OVERRIDES = ["+exp=headline_quick", "+debug=default"]  # debug: N in [1, 2], 2 tasks, 2 SFT and 2 RL steps


def spy_on_sft_examples(mp: pytest.MonkeyPatch) -> list[dict]:
    """Record the context and the teacher turns of every ``build_sft_examples`` call (the sft stage's own name)."""
    calls: list[dict] = []
    real = mempo.stages.train.build_sft_examples

    def spy(trajectories, *args, **kw):
        calls.append({"context": kw["context"], "teacher": [(t.task_id, list(turns)) for t, turns in trajectories]})
        return real(trajectories, *args, **kw)

    mp.setattr(mempo.stages.train, "build_sft_examples", spy)
    return calls


@pytest.fixture(scope="module")
def first(tiny_path, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("headline")
    with pytest.MonkeyPatch.context() as mp:
        calls = spy_on_sft_examples(mp)
        summary = run_stage(compose_config(*OVERRIDES, f"run_dir={run_dir}"))
    return run_dir, summary, calls


def read_table(run_dir: Path) -> list[dict]:
    with (run_dir / "eval" / "table.csv").open(newline="") as f:
        return list(csv.DictReader(f))


def test_table_has_every_arm_at_every_n_with_the_required_columns(first):
    run_dir, summary, _ = first
    table = read_table(run_dir)
    assert list(table[0]) == HEADLINE_COLUMNS
    assert [(r["arm"], int(r["objectives"])) for r in table] == [(a, n) for a in ARMS for n in (1, 2)]
    assert all(int(r["tasks"]) == 2 for r in table)
    assert [r["arm"] for r in summary["rows"]] == [r["arm"] for r in table]
    # 3 memory-agent arms x 2 ReAct arms, at the largest N
    assert {(r["memory_arm"], r["react_arm"], r["objectives"]) for r in summary["ratios"]} == {
        (m, x, 2) for m in ARMS[:3] for x in ARMS[3:]
    }
    md = (run_dir / "eval" / "table.md").read_text()
    assert "- mempo / react_grpo: PT " in md and "Token ratios at N=2" in md
    for name in ("f1_vs_n", "pt_vs_n", "tt_vs_n"):
        assert (run_dir / "eval" / f"{name}.png").read_bytes()[:8] == PNG_MAGIC, name


def test_each_arm_is_evaluated_with_its_own_agent_on_the_same_tasks(first):
    run_dir, summary, _ = first
    assert {r["arm"]: r["agent"] for r in read_table(run_dir)} == AGENTS
    records = read_records(run_dir / "eval" / "grid" / "results.jsonl")
    assert len(records) == 5 * 2 * 2
    assert {r["checkpoint"]: r["agent"] for r in records} == AGENTS  # one agent per arm, the right one
    for n in (1, 2):
        ids = {a: [r["task_id"] for r in records if r["checkpoint"] == a and r["objectives"] == n] for a in ARMS}
        assert len({tuple(v) for v in ids.values()}) == 1 and len(ids["mempo"]) == 2


def test_the_rl_arms_share_one_budget_and_differ_only_by_their_deltas(first):
    run_dir, summary, _ = first

    def flat(arm: str) -> dict:
        cfg = OmegaConf.load(run_dir / arm / "config.yaml")
        return {k: OmegaConf.select(cfg, k) for k in _keys(OmegaConf.to_container(cfg)) if k != "provenance.model"}

    mempo, nomem, react = flat("mempo"), flat("ablation_nomem"), flat("react_grpo")
    differ = {k for k in mempo if mempo[k] != nomem[k]}
    assert differ == {"name", "run_dir", "memory.alpha"} and nomem["memory.alpha"] == 0.0
    differ = {k for k in mempo if mempo[k] != react[k]}
    assert differ == {"name", "run_dir", "model.name_or_path", "agent.context", "advantage.estimator", "memory.alpha"}
    assert (react["agent.context"], react["advantage.estimator"], react["memory.alpha"]) == ("full_history", "grpo", 0)
    assert mempo["model.name_or_path"] == str((run_dir / "warm_start" / "hf").resolve())
    assert react["model.name_or_path"] == str((run_dir / "react_warm_start" / "hf").resolve())
    for arm in ("mempo", "ablation_nomem", "react_grpo"):
        assert json.loads((run_dir / arm / "summary.json").read_text())["steps"] == 2 == mempo["trainer.max_steps"]


def _keys(d: dict, prefix: str = "") -> list[str]:
    return [k for key, v in d.items() for k in (_keys(v, f"{prefix}{key}.") if isinstance(v, dict) else [prefix + key])]


def test_the_react_warm_start_replays_the_same_teacher_with_full_history_prompts(first):
    run_dir, summary, calls = first
    assert [c["context"] for c in calls] == ["memory", "full_history"]
    assert calls[0]["teacher"] == calls[1]["teacher"] and len(calls[0]["teacher"]) == 8  # 4 tasks x N in [1, 2]
    assert OmegaConf.load(run_dir / "react_warm_start" / "config.yaml").agent.context == "full_history"
    assert OmegaConf.load(run_dir / "warm_start" / "config.yaml").agent.context == "memory"


def test_a_second_run_reuses_every_checkpoint(first):
    run_dir, summary, _ = first
    assert {a: s["status"] for a, s in summary["arms"].items()} == dict.fromkeys(ARMS, "trained")
    weights = {a: run_dir / a / "hf" / "model.safetensors" for a in ARMS}
    before = {a: p.stat().st_mtime_ns for a, p in weights.items()}
    with pytest.MonkeyPatch.context() as mp:
        calls = spy_on_sft_examples(mp)
        again = run_stage(compose_config(*OVERRIDES, f"run_dir={run_dir}"))
    assert calls == []
    assert {a: s["status"] for a, s in again["arms"].items()} == dict.fromkeys(ARMS, "reused")
    assert {a: p.stat().st_mtime_ns for a, p in weights.items()} == before
    assert again["rows"] == summary["rows"]  # greedy evaluation of the same weights on the same tasks


def test_a_warm_start_key_naming_no_model_folder_fails_before_anything_loads(tmp_path):
    cfg = compose_config(*OVERRIDES, f"run_dir={tmp_path}", f"headline.react_warm_start={tmp_path / 'none'}")
    with pytest.raises(FileNotFoundError, match=r"headline\.react_warm_start"):
        run_stage(cfg)
