"""The ``demo`` stage, the embedded default end to end (``python experiments/run.py``): three steps, ``DEMO``.

    sft   supervised warm start on the synthetic oracle's trajectories
    rl    trainer.max_steps MemPO steps from the warm start
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
from mempo.stages.rundir import run_record


def demo_steps(cfg: DictConfig) -> list[Step]:
    """``DEMO``: warm start, RL from it, evaluation of both."""
    out = run_path(cfg)
    sft_hf, rl_hf = out / "sft" / "hf", out / "rl" / "hf"
    n_list = list(cfg.eval.objectives)
    return [
        Step("sft", "sft", "supervised warm start on the synthetic oracle's trajectories", reuse=True),
        Step("rl", "rl", f"{cfg.trainer.max_steps} RL steps from the warm start", {"model.name_or_path": sft_hf}, True),
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
