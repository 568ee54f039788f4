"""The ``headline`` stage: the paper's headline in miniature, MemPO vs GRPO vs a ReAct agent as N grows.

Five arms, evaluated greedily on the same held-out tasks for every N in ``eval.objectives`` (tasks of N objectives
get 2N + 1 + ``eval.turn_slack`` turns), each with its own agent:

    warm_start        SFT on the oracle's trajectories, rendered by the memory prompt builder      memory agent
    mempo             RL from warm_start with the run's config (MemPO)                             memory agent
    ablation_nomem    the same plus exp/ablation_nomem.yaml's delta (memory.alpha=0: GRPO)         memory agent
    react_warm_start  SFT on the same teacher trajectories, rendered by the full-history builder   full-history agent
    react_grpo        RL from react_warm_start plus exp/grpo_react.yaml's delta                    full-history agent

The RL arms differ from the run's config only by those deltas (and their warm start): the same trainer.max_steps,
data sizes, seed and optimizer, so the same budget. A warm start or arm whose ``<run_dir>/<label>/hf/config.json``
exists is reused, not retrained (overwrite=true retrains it, resume=true continues an RL arm from its checkpoint);
``headline.warm_start`` / ``headline.react_warm_start`` name warm starts elsewhere.

Outputs: ``<run_dir>/eval/`` table.csv, table.md, f1_vs_n.png, pt_vs_n.png, tt_vs_n.png (``mempo.eval.headline``);
``<run_dir>/eval/grid/`` the evaluation's full report (results.jsonl, paired intervals, failure tallies);
``<run_dir>/summary.json`` the rows, the token ratios at the largest N, what was trained or reused, and timings.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from mempo.core.base import write_json
from mempo.core.console import say
from mempo.eval.headline import write_headline
from mempo.eval.report import read_records
from mempo.stages.builders import run_path
from mempo.stages.config import exp_delta, require_eval_task_count
from mempo.stages.evaluate import run_eval
from mempo.stages.rundir import run_record
from mempo.stages.steps import Step, folders_arg, run_steps, stage, with_overrides

WARM_STARTS = {"warm_start": "memory", "react_warm_start": "full_history"}  # label -> agent.context of its SFT data
RL_ARMS = {  # arm -> (its warm start, the experiment file whose delta it applies; None = the run's config as is)
    "mempo": ("warm_start", None),
    "ablation_nomem": ("warm_start", "ablation_nomem"),
    "react_grpo": ("react_warm_start", "grpo_react"),
}
ARMS = ("warm_start", "mempo", "ablation_nomem", "react_warm_start", "react_grpo")  # rows and lines in this order


def arm_agent(arm: str) -> str:
    """The agent (context mode) an arm is trained and evaluated with: its warm start's."""
    return WARM_STARTS[arm] if arm in WARM_STARTS else WARM_STARTS[RL_ARMS[arm][0]]


def arm_overrides(arm: str) -> dict[str, Any]:
    """The keys an RL arm sets on top of the run's config."""
    delta = exp_delta(RL_ARMS[arm][1])
    if delta.get("agent.context", arm_agent(arm)) != arm_agent(arm):
        raise ValueError(f"{arm}: its experiment sets agent.context={delta['agent.context']}, its warm start another")
    return {"agent.context": arm_agent(arm), **delta}


def headline_steps(cfg: DictConfig) -> list[Step]:
    """The two warm starts, then the three RL arms from them; each reused when its policy exists."""
    steps = []
    for label, context in WARM_STARTS.items():
        if cfg.headline[label]:  # headline.<label>: a given folder, never trained here
            continue
        title = f"warm start on the oracle's trajectories rendered with the {context} prompts"
        overrides = {"name": f"{cfg.name}-{label}", "agent.context": context}
        steps.append(Step(label, "sft", title, overrides, reuse=True))
    for arm, (warm, _) in RL_ARMS.items():
        delta = arm_overrides(arm)
        overrides = {"name": f"{cfg.name}-{arm}", "model.name_or_path": policy_folder(cfg, warm), **delta}
        steps.append(Step(arm, "rl", f"{cfg.trainer.max_steps} RL steps from {warm} with {delta}", overrides, True))
    return steps


def policy_folder(cfg: DictConfig, arm: str) -> Path:
    """An arm's HF folder: ``headline.<warm start>`` when given, else ``<run_dir>/<arm>/hf``."""
    given = cfg.headline[arm] if arm in WARM_STARTS else None
    return Path(given) if given else run_path(cfg, arm, "hf")


@stage("headline")
def headline(cfg: DictConfig) -> dict[str, Any]:
    """Warm starts and RL arms (each trained unless its policy exists), then the evaluation, table and figures."""
    start = time.perf_counter()
    out = run_path(cfg)
    require_eval_task_count(cfg, "headline")
    done = run_steps(cfg, headline_steps(cfg))
    folders = {a: policy_folder(cfg, a) for a in ARMS}
    status = {a: done[a]["status"] if a in done else "given" for a in ARMS}
    phases = {f"{label}_s": d["seconds"] for label, d in done.items()}

    t = time.perf_counter()
    n_list = list(cfg.eval.objectives)
    say(f"[mempo] evaluation: {len(ARMS)} arms on the same {cfg.eval.num_tasks} held-out tasks per N = {n_list}")
    ev = run_eval(
        with_overrides(cfg, {"eval.checkpoints": folders_arg(folders)}),
        agents={a: [arm_agent(a)] for a in ARMS},
        out=out / "eval" / "grid",
    )
    records = read_records(Path(ev["files"]["results"]))
    files, rows, ratios = write_headline(out / "eval", records, num_tasks=cfg.eval.num_tasks)
    phases["eval_s"] = time.perf_counter() - t
    phases["total_s"] = time.perf_counter() - start
    summary = {
        "stage": "headline",
        "arms": {a: {"agent": arm_agent(a), "folder": str(folders[a]), "status": status[a]} for a in ARMS},
        "rl_overrides": {a: arm_overrides(a) for a in RL_ARMS},
        "objectives": n_list,
        "eval_tasks": cfg.eval.num_tasks,
        "rows": rows,
        "ratios": ratios,
        "phases": phases,
        "files": {k: str(v) for k, v in files.items()} | {"grid": ev["out"]},
        **run_record(cfg),
    }
    write_json(out / "summary.json", summary)
    say("\n" + files["table_md"].read_text())
    say(f"[mempo] done in {phases['total_s']:.0f} s; table and figures in {out / 'eval'}")
    return summary
