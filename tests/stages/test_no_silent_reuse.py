"""The main job reuses a phase only when it would train the same thing now: its config, less the keys that
cannot change what the phase trained, and the weights it started from. Runs the real demo on the tiny model once
(``+debug=default``: 2 warm-start steps, 2 RL steps, 2 tasks per N) and reruns it into the same folder."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from weights import retrain_in_place

import mempo.stages.steps as steps_mod
from mempo.stages import run_stage
from mempo.stages.config import compose_config


def demo(run_dir: Path, *extra: str) -> dict:
    return run_stage(compose_config("+debug=default", f"run_dir={run_dir}", *extra))


@pytest.fixture(scope="module")
def finished_demo(tiny_path, tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("demo") / "run"
    assert demo(run_dir)["status"] == {"sft": "trained", "rl": "trained", "eval": "trained"}
    return run_dir


def copy_of(finished_demo: Path, tmp_path: Path) -> Path:
    """The finished demo under another run_dir (its phases' saved run_dir differs: a key that never blocks)."""
    out = tmp_path / "run"
    shutil.copytree(finished_demo, out)
    return out


def test_a_rerun_on_another_world_refuses_the_warm_start(finished_demo: Path, tmp_path: Path) -> None:
    """Before: the world-0 warm start and RL policy were reused with a one-line note and evaluated on world 1."""
    run_dir = copy_of(finished_demo, tmp_path)
    changed = r"data\.world_seed \(0 -> 1\).*overwrite=true.*accept_changes=\[data\.world_seed\].*new run_dir"
    with pytest.raises(ValueError, match=rf"sft: {run_dir / 'sft'} holds a run trained with another config: {changed}"):
        demo(run_dir, "data.world_seed=1")


def test_keys_that_cannot_change_what_a_phase_trained_do_not_block(finished_demo: Path, tmp_path: Path) -> None:
    run_dir = copy_of(finished_demo, tmp_path)
    summary = demo(run_dir, "name=renamed", "ckpt.every_n_steps=5", "ckpt.hf_every_n_steps=1", "logger.tags=[x]",
                   "host.release_every=2", "eval.num_tasks=3")  # fmt: skip
    assert summary["status"] == {"sft": "reused", "rl": "reused", "eval": "trained"}


def test_a_change_the_warm_start_does_not_read_reuses_it_and_refuses_rl(finished_demo: Path, tmp_path) -> None:
    """optim.lr is the RL phase's: the warm start (which trains with sft.lr) is reused, the RL phase refused."""
    run_dir = copy_of(finished_demo, tmp_path)
    said: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(steps_mod, "say", said.append)
        with pytest.raises(ValueError, match=r"rl: .* optim\.lr \(1e-05 -> 0\.002\).*resume=true"):
            demo(run_dir, "optim.lr=2e-3")
    assert any("1/3 sft: reusing" in s for s in said)


def test_accept_changes_reuses_a_phase_and_says_what_it_accepted(finished_demo: Path, tmp_path: Path) -> None:
    run_dir = copy_of(finished_demo, tmp_path)
    said: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(steps_mod, "say", said.append)
        summary = demo(run_dir, "data.world_seed=1", "accept_changes=[data.world_seed]")
    assert summary["status"]["sft"] == "reused" and summary["status"]["rl"] == "reused"
    assert any("accepting data.world_seed (0 -> 1)" in s for s in said)


def test_a_warm_start_retrained_in_place_refuses_the_rl_phase(finished_demo: Path, tmp_path: Path) -> None:
    """Before: the RL policy trained from the old weights was reused and evaluated against the new ones."""
    run_dir = copy_of(finished_demo, tmp_path)
    retrain_in_place(run_dir / "sft" / "hf")
    with pytest.raises(ValueError, match=r"rl: .* provenance\.model \(hf:[0-9a-f]{16} -> hf:[0-9a-f]{16}\)"):
        demo(run_dir)


def test_resume_continues_only_under_the_config_it_started_with(finished_demo: Path, tmp_path: Path) -> None:
    """``resume=true`` on the RL phase's own folder (as after a kill): another optim.lr is refused before anything
    loads; the same config with a larger budget continues it (trainer.max_steps never blocks a continuation)."""
    from mempo.stages import with_overrides
    from mempo.stages.demo import demo_steps

    run_dir = copy_of(finished_demo, tmp_path)
    cfg = compose_config("+debug=default", f"run_dir={run_dir}")
    (step,) = [s for s in demo_steps(cfg) if s.label == "rl"]
    rl = with_overrides(cfg, {"stage": "rl", "run_dir": str(run_dir / "rl"), "resume": True, **step.overrides})
    with pytest.raises(ValueError, match=r"rl: .* optim\.lr \(1e-05 -> 0\.002\)\. It is not continued silently"):
        run_stage(with_overrides(rl, {"optim.lr": 2e-3, "trainer.max_steps": 3}))
    assert run_stage(with_overrides(rl, {"trainer.max_steps": 3}))["steps"] == 3
