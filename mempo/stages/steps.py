"""What the stages share: the stage registry (``stage``, ``STAGES``) and the composition of stages into steps
(``Step``, ``run_steps``, ``with_overrides``, ``reuses``), the command line's own keys and the measured rates the
stages predict their time from. Every stage module imports this one and none imports another stage module.

A composed stage (demo, headline, study) is a list of ``Step``s run by ``run_steps``: each step is another stage run
with a few keys overridden, in its own folder of run_dir. A step that trains a policy is reused when it finished
earlier (``reuse``, ``mempo.stages.rundir.finished``) with the config and warm start it would train with now, and
says so; otherwise it is refused, naming what differs (``mempo.stages.reuse``). overwrite=true trains it again,
resume=true continues an RL step from its checkpoint. The composed stage passes its resume and overwrite to every step
it runs, so a step's own folder check (``mempo.stages.rundir.claim_run_dir``) decides with them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from mempo.core.console import say
from mempo.core.hardware import release_free_memory
from mempo.stages.builders import run_path
from mempo.stages.config import resolve_precision, validate_config
from mempo.stages.reuse import check_reuse
from mempo.stages.rundir import finished

StageFn = Callable[[DictConfig], dict[str, Any]]
STAGES: dict[str, StageFn] = {}


def stage(name: str) -> Callable[[StageFn], StageFn]:
    """Register a stage function under ``name`` (a value of the ``stage`` key)."""

    def deco(fn: StageFn) -> StageFn:
        STAGES[name] = fn
        return fn

    return deco


def _dotlist_value(v: Any) -> Any:
    """A value as ``OmegaConf.from_dotlist`` reads it back: None as null and a mapping or list as JSON (a YAML flow
    value, its nested nulls included); strings as they are (``folders_arg``'s flow mappings are parsed)."""
    if v is None:
        return "null"
    if isinstance(v, (dict, list)):
        return json.dumps(v)
    return v


def with_overrides(cfg: DictConfig, overrides: Mapping[str, Any]) -> DictConfig:
    """A validated copy of ``cfg`` with dotted-key overrides (a None value sets null: exp files' ``key: null``)."""
    dotlist = [f"{k}={_dotlist_value(v)}" for k, v in overrides.items()]
    merged = OmegaConf.merge(OmegaConf.to_container(cfg), OmegaConf.from_dotlist(dotlist))
    return validate_config(merged)


def folders_arg(folders: Mapping[str, Any]) -> str:
    """label -> folder as one override value (``eval.checkpoints={a: 'x', b: 'y'}``)."""
    return "{" + ", ".join(f"{k}: '{v}'" for k, v in folders.items()) + "}"


@dataclass(frozen=True)
class Step:
    """One phase of a composed stage: the stage ``stage`` run on the composed stage's config plus ``overrides``,
    in ``<run_dir>/<label>`` unless the overrides name another run_dir. ``reuse``: a phase that trains a policy,
    reused when that folder holds its finished policy (``reuses``)."""

    label: str
    stage: str
    title: str
    overrides: Mapping[str, Any] = field(default_factory=dict)
    reuse: bool = False


def reuses(cfg: DictConfig, step: Step, run_dir: Path) -> bool:
    """Whether ``step`` is reused rather than run: it trains a policy (``reuse``), finished earlier in ``run_dir``,
    and neither overwrite=true (train every phase again) nor, for an RL step, resume=true (continue it from its
    checkpoint: a finished run then trains only the steps it lacks) says otherwise."""
    if not (step.reuse and finished(run_dir)) or cfg.overwrite:
        return False
    return not (cfg.resume and step.stage == "rl")


def run_steps(cfg: DictConfig, steps: Sequence[Step]) -> dict[str, dict[str, Any]]:
    """Run (or reuse) every step in order -> label -> {"summary", "status" (trained | reused), "seconds", "run_dir"}
    ("trained" for a step that ran, whatever its stage). Each step that runs gets the composed stage's resume and
    overwrite (its own folder check decides with them)."""
    out = run_path(cfg)
    done: dict[str, dict[str, Any]] = {}
    for i, step in enumerate(steps, start=1):
        t = time.perf_counter()
        run_dir = Path(step.overrides.get("run_dir", out / step.label))
        keys = {"stage": step.stage, "run_dir": str(run_dir), "resume": cfg.resume, "overwrite": cfg.overwrite}
        sub = with_overrides(cfg, {**keys, **step.overrides})
        if reuses(cfg, step, run_dir):
            notes = check_reuse(step.label, run_dir, sub, stage=step.stage)  # refused when it would train another
            also = f"; {'; '.join(notes)}" if notes else ""
            ways = "overwrite=true trains it again" + (", resume=true continues it" if step.stage == "rl" else "")
            say(f"[mempo] {i}/{len(steps)} {step.label}: reusing {run_dir}, finished earlier with the same config"
                f"{also} ({ways})")  # fmt: skip
            summary_file = run_dir / "summary.json"
            summary, status = (json.loads(summary_file.read_text()) if summary_file.is_file() else {}), "reused"
        else:
            say(f"[mempo] {i}/{len(steps)} {step.label}: {step.title}")
            summary, status = STAGES[step.stage](sub), "trained"
            # The phase's model, optimizer and engine are garbage now; hand their pages back before the next phase
            # (or a study's RL process) runs beside this one (docs/performance.md, "Long runs").
            release_free_memory()
        done[step.label] = {
            "summary": summary,
            "status": status,
            "seconds": time.perf_counter() - t,
            "run_dir": run_dir,
        }
    return done


def command_line_keys(cfg: DictConfig) -> set[str]:
    """The dotted keys set on the command line (``sweep.overrides``: Hydra's task overrides), ``+``/``~`` removed."""
    return {o.split("=", 1)[0].lstrip("+~") for o in cfg.sweep.overrides if "=" in o}


# Seconds per unit of work of each phase on a 2-core CPU, from the main job's phases measured on each kind of machine
# (``mempo.core.hardware.rate_kind``; docs/performance.md, "Time estimates"): the warm start per teacher objective (a
# task of N objectives counts N), an RL step per rollout, in-training validation (RL's float32 engine) and the final
# evaluation (eval.engine_dtype=auto: bf16 where the CPU has it) per held-out objective and checkpoint, and each
# phase's start-up (model load, the vLLM engine). "amx": the main job's phases on a 2-core AMX Xeon, alone (627 s:
# warm start 382, RL 147 of which validation 42, evaluation 97). "avx512_bf16" (no AMX): the mean phases of the main
# job's two runs alone with today's defaults on a 2-core Zen 4 EPYC (933 and 834 s: warm start 604 / 542, RL 180 /
# 150, evaluation 149 / 142), validation at the earlier rate; each run is within 6% of their mean. "avx2": no native
# bf16, trains and evaluates in float32 (the warm start and the evaluation measured there on an earlier recipe; the RL
# step scaled by 2.7, the ratio measured between the kinds for training).
DEMO_RATES: dict[str, dict[str, float]] = {
    "amx": {"sft_objective": 1.24, "rl_rollout": 2.83, "val_objective": 1.31, "eval_objective": 0.18, "startup": 25.0},
    "avx512_bf16": {
        "sft_objective": 1.90,
        "rl_rollout": 3.15,
        "val_objective": 1.23,
        "eval_objective": 0.37,
        "startup": 25.0,
    },
    "avx2": {"sft_objective": 5.1, "rl_rollout": 13.0, "val_objective": 2.5, "eval_objective": 2.5, "startup": 40.0},
}
# How the console names each kind (``kind_label`` adds what the run trains in there).
KIND_LABELS = {"amx": "AMX", "avx512_bf16": "AVX512-BF16 without AMX", "avx2": "no AVX512-BF16"}


def kind_label(kind: str, cfg: DictConfig) -> str:
    """The console's name of a CPU kind with the precision this run trains in (trainer.precision resolved here:
    ``auto`` is bf16 wherever the CPU has native bf16), e.g. "no AVX512-BF16; trains in float32,
    trainer.precision=auto"."""
    precision = resolve_precision(cfg.trainer.precision, cfg.trainer.accelerator)
    trains = "bf16" if precision.startswith("bf16") else "float32"
    return f"{KIND_LABELS[kind]}; trains in {trains}, trainer.precision={cfg.trainer.precision}"
