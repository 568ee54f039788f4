"""The demo's RL phase applies exp/grpo_cpu.yaml's recipe as a delta (like the headline's arms), keeps the demo's
budget, and lets the command line win; config.yaml's MemPO defaults stay what the run's own config holds.

Expected values are read off experiments/configs/exp/grpo_cpu.yaml and config.yaml by hand, not from the code.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import DictConfig

from mempo.stages import with_overrides
from mempo.stages.config import compose_config
from mempo.stages.demo import DEMO_RATES, demo_steps, expected_seconds

# exp/grpo_cpu.yaml's recipe keys (its data.batch_size=4, trainer.max_steps=10, ckpt.every_n_steps=5,
# eval.every_n_steps=10, optim.lr=3e-5 and memory.log_p_ans are not the demo's)
GRPO_CPU = {
    "data.group_size": 8,
    "data.num_val_tasks": 16,
    "model.train_top_layers": 8,
    "reward.kind": "mean_em",
    "memory.alpha": 0.0,
    "sampler.canary_every": 2,
}


def rl_phase(cfg: DictConfig) -> DictConfig:
    """The config the demo's RL phase runs with (as ``run_steps`` builds it)."""
    (step,) = [s for s in demo_steps(cfg) if s.label == "rl"]
    return with_overrides(cfg, {"stage": "rl", **step.overrides})


def value(cfg: DictConfig, key: str) -> object:
    node = cfg
    for part in key.split("."):
        node = node[part]
    return node


def test_the_rl_phase_runs_the_grpo_cpu_recipe_with_the_demos_budget(tmp_path: Path) -> None:
    cfg = compose_config(f"run_dir={tmp_path}")
    rl = rl_phase(cfg)
    assert {k: value(rl, k) for k in GRPO_CPU} == GRPO_CPU
    assert rl.trainer.max_steps == cfg.trainer.max_steps != 10  # the demo's steps, not grpo_cpu's 10
    assert rl.data.batch_size == cfg.data.batch_size == 2  # the demo's tasks per step, not grpo_cpu's 4
    assert rl.ckpt.every_n_steps == cfg.ckpt.every_n_steps
    assert rl.eval.every_n_steps == 2  # demo.val_every, not grpo_cpu's 8
    assert rl.memory.log_p_ans is False  # a diagnostic grpo_cpu turns on, the demo does not pay for
    assert rl.optim.lr == cfg.optim.lr == 1e-5  # config.yaml's at the demo's 2 steps, not grpo_cpu's 3e-5
    assert rl.model.name_or_path == str(tmp_path / "sft" / "hf")
    # the run's own config (and so the rl stage and every other experiment) keeps MemPO's defaults
    assert cfg.memory.alpha == 1.0 and cfg.data.batch_size == 2 and cfg.model.train_top_layers is None


def test_a_command_line_key_wins_over_the_recipe(tmp_path: Path) -> None:
    rl = rl_phase(compose_config(f"run_dir={tmp_path}", "memory.alpha=1", "optim.lr=3e-5", "demo.val_every=0"))
    assert rl.memory.alpha == 1.0 and rl.optim.lr == 3e-5  # MemPO on the grpo_cpu recipe, grpo_cpu's lr
    assert rl.data.batch_size == 2 and rl.data.group_size == 8 and rl.model.train_top_layers == 8
    assert rl.eval.every_n_steps == 0


def test_without_a_recipe_the_rl_phase_runs_the_runs_config(tmp_path: Path) -> None:
    rl = rl_phase(compose_config(f"run_dir={tmp_path}", "demo.rl_exp=null"))
    assert rl.memory.alpha == 1.0 and rl.data.batch_size == 2 and rl.data.group_size == 4
    assert rl.optim.lr == 1e-5 and rl.model.train_top_layers is None


def test_an_unknown_recipe_is_an_error_naming_the_key() -> None:
    with pytest.raises(ValueError, match=r"demo\.rl_exp"):
        compose_config("demo.rl_exp=no_such_experiment")


def test_the_expected_time_scales_the_measured_rates_by_the_configs_sizes(tmp_path: Path) -> None:
    cfg = compose_config(f"run_dir={tmp_path}", "sft.num_tasks=10", "trainer.max_steps=3", "eval.num_tasks=5")
    got = expected_seconds(cfg, "avx2")
    r = DEMO_RATES["avx2"]
    # worked out by hand: 10 teacher tasks each of 1 and 2 objectives; 3 steps of 2 tasks (the demo's) x G=8
    # (grpo_cpu), one validation (every 2 steps) of 16 two-objective tasks; 2 checkpoints x 5 two-objective
    # held-out tasks
    sft = r["startup"] + 30 * r["sft_objective"]
    rl = r["startup"] + 48 * r["rl_rollout"] + 32 * r["val_objective"]
    ev = 2 * r["startup"] + 20 * r["eval_objective"]
    torch.testing.assert_close(
        torch.tensor([got["sft"], got["rl"], got["eval"], got["total"]], dtype=torch.float64),
        torch.tensor([sft, rl, ev, sft + rl + ev], dtype=torch.float64),
    )


@pytest.mark.parametrize("sources", [["synthetic"], ["nq", "hotpotqa"]])
def test_the_demos_summary_adds_per_source_rows_only_with_several_sources(tmp_path: Path, monkeypatch, sources) -> None:
    """summary.json carries the evaluation's per-source rows when its tasks came from several data_sources; a
    single-source run (the main job) writes exactly the keys it wrote before. The three phases are stood in for by
    their results: what is checked is how the demo assembles its summary."""
    import json

    import mempo.stages.demo as demo_mod

    intervals = tmp_path / "intervals.md"
    intervals.write_text("| model | EM |\n")
    rows = [{"checkpoint": "rl", "em": 0.5}]
    by_source = [{"checkpoint": "rl", "source": s, "em": 0.5} for s in sources] if len(sources) > 1 else []
    ev = {"files": {"intervals": str(intervals)}, "rows": rows, **({"source_rows": by_source} if by_source else {})}
    done = {k: {"summary": {}, "status": "reused", "seconds": 0.0} for k in ("sft", "rl")}
    monkeypatch.setattr(demo_mod, "run_steps", lambda cfg, steps: {**done, "eval": {**done["rl"], "summary": ev}})
    demo_mod.demo(compose_config(f"run_dir={tmp_path / 'run'}", "model=tiny"))
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["eval"] == rows
    assert summary.get("eval_by_source") == (by_source or None)


def test_the_demo_says_what_its_table_shows_and_what_not(tmp_path: Path) -> None:
    from mempo.stages.demo import reading

    text = reading(compose_config(f"run_dir={tmp_path}", "trainer.max_steps=3", "eval.num_tasks=32"))
    assert "over its 32 tasks" in text and "3 RL steps at one RL seed" in text and "does not show" in text
    assert f"+exp=study study.warm_start={tmp_path / 'sft' / 'hf'}" in text
