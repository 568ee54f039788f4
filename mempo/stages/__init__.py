"""Stages: what ``experiments/run.py`` runs, each one function of the validated config (``stage=NAME``).

    rl        MemPO (or GRPO, by config) from ``model.name_or_path``           mempo.stages.train
    sft       supervised warm start on teacher trajectories                    mempo.stages.train
    eval      checkpoints x agents x N on the same held-out tasks              mempo.stages.evaluate
    demo      the embedded default: warm start, RL, evaluation (``DEMO``)      mempo.stages.demo
    headline  MemPO vs GRPO vs a ReAct agent as N grows                        mempo.stages.headline
    study     arms x seeds of RL from one warm start, the seed-level report    mempo.stages.study

A composed stage (demo, headline) is a list of ``Step``s run by ``run_steps``: each step is another stage run with
a few keys overridden, in its own folder of run_dir. A step that trains a policy is reused when it finished earlier
(``reuse``, ``mempo.stages.rundir.finished``), and says so; overwrite=true trains it again, resume=true continues an
RL step from its checkpoint. The composed stage passes its resume and overwrite to every step it runs, so a step's
own folder check (``mempo.stages.rundir.claim_run_dir``) decides with them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from mempo.core.console import say, setup_console
from mempo.stages.builders import run_path
from mempo.stages.config import check_paths, require_teacher, trains_warm_start, validate_config
from mempo.stages.rundir import finished

StageFn = Callable[[DictConfig], dict[str, Any]]
STAGES: dict[str, StageFn] = {}


def stage(name: str) -> Callable[[StageFn], StageFn]:
    """Register a stage function under ``name`` (a value of the ``stage`` key)."""

    def deco(fn: StageFn) -> StageFn:
        STAGES[name] = fn
        return fn

    return deco


def run_stage(cfg: DictConfig) -> dict[str, Any]:
    """The top-level entry: inputs checked, the console set up, then the configured stage."""
    if cfg.stage not in STAGES:
        raise SystemExit(f"stage {cfg.stage!r} is not implemented; implemented: {sorted(STAGES)}")
    check_paths(cfg)  # a missing model, corpus or data file fails here, naming the key, before anything loads
    if trains_warm_start(cfg):
        require_teacher(cfg)  # real data without the user's teacher file: refused before a model loads
    log = setup_console(run_path(cfg), cfg.verbose)  # library logs and warnings to the run log (mempo.core.console)
    if not cfg.verbose:
        say(f"[mempo] {cfg.stage}: library logs and warnings go to {log} (verbose=true prints them here too)")
    return STAGES[cfg.stage](cfg)


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


IGNORED_CHANGES = ("run_dir", "resume", "overwrite", "verbose", "sweep")  # where or how, not what a phase trained


def config_changes(saved: Path, cfg: DictConfig, *, limit: int = 4) -> list[str]:
    """``key (old -> new)`` for each key whose value in a phase's saved ``config.yaml`` differs from ``cfg``'s
    (not the keys of ``IGNORED_CHANGES``): what a reused phase was trained with that this run would change."""
    if not saved.is_file():
        return []

    def flat(d: Any, prefix: str = "") -> dict[str, Any]:
        if not isinstance(d, dict):
            return {prefix[:-1]: d}
        return {k: v for key, sub in d.items() for k, v in flat(sub, f"{prefix}{key}.").items()}

    old, new = flat(OmegaConf.to_container(OmegaConf.load(saved))), flat(OmegaConf.to_container(cfg))
    keys = [k for k in dict.fromkeys([*new, *old]) if k.split(".")[0] not in IGNORED_CHANGES]
    changed = [f"{k} ({old.get(k, '(unset)')} -> {new.get(k, '(unset)')})" for k in keys if old.get(k) != new.get(k)]
    return changed[:limit] + ([f"{len(changed) - limit} more"] if len(changed) > limit else [])


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
            changes = config_changes(run_dir / "config.yaml", sub)
            note = f"; its config.yaml differs in {', '.join(changes)}" if changes else ""
            ways = "overwrite=true trains it again" + (", resume=true continues it" if step.stage == "rl" else "")
            say(f"[mempo] {i}/{len(steps)} {step.label}: reusing {run_dir}, finished earlier{note} ({ways})")
            summary_file = run_dir / "summary.json"
            summary, status = (json.loads(summary_file.read_text()) if summary_file.is_file() else {}), "reused"
        else:
            say(f"[mempo] {i}/{len(steps)} {step.label}: {step.title}")
            summary, status = STAGES[step.stage](sub), "trained"
        done[step.label] = {
            "summary": summary,
            "status": status,
            "seconds": time.perf_counter() - t,
            "run_dir": run_dir,
        }
    return done


# Register the stages (each module decorates its functions with @stage).
from mempo.stages import demo, evaluate, headline, study, train  # noqa: E402, F401
