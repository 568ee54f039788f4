"""experiments/eval.py end to end on the tiny model (two checkpoints, both agents, N = 1, 2), W&B logging offline,
the config checks of the eval group, and in-training validation in a 2-step fit."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mempo.eval.report import P_ANS_COLUMNS, TABLE_COLUMNS
from mempo.stages.evaluate import run_eval
from mempo.stages.train import fit_rl

ROOT = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# The main config's eval defaults are the demo's (memory agent only, no memory scoring, 2N + 2 turns): tests of the
# grid ask for everything, in few turns.
TINY_RUN = ["model=tiny", "sampler=hf", "agent.max_turns=2", "sampler.max_new_tokens=12", "eval.score_memories=true",
            "eval.turn_slack=null", "eval.agents=[memory,full_history]"]  # fmt: skip


def test_eval_script_compares_two_checkpoints_on_the_same_tasks(tiny_path, tmp_path):
    copy = tmp_path / "tiny-copy"
    shutil.copytree(tiny_path, copy)
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable, str(ROOT / "experiments" / "eval.py"), *TINY_RUN, "eval.objectives=[1,2]", "eval.num_tasks=2",
        f"eval.checkpoints={{base:'{tiny_path}',copy:'{copy}'}}", f"run_dir={run_dir}",
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = run_dir / "eval"
    table = list(csv.DictReader((out / "table.csv").open()))
    assert list(table[0]) == TABLE_COLUMNS
    keys = [(r["checkpoint"], r["agent"], int(r["objectives"])) for r in table]
    assert sorted(keys) == sorted(
        (c, a, n) for c in ("base", "copy") for a in ("memory", "full_history") for n in (1, 2)
    )
    records = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert len(records) == 8 * 2
    for field in ("task_id", "question", "gold", "answer", "em", "f1", "reward", "finish", "error", "tt", "pt"):
        assert field in records[0], field
    for n in (1, 2):  # every checkpoint and agent saw the same tasks
        ids: dict[tuple[str, str], list[str]] = {}
        for r in records:
            if r["objectives"] == n:
                ids.setdefault((r["checkpoint"], r["agent"]), []).append(r["task_id"])
        assert len(ids) == 4 and len({tuple(v) for v in ids.values()}) == 1
        assert len(set(next(iter(ids.values())))) == 2
    for row in table:
        recs = [r for r in records if (r["checkpoint"], r["agent"], r["objectives"]) == (
            row["checkpoint"], row["agent"], int(row["objectives"]))]  # fmt: skip
        assert float(row["tt"]) == pytest.approx(sum(r["tt"] for r in recs) / len(recs))
        assert float(row["pt"]) == pytest.approx(sum(r["pt"] for r in recs) / len(recs))
        assert float(row["tt"]) >= float(row["pt"]) > 0
    # The two folders hold the same weights: greedy decoding gives the same rows.
    by = dict(zip(keys, table))
    for c, a, n in keys:
        assert {k: v for k, v in by[(c, a, n)].items() if k != "checkpoint"} == {
            k: v for k, v in by[("base", a, n)].items() if k != "checkpoint"
        }
    assert len((out / "table.md").read_text().splitlines()) == 2 + 8
    with (out / "memory_p_ans.csv").open() as f:
        assert next(csv.reader(f)) == P_ANS_COLUMNS
    for name in ("f1_vs_objectives", "tokens_vs_objectives", "p_ans_by_turn"):
        data = (out / f"{name}.png").read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 10_000, name


def test_wandb_logs_tables_and_figures_offline(make_cfg, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    cfg = make_cfg(*TINY_RUN, "logger=wandb", "eval.objectives=[1]", "eval.num_tasks=1", "eval.agents=[memory]",
                   f"run_dir={tmp_path}")  # fmt: skip
    run_eval(cfg)
    runs = list((tmp_path / "eval" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    media = runs[0] / "files" / "media"
    images = sorted(p.name.split("_0_")[0] for p in (media / "images" / "eval").glob("*.png"))
    assert images == ["f1_vs_objectives", "p_ans_by_turn", "tokens_vs_objectives"]
    (table,) = (json.loads(p.read_text()) for p in (media / "table" / "eval").glob("table_*.table.json"))
    assert table["columns"] == TABLE_COLUMNS and len(table["data"]) == 1
    (trajs,) = (json.loads(p.read_text()) for p in (media / "table" / "eval").glob("trajectories_*.table.json"))
    assert {"question", "memories", "answer", "reward"} <= set(trajs["columns"]) and len(trajs["data"]) == 1
    record = json.loads((tmp_path / "eval" / "results.jsonl").read_text().splitlines()[0])
    assert trajs["data"][0][trajs["columns"].index("question")] == record["question"]


@pytest.mark.parametrize(
    ("override", "key"),
    [("eval.agents=[memory,react]", "eval.agents"), ("eval.objectives=[0]", "eval.objectives"),
     ("eval.every_n_steps=-1", "eval.every_n_steps")],
)  # fmt: skip
def test_bad_eval_config_names_the_key(make_cfg, override, key):
    with pytest.raises(ValueError, match=key):
        make_cfg(override)


def test_validation_every_k_steps_lands_in_metrics_csv(make_cfg, tmp_path):
    cfg = make_cfg(
        *TINY_RUN, "data.batch_size=2", "data.group_size=2", "trainer.max_steps=2", "eval.every_n_steps=2",
        "data.num_val_tasks=2", "loss.kl_coef=0", f"run_dir={tmp_path}",
    )  # fmt: skip
    module, _ = fit_rl(cfg)
    rows = list(csv.DictReader((tmp_path / "metrics.csv").open()))
    assert [int(r["step"]) for r in rows] == [1, 2]
    for key in ("val/f1", "val/em", "val/tt", "val/pt", "val/format_fail"):
        assert rows[0][key] == "", key  # step 1 is not a validation step
        assert rows[1][key] != "", key
    assert float(rows[1]["val/tt"]) >= float(rows[1]["val/pt"]) > 0
    assert 0.0 <= float(rows[1]["val/f1"]) <= 1.0
    assert module.last_metrics["val/pt"] == float(rows[1]["val/pt"])


@pytest.mark.parametrize("split", ["train", "val"])
def test_eval_split_picks_the_world_its_tasks_ask_about(make_cfg, tmp_path, split):
    """eval.split=train evaluates RL's task distribution (questions about the training world), val the held-out
    world's: told apart by the question texts each world asks, not by the task ids the code writes."""
    from mempo.data.synthetic import heldout_world
    from mempo.stages.builders import synthetic_world

    cfg = make_cfg(*TINY_RUN, "eval.objectives=[1]", "eval.num_tasks=3", "eval.agents=[memory]",
                   "eval.score_memories=false", f"eval.split={split}", f"run_dir={tmp_path}")  # fmt: skip
    run_eval(cfg)
    asked = {json.loads(x)["question"] for x in (tmp_path / "eval" / "results.jsonl").read_text().splitlines()}
    train_world = synthetic_world(cfg)
    texts = {
        "train": {q.question.question for q in train_world.all_questions()},
        "val": {q.question.question for q in heldout_world(train_world).all_questions()},
    }
    assert len(asked) == 3
    assert asked <= texts[split]
    assert not asked & texts["val" if split == "train" else "train"]


def test_kl_reference_gives_each_checkpoint_its_kl_to_the_warm_start(make_cfg, tiny_path, tmp_path):
    """eval.kl_reference through the stage, memory scoring off: the reference against itself reads exactly 0, a moved
    copy of it more (the estimate itself is checked by hand in tests/eval/test_kl_reference.py)."""
    import torch

    from mempo.lm.loading import load_policy

    moved = tmp_path / "moved"
    shutil.copytree(tiny_path, moved)
    policy, _ = load_policy(tiny_path)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    policy.save_pretrained(moved)
    run_dir = tmp_path / "run"
    cfg = make_cfg(*TINY_RUN, "eval.score_memories=false", "eval.agents=[memory]", "eval.objectives=[1]",
                   "eval.num_tasks=2", "eval.greedy=false", f"eval.kl_reference='{tiny_path}'",
                   f"eval.checkpoints={{start:'{tiny_path}',moved:'{moved}'}}", f"run_dir={run_dir}")  # fmt: skip
    run_eval(cfg)
    table = {r["checkpoint"]: r for r in csv.DictReader((run_dir / "eval" / "table.csv").open())}
    assert (float(table["start"]["kl_k1"]), float(table["start"]["kl_k3"])) == (0.0, 0.0)
    assert float(table["moved"]["kl_k3"]) > 0.01 and float(table["moved"]["kl_tokens"]) > 0
