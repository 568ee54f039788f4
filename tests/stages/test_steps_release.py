"""A composed stage (demo, headline, study) hands a phase's memory back before the next phase runs.

The bug it guards against (docs/performance.md, "Long runs"): a study that trained its own warm start in-process sat
at 9.6 GB resident, idle, while its RL arm trained in a subprocess beside it (16 of 24 GiB in use by the arm's step
5): the warm start's model and optimizer were unreachable but not yet collected (reference cycles), and the pages they
had freed stayed in glibc's arenas. Measured after an 8-step warm start through ``run_steps``: 6.95 GB resident
without the release (2.0 GB of tensors still alive), 0.77 GB with it.
"""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from mempo.stages.steps import STAGES, Step, run_steps, with_overrides


class Held:
    """Stands for a phase's model and optimizer: an object that keeps itself alive through a reference cycle."""

    def __init__(self) -> None:
        self.me = self


def test_a_phase_that_ran_is_released_before_the_next_and_a_reused_one_is_not(
    make_cfg, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    released: list[str] = []
    monkeypatch.setattr("mempo.stages.steps.release_free_memory", lambda: released.append("release") or True)

    def phase(cfg) -> dict:
        released.append(f"ran {Path(cfg.run_dir).name}")
        return {}

    monkeypatch.setitem(STAGES, "eval", phase)  # a phase that trains nothing: stands for any
    cfg = make_cfg(f"run_dir={tmp_path}")
    (tmp_path / "kept" / "hf").mkdir(parents=True)
    (tmp_path / "kept" / "hf" / "config.json").write_text("{}")  # finished: reused, not run
    kept = with_overrides(cfg, {"stage": "sft", "run_dir": str(tmp_path / "kept")})
    (tmp_path / "kept" / "config.yaml").write_text(OmegaConf.to_yaml(kept))  # what it trained with: this config
    run_steps(
        cfg,
        [Step("one", "eval", "one"), Step("kept", "sft", "kept", reuse=True), Step("two", "eval", "two")],
    )
    assert released == ["ran one", "release", "ran two", "release"]


def test_the_release_collects_what_a_phase_left_in_cycles() -> None:
    from mempo.core.hardware import release_free_memory

    gc.disable()
    try:
        ref = weakref.ref(Held())
        assert ref() is not None
        release_free_memory()
        assert ref() is None
    finally:
        gc.enable()
