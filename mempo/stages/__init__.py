"""Stages: what ``experiments/run.py`` runs, each one function of the validated config (``stage=NAME``).

    rl        MemPO (or GRPO, by config) from ``model.name_or_path``           mempo.stages.train
    sft       supervised warm start on teacher trajectories                    mempo.stages.train
    eval      checkpoints x agents x N on the same held-out tasks              mempo.stages.evaluate
    demo      the embedded default: warm start, RL, evaluation (``DEMO``)      mempo.stages.demo
    headline  MemPO vs GRPO vs a ReAct agent as N grows                        mempo.stages.headline
    study     arms x seeds of RL from one warm start, the seed-level report    mempo.stages.study

What the stages share (the registry, ``Step`` and ``run_steps``, ``with_overrides``) lives in
``mempo.stages.steps``; this module holds only the entry point, ``run_stage``.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from mempo.core.console import say, setup_console
from mempo.core.hardware import bound_onednn_caches
from mempo.stages.builders import run_path
from mempo.stages.config import check_paths, require_teacher, trains_warm_start
from mempo.stages.steps import STAGES, with_overrides

__all__ = ["STAGES", "run_stage", "with_overrides"]


def run_stage(cfg: DictConfig) -> dict[str, Any]:
    """The top-level entry: inputs checked, the console set up, then the configured stage."""
    if cfg.stage not in STAGES:
        raise SystemExit(f"stage {cfg.stage!r} is not implemented; implemented: {sorted(STAGES)}")
    check_paths(cfg)  # a missing model, corpus or data file fails here, naming the key, before anything loads
    if trains_warm_start(cfg):
        require_teacher(cfg)  # real data without the user's teacher file: refused before a model loads
    bound_onednn_caches(cfg.host.onednn_cache_capacity)  # before the process's first oneDNN primitive
    log = setup_console(run_path(cfg), cfg.verbose)  # library logs and warnings to the run log (mempo.core.console)
    if not cfg.verbose:
        say(f"[mempo] {cfg.stage}: library logs and warnings go to {log} (verbose=true prints them here too)")
    return STAGES[cfg.stage](cfg)


# Register the stages (each module decorates its functions with @stage).
from mempo.stages import demo, evaluate, headline, study, train  # noqa: E402, F401
