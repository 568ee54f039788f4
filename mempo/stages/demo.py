"""The ``demo`` stage, the embedded default end to end (``python experiments/run.py``): three steps, ``DEMO``.

    sft   supervised warm start on the synthetic oracle's trajectories
    rl    trainer.max_steps RL steps from the warm start: the run's config plus the recipe of demo.rl_exp
          (``rl_overrides``; by default exp/grpo_cpu.yaml, GRPO on the memory agent: the project's best CPU RL
          recipe, docs/results.md), validated every demo.val_every steps; config.yaml's MemPO defaults stay
          what the rl stage and every other experiment run
    eval  greedy evaluation of both on the same held-out tasks (eval.objectives x eval.num_tasks), 95% bootstrap
          intervals and the paired difference RL - warm start

A second run reuses the warm start and the RL policy it finished (and says so), evaluates them again (greedy: the
same table) and rewrites eval/; overwrite=true trains both again, resume=true continues RL from its checkpoint
(``mempo.stages.steps.run_steps``).

Outputs: ``<run_dir>/summary.md`` (the table), ``summary.json`` (phases, timings, each step's summary), and each
step's folder (``sft/``, ``rl/``, ``eval/``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from mempo.core.base import atomic_write_text, write_json
from mempo.core.console import say
from mempo.core.hardware import rate_kind
from mempo.stages.builders import run_path
from mempo.stages.config import DEMO_OWN_KEYS, exp_delta, require_eval_task_count
from mempo.stages.rundir import run_record
from mempo.stages.steps import (
    DEMO_RATES,
    Step,
    command_line_keys,
    folders_arg,
    kind_label,
    run_steps,
    stage,
    with_overrides,
)


def expected_seconds(cfg: DictConfig, kind: str) -> dict[str, float]:
    """The demo's phases' expected wall time on a 2-core CPU of ``kind`` (a key of ``DEMO_RATES``), scaled from the
    measured rates by the config's sizes: {"sft", "rl", "eval", "total"}."""
    r = DEMO_RATES[kind]
    rl = with_overrides(cfg, rl_overrides(cfg))
    sft_objectives = cfg.sft.num_tasks * sum(cfg.sft.objectives or [cfg.data.objectives])
    steps = rl.trainer.max_steps
    rollouts = steps * rl.data.batch_size * rl.data.group_size
    validations = steps // rl.eval.every_n_steps if rl.eval.every_n_steps else 0
    val_objectives = validations * rl.data.num_val_tasks * rl.data.objectives
    eval_objectives = 2 * cfg.eval.num_tasks * sum(cfg.eval.objectives)  # two checkpoints
    t = {
        "sft": r["startup"] + sft_objectives * r["sft_objective"],
        "rl": r["startup"] + rollouts * r["rl_rollout"] + val_objectives * r["val_objective"],
        "eval": 2 * r["startup"] + eval_objectives * r["eval_objective"],
    }
    return t | {"total": sum(t.values())}


def say_expected_time(cfg: DictConfig) -> None:
    """One console line at the start: how long this demo should take on this kind of CPU (2 cores; only for
    trainer.accelerator=cpu)."""
    if cfg.trainer.accelerator != "cpu":
        return
    kind = rate_kind()
    t = expected_seconds(cfg, kind)
    what = kind_label(kind, cfg)
    say(
        f"[mempo] demo: expected about {t['total'] / 60:.0f} min on a 2-core CPU like this one ({what}): warm start "
        f"~{t['sft'] / 60:.0f}, RL ~{t['rl'] / 60:.0f}, evaluation ~{t['eval'] / 60:.0f} min (more with fewer cores)"
    )


def rl_overrides(cfg: DictConfig) -> dict[str, Any]:
    """The keys the RL phase sets on top of the run's config: demo.rl_exp's recipe less the demo's own keys
    (``DEMO_OWN_KEYS``: the budget, a diagnostic) and less any key the command line set (``memory.alpha=1`` runs
    MemPO on the recipe), then in-training validation every demo.val_every steps."""
    skip = set(DEMO_OWN_KEYS) | command_line_keys(cfg)
    delta = {k: v for k, v in exp_delta(cfg.demo.rl_exp).items() if k not in skip}
    return {**delta, "eval.every_n_steps": cfg.demo.val_every}


def demo_steps(cfg: DictConfig) -> list[Step]:
    """``DEMO``: warm start, RL from it, evaluation of both."""
    out = run_path(cfg)
    sft_hf, rl_hf = out / "sft" / "hf", out / "rl" / "hf"
    n_list = list(cfg.eval.objectives)
    recipe = f"exp/{cfg.demo.rl_exp}.yaml's recipe" if cfg.demo.rl_exp else "the run's config"
    return [
        Step("sft", "sft", "supervised warm start on the synthetic oracle's trajectories", reuse=True),
        Step(
            "rl",
            "rl",
            f"{cfg.trainer.max_steps} RL steps from the warm start ({recipe})",
            {"model.name_or_path": sft_hf, **rl_overrides(cfg)},
            reuse=True,
        ),
        Step(
            "eval",
            "eval",
            f"greedy evaluation on {cfg.eval.num_tasks} held-out tasks per N = {n_list}",
            {"run_dir": out, "eval.checkpoints": folders_arg({"warm_start": sft_hf, "rl": rl_hf})},
        ),
    ]


@stage("demo")
def demo(cfg: DictConfig) -> dict[str, Any]:
    start = time.perf_counter()
    out = run_path(cfg)
    require_eval_task_count(cfg, "demo")
    say_expected_time(cfg)
    done = run_steps(cfg, demo_steps(cfg))
    phases = {f"{label}_s": d["seconds"] for label, d in done.items()}
    phases["total_s"] = time.perf_counter() - start
    ev = done["eval"]["summary"]
    table = Path(ev["files"]["intervals"]).read_text().rstrip("\n")  # the eval stage's interval table
    summary = {
        "stage": "demo",
        "phases": phases,
        "status": {label: d["status"] for label, d in done.items()},  # trained | reused
        "sft": done["sft"]["summary"],
        "rl": done["rl"]["summary"],
        "eval": ev["rows"],
        **({"eval_by_source": ev["source_rows"]} if ev.get("source_rows") else {}),  # tasks of several data_sources
        "eval_tasks": cfg.eval.num_tasks,
        "objectives": list(cfg.eval.objectives),
        **run_record(cfg),
    }
    write_json(out / "summary.json", summary)
    atomic_write_text(out / "summary.md", table + "\n")
    took = ", ".join(
        f"{what} reused" if done[label]["status"] == "reused" else f"{what} {phases[f'{label}_s']:.0f} s"
        for label, what in (("sft", "warm start"), ("rl", "RL"), ("eval", "eval"))
    )
    say(
        f"[mempo] done in {phases['total_s']:.0f} s ({took}); table: {out / 'summary.md'}; "
        f"curves: {summary['rl'].get('curves')}"
    )
    say(reading(cfg))
    return summary


def reading(cfg: DictConfig) -> str:
    """What the demo's table shows and what it does not, printed under it (the README says the same)."""
    n = "/".join(map(str, cfg.eval.objectives))
    return (
        f"[mempo] What the table shows: whether the warm start answers held-out {n}-question tasks, which it can "
        f"only do by searching, with 95% intervals over its {cfg.eval.num_tasks} tasks. What it does not show: "
        f"whether RL helps. The rl row is {cfg.trainer.max_steps} RL steps at one RL seed, a check that the loop "
        "runs; differences of a few hundredths of EM are within the spread between RL seeds (docs/results.md). "
        "For RL's effect, seeds as the unit: python experiments/run.py +exp=study "
        f"study.warm_start={run_path(cfg) / 'sft' / 'hf'} (docs/guide/studies.md)."
    )
