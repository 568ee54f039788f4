"""Stage dispatch for ``experiments/run.py``: each stage is one function of the validated config."""

from __future__ import annotations

from collections.abc import Callable

from omegaconf import DictConfig

STAGES: dict[str, Callable[[DictConfig], None]] = {}


def stage(name: str) -> Callable[[Callable[[DictConfig], None]], Callable[[DictConfig], None]]:
    def deco(fn: Callable[[DictConfig], None]) -> Callable[[DictConfig], None]:
        STAGES[name] = fn
        return fn

    return deco


def run_stage(cfg: DictConfig) -> None:
    if cfg.stage not in STAGES:
        raise SystemExit(f"stage {cfg.stage!r} is not implemented yet; implemented: {sorted(STAGES)}")
    STAGES[cfg.stage](cfg)
