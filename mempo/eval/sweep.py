"""A sweep's report, gathered from each job's summary.json and metrics.csv (a Hydra multirun or a W&B sweep).

    python -m mempo.eval.sweep runs/mr          # -> runs/mr/sweep.md, sweep.csv, sweep.png; prints the table

A job is a folder under the sweep folder whose summary.json records a sweep (its ``sweep`` entry, which
experiments/run.py fills in a multirun and under a W&B agent: ``mempo.stages.rundir``); several folders of one job
(a demo job's phases) count once, the top one. Its metrics are its metrics.csv, or its RL phase's (``rl/``) for a
demo job. A job's sweep point is its overrides less ``seed`` and ``run_dir`` and less the overrides every job shares
(listed above the table); the jobs of a point differ by seed only.

The table (sweep.md), one per sweep: per point, a row per job (its job number or W&B run id, seed, RL steps done,
and the last in-training validation: its step, val/em and val/f1 on held-out tasks, ``eval.every_n_steps``) and a
row with the mean over its seeds and [min, max]. sweep.csv has the job rows with every override; sweep.png the
learning curves of every job in one figure (``mempo.eval.curves.plot_runs``).
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mempo.core.base import atomic_write_text, write_csv
from mempo.eval.curves import plot_runs, read_metrics
from mempo.eval.tables import markdown_table

VAL_KEYS = ("val/em", "val/f1")
OWN_KEYS = ("seed", "run_dir")  # overrides that tell a job apart without making it another sweep point
COLUMNS = ["point", "job", "seed", "steps", "val step", *VAL_KEYS]


@dataclass(frozen=True)
class Job:
    """One job of a sweep: its folder, its summary.json, the folder of its metrics.csv (None: none)."""

    folder: Path
    summary: dict[str, Any]
    metrics_dir: Path | None

    @property
    def id(self) -> str:
        return str(self.summary["sweep"]["job"])

    @property
    def overrides(self) -> list[str]:
        return [str(o) for o in self.summary["sweep"].get("overrides", [])]

    @property
    def seed(self) -> int | None:
        if self.summary.get("seed") is not None:
            return int(self.summary["seed"])
        given = [o.split("=", 1)[1] for o in self.overrides if _key(o) == "seed"]
        return int(given[-1]) if given else None


def _key(override: str) -> str:
    """The key of an override (``+exp=a`` -> exp, ``memory.alpha=0`` -> memory.alpha)."""
    return override.split("=", 1)[0].lstrip("+~")


def _order(job_id: str) -> tuple[int, str]:
    return (int(job_id), "") if job_id.isdigit() else (1 << 30, job_id)


def find_jobs(sweep_dir: str | Path) -> list[Job]:
    """The jobs under ``sweep_dir`` (module docstring), in job order."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise FileNotFoundError(f"no sweep folder at {sweep_dir}")
    jobs: dict[tuple[str, str], Job] = {}
    for path in sorted(sweep_dir.rglob("summary.json"), key=lambda p: len(p.parts)):  # top folders first
        summary = json.loads(path.read_text())
        sweep = summary.get("sweep") or {}
        if not sweep.get("kind"):
            continue  # a single run's summary, or one written before runs recorded their sweep
        key = (str(sweep.get("dir")), str(sweep.get("job")))
        if key not in jobs:
            found = [d for d in (path.parent, path.parent / "rl") if (d / "metrics.csv").is_file()]
            jobs[key] = Job(path.parent, summary, found[0] if found else None)
    if not jobs:
        raise ValueError(f"{sweep_dir}: no job of a sweep (no summary.json there records one)")
    return sorted(jobs.values(), key=lambda j: (_order(j.id), str(j.folder)))


def last_validation(metrics_dir: Path | None) -> dict[str, Any]:
    """{"steps", "val step", "val/em", "val/f1"} from a metrics.csv: its last step and its last row with val/em
    (None where there is none)."""
    out: dict[str, Any] = {"steps": None, "val step": None, **dict.fromkeys(VAL_KEYS)}
    if metrics_dir is None:
        return out
    rows = read_metrics(metrics_dir / "metrics.csv")
    out["steps"] = int(rows[-1]["step"])
    validated = [r for r in rows if not math.isnan(r.get("val/em", math.nan))]
    if validated:
        out["val step"] = int(validated[-1]["step"])
        out.update({k: None if math.isnan(v := validated[-1].get(k, math.nan)) else v for k in VAL_KEYS})
    return out


def sweep_points(jobs: Sequence[Job]) -> tuple[list[str], list[str]]:
    """-> (the overrides every job shares, each job's point: its other overrides less seed and run_dir)."""
    own = [[o for o in j.overrides if _key(o) not in OWN_KEYS] for j in jobs]
    shared = [o for o in own[0] if all(o in rest for rest in own[1:])] if own else []
    points = [" ".join(o for o in job if o not in shared) or "(all)" for job in own]
    return shared, points


def _spread(values: Sequence[float | None]) -> str:
    """``mean [min, max]`` of the values that are numbers (``(k of n)`` after it when some are not), or n/a."""
    vals = [v for v in values if v is not None]
    if not vals:
        return "n/a"
    some = f" ({len(vals)} of {len(values)})" if len(vals) < len(values) else ""
    return f"{sum(vals) / len(vals):.3f} [{min(vals):.3f}, {max(vals):.3f}]{some}"


def gather(sweep_dir: str | Path) -> tuple[list[str], list[dict[str, Any]], list[Job]]:
    """-> (the shared overrides, one row per job: COLUMNS plus "overrides" and "folder", the jobs)."""
    jobs = find_jobs(sweep_dir)
    shared, points = sweep_points(jobs)
    rows = [
        {"point": point, "job": j.id, "seed": j.seed, **last_validation(j.metrics_dir)}
        | {"overrides": " ".join(j.overrides), "folder": str(j.folder)}
        for j, point in zip(jobs, points)
    ]
    return shared, rows, jobs


def sweep_table(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown: per point (in first-job order) its job rows, then the seed mean and [min, max] of val/em, val/f1."""

    lines: list[dict[str, Any]] = []
    for point in dict.fromkeys(r["point"] for r in rows):
        mine = [r for r in rows if r["point"] == point]
        seeds = {r["seed"] for r in mine}
        lines += [{k: "n/a" if r[k] is None else r[k] for k in COLUMNS} for r in mine]
        lines.append(
            {"point": point, "job": "mean [min, max]", "seed": f"{len(seeds)} seeds", "steps": "", "val step": ""}
            | {k: _spread([r[k] for r in mine]) for k in VAL_KEYS}
        )
    return markdown_table(lines, COLUMNS)


def write_sweep_report(sweep_dir: str | Path, out: str | Path | None = None) -> dict[str, Path]:
    """sweep.md (the table under a line naming the sweep and its shared overrides), sweep.csv (the job rows) and,
    when any job has metrics, sweep.png (every job's curves) in ``out`` (default: ``sweep_dir``)."""
    sweep_dir = Path(sweep_dir)
    out = Path(out) if out is not None else sweep_dir
    shared, rows, jobs = gather(sweep_dir)
    head = f"Sweep {sweep_dir}: {len(rows)} jobs; every job: {' '.join(shared) or '(no shared overrides)'}"
    files = {"table_md": atomic_write_text(out / "sweep.md", f"{head}\n\n{sweep_table(rows)}\n")}
    files["table_csv"] = write_csv(out / "sweep.csv", rows, [*COLUMNS, "overrides", "folder"])
    labels = [f"seed {r['seed']}" if r["seed"] is not None else f"job {r['job']}" for r in rows]
    labels = [label if r["point"] == "(all)" else f"{r['point']}, {label}" for r, label in zip(rows, labels)]
    curves = [(j.metrics_dir, label) for j, label in zip(jobs, labels) if j.metrics_dir]
    if curves:
        files["curves"] = plot_runs([d for d, _ in curves], out / "sweep.png", labels=[label for _, label in curves])
    return files


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="A sweep's table and curves from each job's summary.json and metrics")
    ap.add_argument("sweep_dir", type=Path, help="a multirun's folder (run_dir), or <run_dir>/sweep-<W&B sweep id>")
    ap.add_argument("--out", type=Path, default=None, help="where sweep.md, sweep.csv, sweep.png go (the sweep dir)")
    args = ap.parse_args(argv)
    files = write_sweep_report(args.sweep_dir, args.out)
    print(files["table_md"].read_text().rstrip("\n"))
    print(f"\n[mempo] {', '.join(str(p) for p in files.values())}")


if __name__ == "__main__":
    main()
