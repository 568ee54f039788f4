"""The sweep report (``python -m mempo.eval.sweep``) on hand-made job folders: which folders are jobs, how jobs
group into sweep points, and the seed mean and [min, max] per point."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from mempo.eval.sweep import find_jobs, main, sweep_points, write_sweep_report

SHARED = ["+exp=grpo_cpu", "+debug=default"]


def job(folder: Path, num: str, overrides: list[str], val: list[tuple[float, float] | None], *, seed: int | None,
        kind: str = "hydra", stage_dir: str = "") -> Path:  # fmt: skip
    """A job folder: summary.json recording the sweep, and (in ``stage_dir``) a metrics.csv with one row per step
    of ``val`` (None: no validation that step)."""
    folder.mkdir(parents=True)
    sweep = {"kind": kind, "dir": str(folder.parent), "job": num, "overrides": overrides}
    (folder / "summary.json").write_text(json.dumps({"stage": "rl", "seed": seed, "sweep": sweep}))
    metrics = folder / stage_dir
    metrics.mkdir(parents=True, exist_ok=True)
    with (metrics / "metrics.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["step", "rollout/reward_mean", "val/em", "val/f1"])
        w.writeheader()
        for step, v in enumerate(val, start=1):
            w.writerow({"step": step, "rollout/reward_mean": 0.1 * step, "val/em": v and v[0], "val/f1": v and v[1]})
    return folder


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    """2 alphas x 2 seeds; job 3 validated at step 1 only; a single run's summary and a phase's are not jobs."""
    root = tmp_path / "mr"
    for num, (alpha, seed, val) in enumerate(
        [
            (0, 0, [None, (0.25, 0.5)]),
            (0, 1, [None, (0.75, 1.0)]),
            (1, 0, [None, (0.5, 0.5)]),
            (1, 1, [(0.125, 0.25), None]),
        ]
    ):
        job(root / str(num), str(num), [*SHARED, f"seed={seed}", f"memory.alpha={alpha}", f"run_dir={root}"], val,
            seed=seed)  # fmt: skip
    phase = root / "0" / "sft"  # a demo job's phase carries the job's sweep record too: not another job
    phase.mkdir()
    (phase / "summary.json").write_text((root / "0" / "summary.json").read_text())
    single = root / "old"  # a single run in the same tree (sweep.kind null)
    single.mkdir()
    (single / "summary.json").write_text(json.dumps({"stage": "rl", "sweep": {"kind": None}}))
    return root


def test_jobs_are_the_top_folders_that_record_a_sweep(sweep: Path) -> None:
    jobs = find_jobs(sweep)
    assert [(j.id, j.folder.name, j.seed) for j in jobs] == [("0", "0", 0), ("1", "1", 1), ("2", "2", 0), ("3", "3", 1)]
    shared, points = sweep_points(jobs)
    assert shared == SHARED and points == ["memory.alpha=0", "memory.alpha=0", "memory.alpha=1", "memory.alpha=1"]


def test_the_table_has_each_job_and_each_points_seed_mean_and_range(sweep: Path, capsys) -> None:
    main([str(sweep)])
    table = capsys.readouterr().out
    assert "every job: +exp=grpo_cpu +debug=default" in table
    lines = [line for line in table.splitlines() if line.startswith("| memory.alpha")]
    assert lines == [
        "| memory.alpha=0 | 0 | 0 | 2 | 2 | 0.250 | 0.500 |",
        "| memory.alpha=0 | 1 | 1 | 2 | 2 | 0.750 | 1.000 |",
        "| memory.alpha=0 | mean [min, max] | 2 seeds |  |  | 0.500 [0.250, 0.750] | 0.750 [0.500, 1.000] |",
        "| memory.alpha=1 | 2 | 0 | 2 | 2 | 0.500 | 0.500 |",
        "| memory.alpha=1 | 3 | 1 | 2 | 1 | 0.125 | 0.250 |",  # its last validation was at step 1
        "| memory.alpha=1 | mean [min, max] | 2 seeds |  |  | 0.312 [0.125, 0.500] | 0.375 [0.250, 0.500] |",
    ]
    for name in ("sweep.md", "sweep.csv", "sweep.png"):
        assert (sweep / name).is_file()


def test_a_demo_job_reads_its_rl_phase_and_a_job_without_validation_says_na(tmp_path: Path) -> None:
    """W&B runs (run ids for job numbers), one a demo whose metrics are in rl/, one never validated."""
    root = tmp_path / "sweep-abc"
    job(root / "x1y2", "x1y2", ["seed=0"], [None, (0.5, 0.5)], seed=None, kind="wandb", stage_dir="rl")
    job(root / "z9", "z9", ["seed=1"], [None, None], seed=None, kind="wandb")
    files = write_sweep_report(root, tmp_path / "report")
    with files["table_csv"].open(newline="") as f:
        rows = {r["job"]: r for r in csv.DictReader(f)}
    assert (rows["x1y2"]["seed"], rows["x1y2"]["val/em"], rows["z9"]["seed"], rows["z9"]["val/em"]) == (
        "0",
        "0.5",
        "1",
        "",
    )
    assert (
        "| (all) | mean [min, max] | 2 seeds |  |  | 0.500 [0.500, 0.500] (1 of 2) |" in files["table_md"].read_text()
    )


def test_a_folder_with_no_job_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no job of a sweep"):
        find_jobs(tmp_path)
    with pytest.raises(FileNotFoundError, match="no sweep folder"):
        find_jobs(tmp_path / "missing")
