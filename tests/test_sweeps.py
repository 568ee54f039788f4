"""Sweeps keep every run. The bugs: every job of ``run.py -m ... seed=0,1 run_dir=D`` wrote into D (one
metrics.csv, one checkpoint, seed 1's config), every run of a W&B sweep spec into runs/mempo, a rerun without
resume replaced a run without a word, and the sweep specs ranked points by the training reward and compared the 7B
GPU setting with CPU defaults.

The multirun is real: ``experiments/run.py -m`` on the debug config in a subprocess (two jobs of seconds each).
"""

from __future__ import annotations

import csv
import itertools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from mempo.eval.sweep import write_sweep_report
from mempo.stages import run_stage
from mempo.stages.config import CONFIG_DIR, compose_config, validate_config
from mempo.stages.rundir import RunDirError, claim_run_dir

ROOT = Path(__file__).resolve().parents[1]
# The debug config, shorter still: one turn of 8 tokens per rollout; validation (2 tasks) at step 2 of 2.
FAST = ["+exp=ablation_nomem", "+debug=default", "agent.max_turns=1", "sampler.max_new_tokens=8"]


def run_py(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}  # one thread: the jobs are tiny
    return subprocess.run(
        [sys.executable, str(ROOT / "experiments" / "run.py"), *args],
        capture_output=True, text=True, timeout=600, cwd=ROOT, env=env,
    )  # fmt: skip


def metrics(folder: Path) -> list[dict[str, str]]:
    with (folder / "metrics.csv").open(newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def multirun(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The command that lost runs: ``run.py -m +exp=ablation_nomem +debug=default seed=0,1 run_dir=D`` -> D."""
    sweep = tmp_path_factory.mktemp("sweep") / "mr"
    out = run_py("-m", *FAST, "seed=0,1", f"run_dir={sweep}")
    assert out.returncode == 0, out.stderr[-3000:]
    return sweep


def test_every_job_of_a_multirun_keeps_its_own_complete_run(multirun: Path) -> None:
    for job in (0, 1):
        folder = multirun / str(job)
        assert [int(r["step"]) for r in metrics(folder)] == [1, 2]
        assert metrics(folder)[-1]["val/em"] != ""  # validated at its last step (the debug config)
        assert OmegaConf.load(folder / "config.yaml").seed == job  # the job's own seed, not the last job's
        assert (folder / "checkpoints" / "last.ckpt").is_file() and (folder / "hf" / "config.json").is_file()
        assert (folder / ".hydra" / "overrides.yaml").is_file()  # Hydra's record of the job, beside its outputs
        summary = json.loads((folder / "summary.json").read_text())
        assert summary["seed"] == job and summary["steps"] == 2
        assert summary["sweep"] == {
            "kind": "hydra", "dir": str(multirun), "job": str(job),
            "overrides": [*FAST, f"seed={job}", f"run_dir={multirun}"],
        }  # fmt: skip
    assert not (multirun / "metrics.csv").exists() and not (multirun / "checkpoints").exists()


def test_the_sweep_report_gathers_the_multirun(multirun: Path, tmp_path: Path) -> None:
    files = write_sweep_report(multirun, tmp_path)
    with files["table_csv"].open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["job"], r["seed"], r["steps"], r["val step"]) for r in rows] == [
        ("0", "0", "2", "2"),
        ("1", "1", "2", "2"),
    ]
    assert {r["point"] for r in rows} == {"(all)"}  # the jobs differ by seed only: one point, two seeds
    table = files["table_md"].read_text()
    assert "every job: " + " ".join(FAST) in table and "| (all) | mean [min, max] | 2 seeds |" in table
    assert files["curves"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_rerun_without_resume_is_refused_and_overwrite_replaces_the_run(multirun: Path, tmp_path: Path) -> None:
    folder = tmp_path / "run"
    shutil.copytree(multirun / "1", folder, symlinks=True)  # a finished run (seed 1), not the fixture's own
    with pytest.raises(RunDirError) as refused:
        run_stage(compose_config(*FAST, "seed=7", f"run_dir={folder}"))
    assert str(folder) in str(refused.value) and "resume=true" in str(refused.value)
    assert "overwrite=true" in str(refused.value)
    assert OmegaConf.load(folder / "config.yaml").seed == 1 and len(metrics(folder)) == 2  # untouched
    run_stage(compose_config(*FAST, "seed=1", f"run_dir={folder}", "resume=true"))  # resume continues it (done)
    assert len(metrics(folder)) == 2
    before = (folder / "checkpoints" / "last.ckpt").stat().st_mtime_ns
    summary = run_stage(compose_config(*FAST, "seed=7", f"run_dir={folder}", "overwrite=true"))
    assert summary["seed"] == 7 and summary["sweep"]["kind"] is None and summary["steps"] == 2
    assert OmegaConf.load(folder / "config.yaml").seed == 7 and [int(r["step"]) for r in metrics(folder)] == [1, 2]
    assert (folder / "checkpoints" / "last.ckpt").stat().st_mtime_ns > before
    assert [p.name for p in (folder / "lightning_logs").iterdir()] == ["version_0"]  # the old logs went too


def test_an_fsdp_checkpoint_counts_like_a_file_and_overwrite_removes_only_the_runs_outputs(tmp_path: Path) -> None:
    """Under FSDP last.ckpt is a symlink to a step-<k> folder of shards; a dangling one is still another run's."""
    ckpts = tmp_path / "checkpoints"
    (ckpts / "step-000002").mkdir(parents=True)
    (ckpts / "step-000002" / "__0_0.distcp").write_bytes(b"shard")
    os.symlink("step-000002", ckpts / "last.ckpt")
    (tmp_path / "notes.txt").write_text("the user's")
    for stage in ("rl", "sft"):
        with pytest.raises(RunDirError, match="checkpoints/last.ckpt.*overwrite=true"):
            claim_run_dir(tmp_path, stage=stage, resume=False, overwrite=False)
    with pytest.raises(RunDirError, match="keeps no checkpoint"):  # the warm start has nothing to resume
        claim_run_dir(tmp_path, stage="sft", resume=True, overwrite=False)
    assert claim_run_dir(tmp_path, stage="rl", resume=True, overwrite=False) == "resume"
    shutil.rmtree(ckpts / "step-000002")
    with pytest.raises(RunDirError, match="checkpoints/last.ckpt"):
        claim_run_dir(tmp_path, stage="rl", resume=False, overwrite=False)
    assert claim_run_dir(tmp_path, stage="rl", resume=False, overwrite=True) == "overwrite"
    assert not ckpts.exists() and (tmp_path / "notes.txt").read_text() == "the user's"
    assert claim_run_dir(tmp_path, stage="rl", resume=False, overwrite=False) == "new"


def test_resume_and_overwrite_exclude_each_other() -> None:
    with pytest.raises(ValueError, match="overwrite"):
        compose_config("resume=true", "overwrite=true")


SPECS = sorted((ROOT / "experiments" / "sweeps").glob("*.yaml"))
SETTING = ("model", "trainer", "data", "sampler", "optim", "ckpt", "eval", "loss", "env", "reward")  # like with like


def grid(spec: dict) -> list[list[str]]:
    """Every point of a grid spec as the overrides a W&B agent passes: the command's fixed ones, then the point's."""
    fixed = [str(a) for a in spec["command"] if "=" in str(a) and not str(a).startswith("$")]
    keys = list(spec["parameters"])
    values = itertools.product(*(spec["parameters"][k]["values"] for k in keys))
    return [fixed + [f"{k}={v}" for k, v in zip(keys, point)] for point in values]


def flat(d: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, sub in d.items():
        out |= flat(sub, f"{prefix}{key}.") if isinstance(sub, dict) else {prefix + key: sub}
    return out


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_every_sweep_spec_gives_each_point_its_own_run_dir_on_one_setting(path: Path, monkeypatch) -> None:
    """Each point composed as a W&B agent runs it (WANDB_SWEEP_ID, and a WANDB_RUN_ID per run): its run folder is
    Hydra's output folder (config.yaml's hydra.run.dir), which experiments/run.py makes run_dir."""
    spec = yaml.safe_load(path.read_text())  # not OmegaConf: ${env} and ${program} are W&B's macros
    assert spec["program"] == "experiments/run.py" and "${args_no_hyphens}" in spec["command"]
    assert spec["metric"] == {"name": spec["metric"]["name"], "goal": "maximize"}
    assert spec["metric"]["name"] in ("val/em", "val/f1")  # held-out validation, not the training reward
    monkeypatch.setenv("WANDB_SWEEP_ID", "abc123")
    folders, settings = [], []
    for i, overrides in enumerate(grid(spec)):
        monkeypatch.setenv("WANDB_RUN_ID", f"run{i}")
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            composed = compose(config_name="config", overrides=overrides, return_hydra_config=True)
        folders.append(Path(composed.hydra.run.dir))
        plain = OmegaConf.to_container(composed)
        del plain["hydra"]
        cfg = validate_config(plain)
        assert cfg.eval.every_n_steps > 0 and cfg.trainer.max_steps % cfg.eval.every_n_steps == 0  # val at the end
        named = {k.lstrip("+") for k in spec["parameters"]}
        settings.append({k: v for k, v in flat(OmegaConf.to_container(cfg)).items()
                         if k.split(".")[0] in SETTING and k not in named})  # fmt: skip
    assert len(set(folders)) == len(folders)  # every point (and every agent) apart
    assert {f.parent for f in folders} == {Path(cfg.run_dir) / "sweep-abc123"}  # one sweep folder for the report
    different = {k for s in settings[1:] for k in s if s[k] != settings[0].get(k)}
    assert not different, f"{path.name}: points differ in {sorted(different)}, which no parameter names"
