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
(``mempo.stages.run_steps``).

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
from mempo.stages import Step, folders_arg, run_steps, stage
from mempo.stages.builders import run_path
from mempo.stages.config import DEMO_BUDGET_KEYS, exp_delta
from mempo.stages.rundir import run_record


def command_line_keys(cfg: DictConfig) -> set[str]:
    """The dotted keys set on the command line (``sweep.overrides``: Hydra's task overrides), ``+``/``~`` removed."""
    return {o.split("=", 1)[0].lstrip("+~") for o in cfg.sweep.overrides if "=" in o}


def rl_overrides(cfg: DictConfig) -> dict[str, Any]:
    """The keys the RL phase sets on top of the run's config: demo.rl_exp's recipe less the budget
    (``DEMO_BUDGET_KEYS``) and less any key the command line set (``memory.alpha=1`` runs MemPO on the recipe),
    then in-training validation every demo.val_every steps."""
    skip = set(DEMO_BUDGET_KEYS) | command_line_keys(cfg)
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
    return summary
