"""The ``study`` stage (``python experiments/run.py +exp=study``): an ablation study in one command, with RL seeds
as the unit of evidence (``mempo.eval.seeds``; docs/reviews/rl-signal.md, D1-D3).

    warm start   study.warm_start, or trained here when null (the sft stage in <run_dir>/warm_start, reused when it
                 finished), as the demo's and the headline's
    arms x seeds each arm (study.arms: a config delta on top of study.recipe) at each seed of study.seeds, for
                 trainer.max_steps RL steps from the warm start without in-training validation: each its own
                 ``experiments/run.py`` process in <run_dir>/<arm>/seed<k> (a finished run is reused, a killed one
                 continued with resume=true from its checkpoint)
    evaluation   the warm start and every final checkpoint in one evaluation on the same held-out tasks
                 (eval.num_tasks x eval.objectives; exp/study.yaml: 128 two-question tasks, a float32 engine)
    report       per arm its seeds' EM and F1; per comparison (every arm against study.reference, every arm against
                 the warm start) the per-seed paired differences, the t-interval over them (df = K - 1), the
                 two-level bootstrap beside it and the verdict; per arm its turns per task and failure verdicts

K (study.seeds) and the steps are the config's, fixed before the study runs. Outputs: <run_dir>/study.md (the
tables), study.json (``mempo.eval.seeds.seed_study`` plus the design and timings), summary.json, eval/ (the
evaluation's full report), and each arm-seed's run folder.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from mempo.core.base import atomic_write_text, write_json
from mempo.core.console import say
from mempo.eval.report import read_records
from mempo.eval.seeds import seed_study, study_markdown, turns_and_failures, turns_and_failures_markdown
from mempo.stages import Step, folders_arg, run_steps, stage, with_overrides
from mempo.stages.builders import run_path
from mempo.stages.config import CONFIG_DIR, cpu_has_bf16, exp_delta, require_eval_task_count
from mempo.stages.demo import DEMO_RATES, command_line_keys
from mempo.stages.evaluate import run_eval
from mempo.stages.rundir import finished, held_outputs, run_record

RUN_PY = CONFIG_DIR.parent / "run.py"  # the experiments/run.py of the code that is running (not an installed copy)
REPO_ROOT = CONFIG_DIR.parents[1]
# Keys the study keeps from the run's config whatever its recipe sets: the budget, and no in-training validation
# (a study compares the final checkpoints in one evaluation; validation would only cost time).
STUDY_OWN_KEYS = ("trainer.max_steps", "eval.every_n_steps")
FLOAT32_EVAL_FACTOR = 1.4  # a float32 engine against the bf16 one DEMO_RATES' AVX512-BF16 evaluation measured


def flatten(delta: Any, prefix: str = "") -> dict[str, Any]:
    """A nested config delta ({memory: {alpha: 1}}) -> dotted keys ({"memory.alpha": 1})."""
    if not isinstance(delta, dict):
        return {prefix[:-1]: delta}
    return {k: v for key, sub in delta.items() for k, v in flatten(sub, f"{prefix}{key}.").items()}


def arm_delta(cfg: DictConfig, arm: str) -> dict[str, Any]:
    """The keys an arm sets on top of the run's config: study.recipe's (less ``STUDY_OWN_KEYS`` and any key the
    command line set), then the arm's own delta (which wins over both)."""
    skip = set(STUDY_OWN_KEYS) | command_line_keys(cfg)
    recipe = {k: v for k, v in exp_delta(cfg.study.recipe).items() if k not in skip}
    own = flatten(OmegaConf.to_container(cfg.study.arms)[arm] or {})
    return {**recipe, **own}


def warm_start_folder(cfg: DictConfig) -> Path:
    """study.warm_start, or <run_dir>/warm_start/hf."""
    return Path(cfg.study.warm_start) if cfg.study.warm_start else run_path(cfg, "warm_start", "hf")


def arm_seed_configs(cfg: DictConfig) -> dict[tuple[str, int], DictConfig]:
    """(arm, seed) -> the validated config of that RL run, in arm-major order. Built before anything runs, so a
    bad key in an arm's delta fails here, naming it."""
    out = {}
    for arm in cfg.study.arms:
        delta = arm_delta(cfg, arm)
        for seed in cfg.study.seeds:
            keys = {
                "stage": "rl",
                "name": f"{cfg.name}-{arm}-s{seed}",
                "seed": seed,
                "run_dir": str(run_path(cfg, arm, f"seed{seed}")),
                "model.name_or_path": str(warm_start_folder(cfg)),
                "eval.every_n_steps": 0,
                **delta,
            }
            try:
                out[(arm, seed)] = with_overrides(cfg, keys)
            except Exception as e:
                raise ValueError(f"config key study.arms.{arm}: its run's config is invalid: {e}") from e
    return out


def expected_seconds(cfg: DictConfig, runs: dict[tuple[str, int], DictConfig], kind: str) -> dict[str, float]:
    """The study's expected wall time on a 2-core CPU of ``kind`` (``DEMO_RATES``), for what is not done yet:
    {"warm_start", "runs" (every arm-seed still to train), "per_run" (the first arm's), "eval", "total"}."""
    r = DEMO_RATES[kind]
    ws = 0.0
    if not cfg.study.warm_start and not finished(run_path(cfg, "warm_start")):
        ws = r["startup"] + cfg.sft.num_tasks * sum(cfg.sft.objectives or [cfg.data.objectives]) * r["sft_objective"]

    def one(c: DictConfig) -> float:
        return r["startup"] + c.trainer.max_steps * c.data.batch_size * c.data.group_size * r["rl_rollout"]

    todo = [one(c) for c in runs.values() if not finished(Path(c.run_dir))]
    per_objective = r["eval_objective"]
    if kind == "avx512_bf16" and cfg.eval.engine_dtype == "float32":
        per_objective *= FLOAT32_EVAL_FACTOR
    checkpoints = 1 + len(runs)
    ev = checkpoints * (r["startup"] + cfg.eval.num_tasks * sum(cfg.eval.objectives) * per_objective)
    t = {"warm_start": ws, "runs": sum(todo), "eval": ev}
    return t | {"per_run": one(next(iter(runs.values()))), "to_train": len(todo), "total": ws + sum(todo) + ev}


def say_expected_time(cfg: DictConfig, runs: dict[tuple[str, int], DictConfig]) -> None:
    """One console line at the start: how long this study should take on this kind of CPU (CPU runs only)."""
    if cfg.trainer.accelerator != "cpu":
        return
    kind = "avx512_bf16" if cpu_has_bf16() else "avx2"
    t = expected_seconds(cfg, runs, kind)
    what = "AVX512-BF16: trains in bf16" if kind == "avx512_bf16" else "no AVX512-BF16: trains in float32"
    k, arms = len(cfg.study.seeds), len(cfg.study.arms)
    say(
        f"[mempo] study: {arms} arms x {k} seeds x {cfg.trainer.max_steps} RL steps; expected about "
        f"{t['total'] / 60:.0f} min on a 2-core CPU like this one ({what}): warm start ~{t['warm_start'] / 60:.0f}, "
        f"{t['to_train']} RL runs to train ~{t['runs'] / 60:.0f} (~{t['per_run'] / 60:.0f} each), evaluation of "
        f"{1 + len(runs)} checkpoints ~{t['eval'] / 60:.0f} min (more with fewer cores)"
    )


def launch(sub: DictConfig) -> None:
    """Run one arm-seed as its own ``experiments/run.py`` process in ``sub.run_dir``: its full config written to
    <run_dir>/study_run.yaml and given to Hydra as the primary config, so it runs exactly this config, with this
    code (PYTHONPATH: the running code's repository first). Raises naming the folder when it fails."""
    folder = Path(sub.run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    plain = {k: v for k, v in OmegaConf.to_container(sub).items() if k != "sweep"}  # run.py records its own
    atomic_write_text(folder / "study_run.yaml", OmegaConf.to_yaml(plain))
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
    """Train one arm-seed unless it finished -> "reused" | "trained" | "resumed". A folder with a checkpoint is
    continued (resume=true); one with outputs but no checkpoint is started again (overwrite=true)."""
    folder = Path(sub.run_dir)
    if finished(folder) and not cfg.overwrite:
        say(f"[mempo] {label}: reusing {folder}, finished earlier (overwrite=true trains it again)")
        return "reused"
    held = held_outputs(folder)
    ckpt = folder / "checkpoints" / "last.ckpt"
    if cfg.overwrite:
        mode, how = {"overwrite": True, "resume": False}, "trained again (overwrite=true)"
    elif ckpt.exists() or ckpt.is_symlink():
        mode, how = {"resume": True, "overwrite": False}, f"continued from {ckpt} (resume=true)"
    elif held:
        mode, how = {"overwrite": True, "resume": False}, f"started again: {', '.join(held)} but no checkpoint"
    else:
        mode, how = {"resume": False, "overwrite": False}, "new"
    say(f"[mempo] {label}: {sub.trainer.max_steps} RL steps in {folder}, {how}")
    launch(with_overrides(sub, mode))
    if not finished(folder):
        raise RuntimeError(f"study: the RL run in {folder} ended without exporting its policy (hf/config.json)")
    return "trained" if mode["resume"] is False else "resumed"


@stage("study")
def study(cfg: DictConfig) -> dict[str, Any]:
    """Warm start, arms x seeds of RL (each its own process), one evaluation, the seed-level report."""
    start = time.perf_counter()
    out = run_path(cfg)
    require_eval_task_count(cfg, "study")
    runs = arm_seed_configs(cfg)  # every arm-seed's config, validated before anything runs
    say_expected_time(cfg, runs)
    phases: dict[str, float] = {}
    status: dict[str, str] = {"warm_start": "given"}
    if not cfg.study.warm_start:
        title = "warm start on the synthetic oracle's trajectories"
        done = run_steps(cfg, [Step("warm_start", "sft", title, {"name": f"{cfg.name}-warm_start"}, reuse=True)])
        status["warm_start"], phases["warm_start_s"] = done["warm_start"]["status"], done["warm_start"]["seconds"]
    for i, ((arm, seed), sub) in enumerate(runs.items(), start=1):
        t = time.perf_counter()
        label = f"arm-seed {i}/{len(runs)}: {arm} seed {seed}"
        status[f"{arm}_s{seed}"] = run_arm_seed(cfg, sub, label)
        phases[f"{arm}_s{seed}_s"] = time.perf_counter() - t

    t = time.perf_counter()
    folders = {"warm_start": warm_start_folder(cfg)} | {
        f"{a}_s{s}": Path(c.run_dir) / "hf" for (a, s), c in runs.items()
    }
    n_list = list(cfg.eval.objectives)
    say(f"[mempo] study: evaluating {len(folders)} checkpoints on the same {cfg.eval.num_tasks} held-out tasks per "
        f"N = {n_list} (engine: eval.engine_dtype={cfg.eval.engine_dtype})")  # fmt: skip
    ev = run_eval(with_overrides(cfg, {"eval.checkpoints": folders_arg(folders)}), out=out / "eval")
    records = read_records(Path(ev["files"]["results"]))
    arms = {arm: {s: f"{arm}_s{s}" for s in cfg.study.seeds} for arm in cfg.study.arms}
    report = seed_study(records, arms, reference=cfg.study.reference, warm_start="warm_start")
    behaviour = turns_and_failures(records, ev.get("failures", []), {"warm_start": {0: "warm_start"}, **arms})
    phases["eval_s"] = time.perf_counter() - t
    phases["total_s"] = time.perf_counter() - start
    design = {
        "seeds": list(cfg.study.seeds),
        "steps": cfg.trainer.max_steps,
        "recipe": cfg.study.recipe,
        "arm_overrides": {arm: arm_delta(cfg, arm) for arm in cfg.study.arms},
        "warm_start": str(warm_start_folder(cfg)),
        "eval_tasks": cfg.eval.num_tasks,
        "engine_dtype": cfg.eval.engine_dtype,
    }
    result = {"stage": "study", "design": design, **report, "behaviour": behaviour, "status": status, "phases": phases}
    table = study_markdown(report) + "\n\nTurns per task and failure verdicts (summed over seeds):\n\n"
    table += turns_and_failures_markdown(behaviour)
    files = {"study_json": out / "study.json", "study_md": out / "study.md", "eval": Path(ev["out"])}
    write_json(files["study_json"], result)
    atomic_write_text(files["study_md"], table + "\n")
    summary = {**result, "files": {k: str(v) for k, v in files.items()}, **run_record(cfg)}
    write_json(out / "summary.json", summary)
    say("\n" + table)
    say(f"[mempo] study done in {phases['total_s']:.0f} s; {files['study_md']}, {files['study_json']}")
    return summary
