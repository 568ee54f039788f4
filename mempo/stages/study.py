"""The ``study`` stage (``python experiments/run.py +exp=study``): an ablation study in one command, with RL seeds
as the unit of evidence (``mempo.eval.seeds``; why: docs/results.md, "Pre-registered studies").

    warm start   study.warm_start, or trained here when null (the sft stage in <run_dir>/warm_start, reused when it
                 finished), as the demo's and the headline's
    arms x seeds each arm (study.arms: a config delta on top of study.recipe) at each seed of study.seeds, for
                 trainer.max_steps RL steps from the warm start without in-training validation: each its own
                 ``experiments/run.py`` process in <run_dir>/<arm>/seed<k> (a finished run is reused when its saved
                 study_run.yaml is the config it would train now, else refused naming the keys; a killed one
                 continued with resume=true from its checkpoint)
    evaluation   the warm start and every final checkpoint in one evaluation on the same held-out tasks
                 (eval.num_tasks x eval.objectives; exp/study.yaml: 128 two-question tasks, a float32 engine)
                 (reused when a study is run again with the same config and checkpoints: eval/study_eval.json;
                 one checkpoint at a time, so a study killed in its evaluation keeps the checkpoints it finished)
    memory scores every memory the evaluation's memory agents wrote, scored by P(gold | question, memory) under the
                 warm start, one fixed scorer for every arm (study.memory_scores; ``mempo.eval.memory_scores``)
    report       per arm its seeds' EM and F1; per comparison (every arm against study.reference and each arm of
                 study.also_reference, every arm against the warm start) the per-seed paired differences, the
                 seed-plus-task t-interval the verdict reads
                 (every seed on the same tasks: both variance sources, Satterthwaite df; ``mempo.eval.stats``), the
                 crossed bootstrap beside it and the verdict; the same for the memory scores; per arm its turns per
                 task and failure verdicts

K (study.seeds) and the steps are the config's, fixed before the study runs. Outputs: <run_dir>/study.md (the
tables), study.json (``mempo.eval.seeds.seed_study`` plus the design, the memory scores and timings), per_task.csv
(arm, seed, N, task, EM, F1, memory score: every comparison recomputes from it, ``python -m mempo.eval.report
--per-task``; commit it with study.md and study.json under docs/studies/<name>/), summary.json,
memory_scores.csv/.png, eval/ (the evaluation's full report), and each arm-seed's run folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from mempo.core.base import atomic_write_text, write_csv, write_json
from mempo.core.console import say
from mempo.core.hardware import rate_kind
from mempo.eval.compare import GridResult
from mempo.eval.horizon import horizon_markdown, horizon_rows, plot_horizon, token_ratios_by_n
from mempo.eval.memory_scores import (
    MEMORY_SCORES_COLUMNS,
    MemoryItem,
    memory_items,
    plot_scores,
    score_markdown,
    score_study,
    task_means,
)
from mempo.eval.report import read_records, write_report
from mempo.eval.seeds import (
    PER_TASK_COLUMNS,
    per_task_rows,
    seed_study,
    study_markdown,
    turns_and_failures,
    turns_and_failures_markdown,
)
from mempo.lm.loading import load_policy
from mempo.lm.lora import base_fingerprint
from mempo.lm.scoring import memory_answer_probabilities
from mempo.losses import scores_memories
from mempo.stages.builders import build_builder, build_optim_config, group, run_path
from mempo.stages.config import CONFIG_DIR, exp_delta, require_eval_task_count, resolve_precision
from mempo.stages.evaluate import run_eval
from mempo.stages.ledger import EVAL_FILE, RUN_CONFIG, entry_result, merged, read_entry, write_entry
from mempo.stages.reuse import check_reuse, flatten
from mempo.stages.rundir import finished, held_outputs, run_record
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

RUN_PY = CONFIG_DIR.parent / "run.py"  # the experiments/run.py of the code that is running (not an installed copy)
REPO_ROOT = CONFIG_DIR.parents[1]
# Keys the study keeps from the run's config whatever its recipe sets: the budget, and no in-training validation
# (a study compares the final checkpoints in one evaluation; validation would only cost time).
STUDY_OWN_KEYS = ("trainer.max_steps", "eval.every_n_steps")
# Seconds per objective of the study's float32 evaluation engine per checkpoint of the memory agent (DEMO_RATES'
# eval_objective is the demo's bf16 engine): the MemPO study evaluated 3 checkpoints x 256 two-question tasks in 7.1
# min a checkpoint on a 2-core AMX Xeon, alone, (426 - 25) / 512 = 0.78 s an objective (docs/results.md); the horizon
# study's world 1 evaluated its memory warm start on 128 tasks at each of N = 2, 4, 6 in 1,511 s on a 2-core
# AVX512-BF16 EPYC, (1511 - 25) / 1536 = 0.97 s. AVX2's is DEMO_RATES' own (float32 there too).
FLOAT32_EVAL_S = {"amx": 0.78, "avx512_bf16": 0.97, "avx2": DEMO_RATES["avx2"]["eval_objective"]}
# A full-history (ReAct) checkpoint's evaluation against the memory agent's, an objective: its prompt holds every
# earlier turn. The same world-1 evaluation of the ReAct warm start took 3,839 s, (3839 - 25) / 1536 = 2.48 s an
# objective, 2.6x (EPYC, N = 2, 4, 6 in equal numbers; the ratio grows with N, and is not measured on the other kinds).
FULL_HISTORY_EVAL_FACTOR = 2.6
# A full-history (ReAct) arm's RL step against the memory agent's GRPO ablation at the same recipe: its update holds
# every earlier turn (a median of 42k update tokens a step against 27k). World 1 of the horizon study on the EPYC:
# ReAct seed 3's median step 124.5 s (steps 8-40, those after its last resume's compile, alone) against the ablation
# seed 3's 70.1 s, 1.78x (update 93 s against 43, generation 31 against 26). Not measured on the other kinds.
FULL_HISTORY_RL_FACTOR = 1.78
# The ratio of RL time per rollout between AVX2 and AVX512-BF16 measured for training (DEMO_RATES' earlier rates,
# 13.0 / 4.9): the study's rates below were measured with native bf16 only and are scaled by it on AVX2.
AVX2_SCALE = 13.0 / 4.9
# Seconds per rollout of an arm-seed run on exp/grpo_cpu's recipe (4 tasks x G=8, top 8 layers), startup included:
# S1's six 4-step runs took 242-385 s each, 307 s on average, on a 2-core AMX Xeon (docs/results.md); on a 2-core
# AVX512-BF16 EPYC the recipe at commit 5cf6635 ran 1,235 rollouts an hour steady (2.9 s each; docs/performance.md).
STUDY_RL_ROLLOUT_S = {"amx": 2.2, "avx512_bf16": 2.9, "avx2": 2.2 * AVX2_SCALE}
# The same recipe on the fast path (exp/grpo_cpu_fast: a bf16 engine, compiled engine and update) where the CPU has
# native bf16: the 40-step curve of docs/results.md took 1859 s for 1280 rollouts on a 2-core AMX Xeon, validation
# every 10 steps and both compilations included; a 40-step grpo_cpu_40 run took about 50 min on a 2-core AVX512-BF16
# EPYC (2.35 s a rollout). On AVX2 the fast path's switches resolve off: STUDY_RL_ROLLOUT_S.
FAST_PATH_ROLLOUT_S = {"amx": 1.45, "avx512_bf16": 2.35}
# The fast path's two update switches (optim.shared_prefix, and with it optim.head_grad_in_forward; auto in
# exp/grpo_cpu_fast since 2026-12-07) divide its rate by these on the kinds where they were measured: the shared
# prefix's learning check on the Zen 4 EPYC, steps 2-10 at two seeds, 1,429 s without them, 1,366 s with the shared
# prefix (1.05x), 1,151 s with both (1.24x; docs/performance.md). Not measured on AMX, where the rates stand.
FAST_PATH_SWITCHES_SPEEDUP = {"avx512_bf16": {"shared_prefix": 1.05, "both": 1.24}}
# A run that scores its memories (mempo.losses.scores_memories) against the same recipe without, per CPU kind. In the
# MemPO study (grpo_cpu_40, 40 steps, 2-core AMX Xeon; docs/results.md): the three MemPO seeds' step times 2.23x, 2.32x
# and 1.56x their ablation seeds', mean 2.0. Seed 5, the one that ran alone throughout, is the 1.56x: the scoring
# forward (10-12 s a step) and every row updated (A^M is nonzero where A^T is 0); seeds 3-4 also generated at 0.6-0.7x
# the ablation's rate, not explained. On the 2-core AVX512-BF16 EPYC, the horizon study's world 1 (both runs alone,
# 128-token turns): MemPO seed 3's 40 steps took 4,447 s against the ablation seed 5's 2,876 s, 1.55x (medians a step:
# scoring 20.9 s, the update 57.5 s for 35k tokens against 42.9 s for 26k). AVX2 takes the AMX Xeon's (not measured).
MEMORY_SCORING_FACTOR = {"amx": 2.0, "avx512_bf16": 1.55, "avx2": 2.0}
# Seconds per memory scored by the fixed scorer (SmolLM2-135M warm start, bf16 autocast, micro-batches of 8) and the
# memories per task per objective an evaluation leaves: S1 scored 3727 memories of 7 x 128 two-question tasks in 177 s
# on a 2-core AMX Xeon (0.047 s each, the scorer's loading included; 2.08 a task-objective); the AVX512-BF16 kind
# takes the same rate (not measured there)
SCORE_S_PER_MEMORY = {"amx": 0.05, "avx512_bf16": 0.05, "avx2": 0.05 * AVX2_SCALE}
MEMORIES_PER_OBJECTIVE = 2.0


def arm_delta(cfg: DictConfig, arm: str) -> dict[str, Any]:
    """The keys an arm sets on top of the run's config: study.recipe's (less ``STUDY_OWN_KEYS`` and any key the
    command line set), then the arm's own delta (which wins over both)."""
    skip = set(STUDY_OWN_KEYS) | command_line_keys(cfg)
    recipe = {k: v for k, v in exp_delta(cfg.study.recipe).items() if k not in skip}
    own = flatten(OmegaConf.to_container(cfg.study.arms)[arm])
    return {**recipe, **own}


def run_arms(cfg: DictConfig) -> list[str]:
    """The arms that run (study.arms less those set to null), in config order."""
    return group(cfg, "study").run_arms


# The warm start of each agent an arm can be (agent.context), by label: the memory agent's is the study's warm start;
# an arm whose delta sets agent.context=full_history (a ReAct agent) starts from one trained on the same teacher
# trajectories rendered with the full-history prompts, as the headline's react arm does.
WARM_LABELS = {"memory": "warm_start", "full_history": "react_warm_start"}


def arm_agent(cfg: DictConfig, arm: str) -> str:
    """The agent an arm trains and is evaluated as: its delta's agent.context, else the run's."""
    return str(arm_delta(cfg, arm).get("agent.context", cfg.agent.context))


def warm_agents(cfg: DictConfig) -> list[str]:
    """The agents whose warm start the study needs: the memory agent's always (the fixed memory scorer, the
    reference of "arm - warm start"), then any other agent an arm runs as."""
    return list(dict.fromkeys(["memory", *(arm_agent(cfg, a) for a in run_arms(cfg))]))


def warm_start_folder(cfg: DictConfig, agent: str = "memory") -> Path:
    """study.warm_start (the memory agent's) or study.react_warm_start (the full-history agent's), else
    <run_dir>/<its label>/hf."""
    label = WARM_LABELS[agent]
    given = cfg.study[label]
    return Path(given) if given else run_path(cfg, label, "hf")


def label_agents(cfg: DictConfig, runs: dict[tuple[str, int], DictConfig]) -> dict[str, str]:
    """Checkpoint label -> the agent it is evaluated as: each warm start's own, each arm-seed its arm's."""
    warm = {WARM_LABELS[a]: a for a in warm_agents(cfg)}
    return warm | {f"{a}_s{s}": arm_agent(cfg, a) for a, s in runs}


def study_checkpoints(cfg: DictConfig, runs: dict[tuple[str, int], DictConfig]) -> dict[str, Path]:
    """The study's checkpoints, label -> HF folder: the warm starts, then each arm-seed's final policy."""
    warm = {WARM_LABELS[a]: warm_start_folder(cfg, a) for a in warm_agents(cfg)}
    return warm | {f"{a}_s{s}": Path(c.run_dir) / "hf" for (a, s), c in runs.items()}


def arm_seed_configs(cfg: DictConfig) -> dict[tuple[str, int], DictConfig]:
    """(arm, seed) -> the validated config of that RL run, in arm-major order. Built before anything runs, so a
    bad key in an arm's delta fails here, naming it."""
    out = {}
    for arm in run_arms(cfg):
        delta = arm_delta(cfg, arm)
        for seed in cfg.study.seeds:
            keys = {
                "stage": "rl",
                "name": f"{cfg.name}-{arm}-s{seed}",
                "seed": seed,
                "run_dir": str(run_path(cfg, arm, f"seed{seed}")),
                "model.name_or_path": str(warm_start_folder(cfg, arm_agent(cfg, arm))),
                "eval.every_n_steps": 0,
                **delta,
            }
            try:
                out[(arm, seed)] = with_overrides(cfg, keys)
            except Exception as e:
                raise ValueError(f"config key study.arms.{arm}: its run's config is invalid: {e}") from e
    return out


def rl_rollout_s(c: DictConfig, kind: str) -> float:
    """Seconds per rollout of one arm-seed run of config ``c`` on a 2-core CPU of ``kind``: the grpo_cpu family's
    measured rate where only the top layers train (``STUDY_RL_ROLLOUT_S``; ``FAST_PATH_ROLLOUT_S`` when its engine runs
    in bf16, ``sampler.dtype=auto`` on a CPU with native bf16, divided by ``FAST_PATH_SWITCHES_SPEEDUP`` where its
    update switches resolve on), else the demo recipe's (``DEMO_RATES``); times
    ``MEMORY_SCORING_FACTOR[kind]`` for a top-layers run that scores its memories (``mempo.losses.scores_memories``; the
    rates above are ablations'), and times ``FULL_HISTORY_RL_FACTOR`` for a full-history agent."""
    history = FULL_HISTORY_RL_FACTOR if c.agent.context == "full_history" else 1.0
    if not c.model.train_top_layers:
        return DEMO_RATES[kind]["rl_rollout"] * history
    scoring = MEMORY_SCORING_FACTOR[kind] if scores_memories(group(c, "memory"), group(c, "advantage")) else 1.0
    if kind in FAST_PATH_ROLLOUT_S and c.sampler.get("dtype") in ("auto", "bfloat16"):
        optim, speedups = build_optim_config(c), FAST_PATH_SWITCHES_SPEEDUP.get(kind, {})
        switches = "both" if optim.head_grad_in_forward else "shared_prefix"
        speedup = speedups.get(switches, 1.0) if optim.shared_prefix else 1.0
        return FAST_PATH_ROLLOUT_S[kind] * scoring * history / speedup
    return STUDY_RL_ROLLOUT_S[kind] * scoring * history


def expected_seconds(cfg: DictConfig, runs: dict[tuple[str, int], DictConfig], kind: str) -> dict[str, float]:
    """The study's expected wall time on a 2-core CPU of ``kind`` (``DEMO_RATES``), for what is not done yet (nor
    held in study.ledger): {"warm_start", "runs" (every arm-seed still to train), "per_run" (the first arm's),
    "eval", "memory_scores", "total"}."""
    r = DEMO_RATES[kind]
    ws = 0.0  # each warm start to train (a ReAct arm's full-history one at the memory one's rate: not measured)
    teacher_objectives = cfg.sft.num_tasks * sum(cfg.sft.objectives or [cfg.data.objectives])
    for label in (WARM_LABELS[a] for a in warm_agents(cfg)):
        if not cfg.study[label] and not finished(run_path(cfg, label)):
            ws += r["startup"] + teacher_objectives * r["sft_objective"]

    def one(c: DictConfig) -> float:
        return r["startup"] + c.trainer.max_steps * c.data.batch_size * c.data.group_size * rl_rollout_s(c, kind)

    ledger = Path(cfg.study.ledger) if cfg.study.ledger and not cfg.overwrite else None
    held = {f"{a}_s{s}" for a, s in runs if ledger is not None and (ledger / f"{a}_s{s}" / EVAL_FILE).is_file()}
    todo = [one(c) for (a, s), c in runs.items() if not finished(Path(c.run_dir)) and f"{a}_s{s}" not in held]
    per_objective = FLOAT32_EVAL_S[kind] if cfg.eval.engine_dtype == "float32" else r["eval_objective"]
    folders = study_checkpoints(cfg, runs)
    held |= {label for label in folders if ledger is not None and (ledger / label / EVAL_FILE).is_file()}
    ready = {label: f for label, f in folders.items() if (f / "config.json").is_file() and label not in held}
    kept = held | (comparable_checkpoints(cfg, ready, run_path(cfg) / "eval") if ready else set())
    agents = label_agents(cfg, runs)

    def evaluation(label: str) -> float:
        factor = FULL_HISTORY_EVAL_FACTOR if agents[label] == "full_history" else 1.0
        return r["startup"] + cfg.eval.num_tasks * sum(cfg.eval.objectives) * per_objective * factor

    ev = sum(evaluation(label) for label in folders if label not in kept)
    scores = 0.0
    if cfg.study.memory_scores:  # every checkpoint's memories, scored again on every run of the study
        memories = len(folders) * cfg.eval.num_tasks * sum(cfg.eval.objectives) * MEMORIES_PER_OBJECTIVE
        scores = r["startup"] + memories * SCORE_S_PER_MEMORY[kind]
    t = {"warm_start": ws, "runs": sum(todo), "eval": ev, "memory_scores": scores}
    total = ws + sum(todo) + ev + scores
    per_run = one(next(iter(runs.values())))
    out = {"per_run": per_run, "to_train": len(todo), "kept": len(kept), "checkpoints": len(folders), "total": total}
    return t | out


def say_expected_time(cfg: DictConfig, runs: dict[tuple[str, int], DictConfig]) -> None:
    """One console line at the start: how long this study should take on this kind of CPU (CPU runs only)."""
    if cfg.trainer.accelerator != "cpu":
        return
    kind = rate_kind()
    t = expected_seconds(cfg, runs, kind)
    what = kind_label(kind, cfg)
    k, arms = len(cfg.study.seeds), len(run_arms(cfg))
    kept = f" ({t['kept']} kept from an earlier evaluation or the ledger)" if t["kept"] else ""
    say(
        f"[mempo] study: {arms} arms x {k} seeds x {cfg.trainer.max_steps} RL steps; expected about "
        f"{t['total'] / 60:.0f} min on a 2-core CPU like this one ({what}): warm start ~{t['warm_start'] / 60:.0f}, "
        f"{t['to_train']} RL runs to train ~{t['runs'] / 60:.0f} (~{t['per_run'] / 60:.0f} each), evaluation of "
        f"{t['checkpoints'] - t['kept']} checkpoints ~{t['eval'] / 60:.0f}{kept}, memory scores "
        f"~{t['memory_scores'] / 60:.0f} min (more with fewer cores)"
    )


def write_run_config(sub: DictConfig) -> Path:
    """<run_dir>/study_run.yaml: an arm-seed's full config (less ``sweep``: run.py records its own), what its process
    runs and what a later study compares before reusing or continuing the run (``check_reuse``)."""
    folder = Path(sub.run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    plain = {k: v for k, v in OmegaConf.to_container(sub).items() if k != "sweep"}
    atomic_write_text(folder / RUN_CONFIG, OmegaConf.to_yaml(plain))
    return folder / RUN_CONFIG


def launch(sub: DictConfig) -> None:
    """Run one arm-seed as its own ``experiments/run.py`` process in ``sub.run_dir``: its full config written to
    <run_dir>/study_run.yaml (``write_run_config``) and given to Hydra as the primary config, so it runs exactly this
    config, with this code (PYTHONPATH: the running code's repository first). Raises naming the folder when it fails."""
    folder = write_run_config(sub).parent
    cmd = [sys.executable, str(RUN_PY), f"--config-dir={folder.resolve()}", "--config-name=study_run",
           f"hydra.run.dir={folder}"]  # fmt: skip
    paths = [str(REPO_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    rc = subprocess.run(cmd, env={**os.environ, "PYTHONPATH": os.pathsep.join(paths)}, check=False).returncode
    if rc != 0:
        raise RuntimeError(
            f"study: the RL run in {folder} exited with {rc} (its log: {folder / 'run.log'}); run the same command "
            "again to continue it from its checkpoint (finished runs are reused)"
        )


def run_arm_seed(cfg: DictConfig, sub: DictConfig, label: str) -> str:
    """Train one arm-seed unless it finished -> "reused" | "trained" | "resumed". A finished run is reused, and a
    killed one continued from its checkpoint (resume=true), only when its saved config (study_run.yaml) and the warm
    start it started from are the ones it would train with now (``mempo.stages.reuse.check_reuse``); otherwise a
    ``ReuseError`` naming what differs. A folder with outputs but no checkpoint is started again (overwrite=true)."""
    folder = Path(sub.run_dir)
    names = (RUN_CONFIG, "config.yaml")
    if finished(folder) and not cfg.overwrite:
        notes = check_reuse(label, folder, sub, stage="rl", names=names)
        also = f"; {'; '.join(notes)}" if notes else ""
        say(f"[mempo] {label}: reusing {folder}, finished earlier with the same config{also} (overwrite=true trains "
            "it again)")  # fmt: skip
        return "reused"
    held = held_outputs(folder)
    ckpt = folder / "checkpoints" / "last.ckpt"
    if cfg.overwrite:
        mode, how = {"overwrite": True, "resume": False}, "trained again (overwrite=true)"
    elif ckpt.exists() or ckpt.is_symlink():
        notes = check_reuse(label, folder, sub, stage="rl", resume=True, names=names)
        also = f"; {'; '.join(notes)}" if notes else ""
        mode, how = {"resume": True, "overwrite": False}, f"continued from {ckpt} (resume=true){also}"
    elif held:
        mode, how = {"overwrite": True, "resume": False}, f"started again: {', '.join(held)} but no checkpoint"
    else:
        mode, how = {"resume": False, "overwrite": False}, "new"
    say(f"[mempo] {label}: {sub.trainer.max_steps} RL steps in {folder}, {how}")
    launch(with_overrides(sub, mode))
    if not finished(folder):
        raise RuntimeError(f"study: the RL run in {folder} ended without exporting its policy (hf/config.json)")
    return "trained" if mode["resume"] is False else "resumed"


def score_memories(cfg: DictConfig, items: list[MemoryItem]) -> tuple[list[float], str]:
    """P(gold | question, memory) of each item under the warm start (the fixed scorer), with memory.scoring and
    memory.scoring_context as RL scores them, under bf16 autocast where training runs in bf16 (as the evaluation's own
    memory scores) -> (the probabilities, the dtype they were computed in)."""
    if not items:
        return [], "none"
    policy, tokenizer = load_policy(warm_start_folder(cfg), dtype=cfg.model.dtype,
                                    trust_remote_code=cfg.model.trust_remote_code)  # fmt: skip
    bf16 = resolve_precision(cfg.trainer.precision, cfg.trainer.accelerator).startswith("bf16")
    with torch.autocast(next(policy.parameters()).device.type, dtype=torch.bfloat16, enabled=bf16):
        p = memory_answer_probabilities(
            policy,
            build_builder(cfg, tokenizer),
            [(it.question, it.memory, it.gold) for it in items],
            pad_id=tokenizer.pad_token_id,  # load_tokenizer sets one (eos when the model has none)
            micro_batch_size=cfg.optim.micro_batch_size,
            scoring=cfg.memory.scoring,
            scoring_context=cfg.memory.scoring_context,
        )
    return [float(v) for v in p.tolist()], ("bf16 autocast" if bf16 else cfg.model.dtype)


def eval_key(cfg: DictConfig, folders: dict[str, Path]) -> dict[str, Any]:
    """What the study's evaluation depends on: its config (less the run-mode keys) and each checkpoint's folder with
    the time its weights were exported and their fingerprint (``base_fingerprint``): a run trained again, or weights
    replaced in place, are evaluated again."""
    plain = {k: v for k, v in OmegaConf.to_container(cfg, resolve=True).items()
             if k not in ("resume", "overwrite", "verbose", "sweep")}  # fmt: skip
    exported = {label: os.path.getmtime(Path(f) / "config.json") for label, f in folders.items()}
    weights = {label: base_fingerprint(f) for label, f in folders.items()}
    checkpoints = {label: str(f) for label, f in folders.items()}
    return {"config": plain, "checkpoints": checkpoints, "exported": exported, "weights": weights}


def comparable_checkpoints(cfg: DictConfig, folders: dict[str, Path], out: Path) -> set[str]:
    """The labels of ``folders`` an earlier evaluation in ``out`` (its study_eval.json) holds results for, when it
    ran under this config but for the study's own group and eval.checkpoints (an arm or seeds added or dropped since)
    and with the same folder and export time for that label; empty when nothing is comparable (memories scored by the
    evaluation itself, eval.score_memories, are not kept)."""
    record = out / "study_eval.json"
    if not record.is_file() or cfg.eval.score_memories:
        return set()
    held = json.loads(record.read_text())
    key = json.loads(json.dumps(eval_key(cfg, folders)))

    def comparable(config: dict[str, Any]) -> dict[str, Any]:
        return {k: ({**v, "checkpoints": None} if k == "eval" else v) for k, v in config.items() if k != "study"}

    if not Path(held["result"]["files"]["results"]).is_file():
        return set()
    if comparable(held["key"]["config"]) != comparable(key["config"]):
        return set()
    return {
        label
        for label in folders
        if held["key"]["checkpoints"].get(label) == key["checkpoints"][label]
        and held["key"]["exported"].get(label) == key["exported"][label]
        and held["key"].get("weights", {}).get(label) == key["weights"][label]
    } & {r["checkpoint"] for r in held["result"]["rows"]}


def earlier_results(cfg: DictConfig, folders: dict[str, Path], out: Path) -> GridResult | None:
    """The results an earlier evaluation in ``out`` holds for the ``comparable_checkpoints`` of ``folders`` (from its
    study_eval.json and results.jsonl) -> a ``GridResult``, or None when there are none."""
    same = comparable_checkpoints(cfg, folders, out)
    if not same:
        return None
    ev = json.loads((out / "study_eval.json").read_text())["result"]
    records = read_records(Path(ev["files"]["results"]))
    return GridResult(ev["rows"], records, [], ev.get("failures", []), ev.get("source_rows", [])).only(same)


def evaluate_once(
    cfg: DictConfig, folders: dict[str, Path], out: Path, agents: dict[str, str] | None = None
) -> tuple[dict[str, Any], str]:
    """The study's one evaluation (``run_eval`` into ``out``), or the earlier one when ``out/study_eval.json`` says
    it ran with the same ``eval_key`` (a study run again after an interruption past its RL runs); when it ran under
    the same config for some of these checkpoints (``earlier_results``: an arm added to a finished study), only the
    others are evaluated -> (its result, "reused" | "evaluated" | "evaluated; kept <labels>")."""
    key, record = eval_key(cfg, folders), out / "study_eval.json"
    done = None
    if record.is_file() and not cfg.overwrite:
        held = json.loads(record.read_text())
        if held.get("key") == json.loads(json.dumps(key)) and Path(held["result"]["files"]["results"]).is_file():
            say(f"[mempo] study: reusing the evaluation in {out} (same config and checkpoints; overwrite=true redoes "
                "it)")  # fmt: skip
            return held["result"], "reused"
        done = earlier_results(cfg, folders, out)
    per_label = {label: [agent] for label, agent in (agents or {}).items()}  # each checkpoint as its own agent
    ev = run_eval(with_overrides(cfg, {"eval.checkpoints": folders_arg(folders)}), out=out, done=done,
                  agents=per_label or None)  # fmt: skip
    write_json(record, {"key": key, "result": ev})
    if done is None:
        return ev, "evaluated"
    kept = [label for label in folders if any(r["checkpoint"] == label for r in done.rows)]
    return ev, "evaluated; kept " + ", ".join(kept)


def evaluate_in_turn(
    cfg: DictConfig, folders: dict[str, Path], out: Path, agents: dict[str, str] | None = None
) -> tuple[dict[str, Any], str]:
    """The study's evaluation one checkpoint at a time: ``evaluate_once`` on the checkpoints an earlier evaluation in
    ``out`` holds (``comparable_checkpoints``) plus the next one, then plus the one after, each call keeping those
    before it (``earlier_results``) and writing study_eval.json. A study killed during its evaluation (hours at
    several N) keeps every checkpoint it finished; the same command goes on from the next. The whole evaluation is
    reused as before when its record matches; overwrite=true evaluates every checkpoint again, the first call
    keeping nothing; with eval.score_memories (results that are not kept) it is one call for every checkpoint
    -> (the last result, "reused" | "evaluated" | "evaluated; kept <labels>")."""
    record = out / "study_eval.json"
    if cfg.eval.score_memories:
        return evaluate_once(cfg, folders, out, agents)
    if record.is_file() and not cfg.overwrite:
        held = json.loads(record.read_text())
        if held.get("key") == json.loads(json.dumps(eval_key(cfg, folders))):
            return evaluate_once(cfg, folders, out, agents)  # the whole evaluation, reused
    kept = set() if cfg.overwrite else comparable_checkpoints(cfg, folders, out)
    order = [label for label in folders if label in kept] + [label for label in folders if label not in kept]
    todo = [label for label in order if label not in kept] or order[-1:]  # none: one call, to write the record
    c, ev = cfg, {}
    for label in todo:
        part = order[: order.index(label) + 1]
        own = {k: a for k, a in (agents or {}).items() if k in part}
        ev, _ = evaluate_once(c, {k: folders[k] for k in part}, out, own)
        c = with_overrides(cfg, {"overwrite": False})  # overwrite=true: the first call only
    status = "evaluated; kept " + ", ".join(sorted(kept, key=order.index)) if kept else "evaluated"
    return ev, status


def grid_of(ev: dict[str, Any], labels: list[str]) -> GridResult:
    """An evaluation's result (``run_eval``'s dict) as a ``GridResult`` of ``labels`` only, its records read from
    its results.jsonl."""
    records = read_records(Path(ev["files"]["results"]))
    return GridResult(ev["rows"], records, [], ev.get("failures", []), ev.get("source_rows", [])).only(labels)


def warm_starts_in_ledger(cfg: DictConfig, folders: dict[str, Path]) -> dict[str, GridResult]:
    """The warm starts' evaluations study.ledger holds, label -> result, each only when the warm start here has the
    weights it evaluated and the study's evaluation config is the one it ran under (``entry_result``)."""
    held = {}
    for label in (WARM_LABELS[a] for a in warm_agents(cfg)):
        entry = read_entry(Path(cfg.study.ledger), label)
        if entry is not None:
            held[label] = entry_result(label, entry, cfg, weights=base_fingerprint(folders[label]))
    return held


def arm_seed_in_ledger(cfg: DictConfig, sub: DictConfig, label: str, key: str, entry: dict[str, Any]) -> GridResult:
    """An arm-seed's evaluation from study.ledger, in place of training and evaluating it: only when the copies of
    its run's config there pass ``check_reuse`` under ``sub`` (the config it would train now, from this warm start)
    and the study's evaluation config is the one it ran under; else a ``ReuseError`` naming what differs."""
    folder = Path(cfg.study.ledger) / key
    notes = check_reuse(label, folder, sub, stage="rl", names=(RUN_CONFIG, "config.yaml"))
    result = entry_result(key, entry, cfg)
    also = f"; {'; '.join(notes)}" if notes else ""
    say(f"[mempo] {label}: from the ledger {folder} (trained with the same config from the same warm start, "
        f"evaluated {entry.get('written', '?')}{also}): not trained or evaluated here")  # fmt: skip
    return result


def into_ledger(cfg: DictConfig, folders: dict[str, Path], out: Path, agents: dict[str, str]) -> None:
    """Evaluate ``folders`` (``evaluate_in_turn``: those evaluated before in ``out`` are kept) and write each into
    study.ledger (``write_entry``) with the fingerprint of its weights and its run folder's small files."""
    ev, _ = evaluate_in_turn(cfg, folders, out, {k: a for k, a in agents.items() if k in folders})
    for label, folder in folders.items():
        _write_ledger_entry(cfg, label, folder, ev)


def _write_ledger_entry(cfg: DictConfig, label: str, folder: Path, ev: dict[str, Any]) -> None:
    """Checkpoint ``label`` (its HF folder ``folder``) into study.ledger with its rows of the evaluation ``ev``."""
    write_entry(Path(cfg.study.ledger), label, cfg, weights=base_fingerprint(folder), result=grid_of(ev, [label]),
                run_folder=folder.parent)  # fmt: skip


def evaluate_with_ledger(
    cfg: DictConfig, folders: dict[str, Path], held: dict[str, GridResult], out: Path, agents: dict[str, str]
) -> tuple[dict[str, Any], str]:
    """The study's evaluation of ``folders`` (``evaluate_in_turn``) less those ``held`` from study.ledger, whose
    results join it: the evaluation's report in ``out`` is then written again over all of them, in the order of
    ``folders`` -> (the result, its status)."""
    live = {k: f for k, f in folders.items() if k not in held}
    if live:
        ev, status = evaluate_in_turn(cfg, live, out, {k: a for k, a in agents.items() if k in live})
        if cfg.study.ledger:
            for label, folder in live.items():  # those evaluated now but not yet in it (the warm starts)
                if read_entry(Path(cfg.study.ledger), label) is None:
                    _write_ledger_entry(cfg, label, folder, ev)
        if not held:
            return ev, status
        parts = [grid_of(ev, list(live))]
    else:
        parts, status = [], "none evaluated here"
    total = merged([*parts, *held.values()], list(folders))
    files = write_report(out, total, num_tasks=max(r["tasks"] for r in total.rows), memories_scored=False)
    result = {"rows": total.rows, "out": str(out), "files": {k: str(v) for k, v in files.items()},
              "failures": total.failures, "source_rows": total.source_rows}  # fmt: skip
    return result, f"{status}; {', '.join(held)} from the ledger"


def horizon_report(
    cfg: DictConfig, records: list[dict[str, Any]], arms: dict[str, dict[int, str]], agents: dict[str, str]
) -> dict[str, Any]:
    """Per arm (the warm starts as arms of one seed) and N, EM and F1 with intervals and the token means
    (``mempo.eval.horizon``); token ratios per N of every arm against study.reference and of every memory-agent arm
    against every ReAct arm."""
    rows = horizon_rows(records, arms, agents=agents)
    trained = run_arms(cfg)
    pairs = [(arm, cfg.study.reference) for arm in trained if arm != cfg.study.reference]
    pairs += [(m, x) for m in trained if arm_agent(cfg, m) == "memory" for x in trained
              if arm_agent(cfg, x) == "full_history"]  # fmt: skip
    return {"rows": rows, "token_ratios": token_ratios_by_n(rows, list(dict.fromkeys(pairs)))}


@stage("study")
def study(cfg: DictConfig) -> dict[str, Any]:
    """Warm start, arms x seeds of RL (each its own process), one evaluation, the seed-level report."""
    start = time.perf_counter()
    out = run_path(cfg)
    require_eval_task_count(cfg, "study")
    runs = arm_seed_configs(cfg)  # every arm-seed's config, validated before anything runs
    say_expected_time(cfg, runs)
    phases: dict[str, float] = {}
    status: dict[str, str] = {}
    ledger = Path(cfg.study.ledger) if cfg.study.ledger else None
    for agent in warm_agents(cfg):  # the memory agent's warm start, and a ReAct arm's (full-history prompts)
        label = WARM_LABELS[agent]
        status[label] = "given"
        if not cfg.study[label]:
            title = f"warm start on the synthetic oracle's trajectories ({agent} prompts)"
            keys = {"name": f"{cfg.name}-{label}", "agent.context": agent}
            done = run_steps(cfg, [Step(label, "sft", title, keys, reuse=True)])
            status[label], phases[f"{label}_s"] = done[label]["status"], done[label]["seconds"]
    folders, agents = study_checkpoints(cfg, runs), label_agents(cfg, runs)
    held = warm_starts_in_ledger(cfg, folders) if ledger is not None and not cfg.overwrite else {}
    if ledger is not None:  # the warm starts evaluated first: the arm-seeds' hours come after they are kept
        warm = [WARM_LABELS[a] for a in warm_agents(cfg) if WARM_LABELS[a] not in held]
        if warm:
            into_ledger(cfg, {k: folders[k] for k in warm}, out / "eval", agents)
    for i, ((arm, seed), sub) in enumerate(runs.items(), start=1):
        t, key = time.perf_counter(), f"{arm}_s{seed}"
        label = f"arm-seed {i}/{len(runs)}: {arm} seed {seed}"
        entry = read_entry(ledger, key) if ledger is not None and not cfg.overwrite else None
        if entry is not None:
            held[key], status[key] = arm_seed_in_ledger(cfg, sub, label, key, entry), "ledger"
            continue
        status[key] = run_arm_seed(cfg, sub, label)
        if ledger is not None:  # evaluated now, so a study stopped at its next run keeps this one's results
            done = list(folders)[: list(folders).index(key) + 1]
            into_ledger(cfg, {k: folders[k] for k in done if k not in held}, out / "eval", agents)
        phases[f"{key}_s"] = time.perf_counter() - t

    t = time.perf_counter()
    n_list = list(cfg.eval.objectives)
    say(f"[mempo] study: evaluating {len(folders)} checkpoints on the same {cfg.eval.num_tasks} held-out tasks per "
        f"N = {n_list} (engine: eval.engine_dtype={cfg.eval.engine_dtype})"
        + (f"; {len(held)} of them from the ledger {ledger}" if held else ""))  # fmt: skip
    ev, status["eval"] = evaluate_with_ledger(cfg, folders, held, out / "eval", agents)
    records = read_records(Path(ev["files"]["results"]))
    arms = {arm: {s: f"{arm}_s{s}" for s in cfg.study.seeds} for arm in run_arms(cfg)}
    own_warm = {arm: WARM_LABELS[arm_agent(cfg, arm)] for arm in arms if arm_agent(cfg, arm) != "memory"}
    others = {label: a for label, a in agents.items() if a != "memory"}  # the labels evaluated as another agent
    report = seed_study(records, arms, reference=cfg.study.reference, warm_start="warm_start", agents=others,
                        arm_warm_starts=own_warm, also_reference=list(cfg.study.also_reference))  # fmt: skip
    warm_rows = {WARM_LABELS[a]: {0: WARM_LABELS[a]} for a in warm_agents(cfg)}
    behaviour = turns_and_failures(records, ev.get("failures", []), {**warm_rows, **arms}, agents=others)
    phases["eval_s"] = time.perf_counter() - t
    scores, files = None, {"study_json": out / "study.json", "study_md": out / "study.md", "eval": Path(ev["out"])}
    horizon = horizon_report(cfg, records, {**warm_rows, **arms}, others)
    if len(n_list) > 1:  # the figure a long-horizon study is read by: EM and PT against N
        title = f"{cfg.study.recipe}, {cfg.trainer.max_steps} RL steps, {cfg.eval.split} tasks"
        files["horizon_png"] = plot_horizon(horizon["rows"], out / "horizon.png", title=title)
    means = None
    if cfg.study.memory_scores:
        t = time.perf_counter()
        items = memory_items(records)  # the memory agents' (a ReAct arm writes none)
        memory_arms = {arm: labels for arm, labels in arms.items() if arm_agent(cfg, arm) == "memory"}
        say(f"[mempo] study: scoring {len(items)} memories by P(gold | question, memory) under the warm start")
        p, dtype = score_memories(cfg, items)
        means = task_means(items, p)
        reference = cfg.study.reference if cfg.study.reference in memory_arms else None
        scores = score_study(items, p, memory_arms, reference=reference, warm_start="warm_start")
        scores |= {"scorer": str(warm_start_folder(cfg)), "dtype": dtype}
        rows = [{"checkpoint": it.checkpoint, "objectives": it.objectives, "task_id": it.task_id, "turn": it.turn,
                 "p_gold": v} for it, v in zip(items, p)]  # fmt: skip
        files["memory_scores_csv"] = write_csv(out / "memory_scores.csv", rows, list(MEMORY_SCORES_COLUMNS))
        files["memory_scores_png"] = plot_scores(items, p, {"warm_start": {0: "warm_start"}, **memory_arms},
                                                 out / "memory_scores.png")  # fmt: skip
        phases["memory_scores_s"] = time.perf_counter() - t
    rows = per_task_rows(records, arms, warm_start="warm_start", memory_means=means, agents=others,
                         other_warm_starts=sorted(set(own_warm.values())))  # fmt: skip
    files["per_task_csv"] = write_csv(out / "per_task.csv", rows, PER_TASK_COLUMNS)
    phases["total_s"] = time.perf_counter() - start
    design = {
        "seeds": list(cfg.study.seeds),
        "steps": cfg.trainer.max_steps,
        "recipe": cfg.study.recipe,
        "arm_overrides": {arm: arm_delta(cfg, arm) for arm in run_arms(cfg)},
        "warm_start": str(warm_start_folder(cfg)),
        "warm_start_fingerprint": base_fingerprint(warm_start_folder(cfg)),
        "arm_agents": {arm: arm_agent(cfg, arm) for arm in run_arms(cfg)},
        "arm_warm_starts": own_warm,
        **({"react_warm_start": str(warm_start_folder(cfg, "full_history"))} if own_warm else {}),
        "eval_tasks": cfg.eval.num_tasks,
        "engine_dtype": cfg.eval.engine_dtype,
        **({"ledger": str(ledger)} if ledger is not None else {}),
    }
    result = {"stage": "study", "design": design, **report, "behaviour": behaviour, "horizon": horizon,
              "status": status, "phases": phases}  # fmt: skip
    table = study_markdown(report) + "\n\nTurns per task and failure verdicts (summed over seeds):\n\n"
    table += turns_and_failures_markdown(behaviour)
    table += "\n\nPer arm and N (EM and F1 with their intervals; TT and PT means):\n\n"
    table += horizon_markdown(horizon["rows"], horizon["token_ratios"])
    if scores is not None:
        result["memory_scores"] = scores
        table += (
            f"\n\nMemories scored by P(gold | question, memory) under the warm start ({scores['memories']} memories, "
            f"{scores['dtype']}; paired over the tasks both sides wrote memories for):\n\n"
        )
        table += score_markdown(scores)
    write_json(files["study_json"], result)
    atomic_write_text(files["study_md"], table + "\n")
    summary = {**result, "files": {k: str(v) for k, v in files.items()}, **run_record(cfg)}
    write_json(out / "summary.json", summary)
    say("\n" + table)
    say(f"[mempo] study done in {phases['total_s']:.0f} s; {files['study_md']}, {files['study_json']}")
    return summary
