"""Run folders: one per run, sweeps included, and no run written over another without being asked.

Where a run writes (``run_dir`` after ``experiments/run.py``, which sets it to Hydra's output folder of the job):

    a single run                 run_dir                                          hydra.run.dir
    a job of a Hydra multirun    <hydra.sweep.dir>/<hydra.sweep.subdir>           run_dir/<job number> by default
    a run of a W&B sweep agent   <run_dir>/sweep-<WANDB_SWEEP_ID>/<WANDB_RUN_ID>  hydra.run.dir (``wandb_job_dir``)

so every job's outputs, Hydra's ``.hydra/`` and its log lie in one folder, and ``summary.json`` records the sweep,
the job and its overrides (``hydra_job``; ``mempo.eval.sweep`` gathers a sweep from them).

A training stage (rl, sft) claims its folder before it writes anything (``claim_run_dir``): a folder that holds an
earlier run's checkpoint, metrics, policy or summary is refused unless ``resume=true`` continues that run (rl) or
``overwrite=true`` replaces it. A composed stage (demo, headline) reuses each phase it finished (``finished``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from mempo.core.console import say

WANDB_RESOLVER = "mempo.wandb_job_dir"  # config.yaml: hydra.run.dir: ${mempo.wandb_job_dir:${run_dir}}
# What marks a folder as holding a training run: the checkpoint (a file, or under FSDP a symlink to a step-<k>
# folder), the metrics, the exported policy, the summary.
RUN_MARKERS = ("checkpoints/last.ckpt", "metrics.csv", "hf", "summary.json")
# What overwrite=true deletes: every output of a training stage (other files in the folder are left alone).
TRAINING_OUTPUTS = (
    "checkpoints", "metrics.csv", "memory_credit.jsonl", "curves.png", "hf", "hf_adapter", "hf_steps",
    "summary.json", "lightning_logs",
)  # fmt: skip


class RunDirError(FileExistsError):
    """A training stage was pointed at a folder that holds another run."""


def wandb_job(environ: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """(sweep id, run id) when a W&B sweep agent started this process (it sets both variables), else None."""
    env = os.environ if environ is None else environ
    sweep, run = env.get("WANDB_SWEEP_ID"), env.get("WANDB_RUN_ID")
    return (sweep, run) if sweep and run else None


def wandb_job_dir(run_dir: str, environ: Mapping[str, str] | None = None) -> str:
    """The resolver of config.yaml's ``hydra.run.dir``: ``run_dir``, or under a W&B sweep agent
    ``<run_dir>/sweep-<sweep id>/<run id>`` (agents on one machine, and every point of the sweep, apart)."""
    job = wandb_job(environ)
    return run_dir if job is None else str(Path(run_dir) / f"sweep-{job[0]}" / job[1])


def register_resolver() -> None:
    """Register ``wandb_job_dir`` as ``${mempo.wandb_job_dir:...}`` (idempotent; mempo.stages.config calls it)."""
    if not OmegaConf.has_resolver(WANDB_RESOLVER):
        OmegaConf.register_new_resolver(WANDB_RESOLVER, lambda run_dir: wandb_job_dir(str(run_dir)))


def hydra_job(hydra: DictConfig, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The keys ``experiments/run.py`` sets on the composed config from Hydra's config of the running job
    (``HydraConfig.get()``): ``run_dir`` (the job's folder, as the module docstring's table says) and ``sweep``
    (``mempo.stages.config.SweepConfig``: kind, dir, job, overrides)."""
    from hydra.types import RunMode

    overrides = [str(o) for o in hydra.overrides.task]
    if hydra.mode == RunMode.MULTIRUN:
        run_dir = str(Path(str(hydra.sweep.dir)) / str(hydra.sweep.subdir))
        sweep = {"kind": "hydra", "dir": str(hydra.sweep.dir), "job": str(hydra.job.num)}
    else:
        run_dir, job = str(hydra.run.dir), wandb_job(environ)
        sweep = {"kind": None, "dir": None, "job": None}
        if job is not None:
            sweep = {"kind": "wandb", "dir": str(Path(run_dir).parent), "job": job[1]}
    return {"run_dir": run_dir, "sweep": {**sweep, "overrides": overrides}}


def run_record(cfg: DictConfig) -> dict[str, Any]:
    """What every stage's summary.json says about the run itself: its seed and its place in a sweep."""
    return {"seed": cfg.seed, "sweep": OmegaConf.to_container(cfg.sweep)}


def held_outputs(folder: Path) -> list[str]:
    """The ``RUN_MARKERS`` in ``folder``. A symlink counts whether or not its target exists (an FSDP last.ckpt
    points at a step folder; a dangling one is still another run's)."""
    return [m for m in RUN_MARKERS if (folder / m).is_symlink() or (folder / m).exists()]


def finished(folder: Path) -> bool:
    """Whether a training phase in ``folder`` finished: its policy was exported (``hf/config.json``)."""
    return (folder / "hf" / "config.json").is_file()


def claim_run_dir(folder: Path, *, stage: str, resume: bool, overwrite: bool, remove: bool = True) -> str:
    """Make ``folder`` the training stage ``stage``'s -> "new" (nothing of another run in it), "resume" (rl with
    resume=true: continue the run there) or "overwrite" (overwrite=true: its training outputs deleted, when
    ``remove``: rank zero only, the other ranks just go ahead). Otherwise raises ``RunDirError`` naming the folder,
    what it holds and both ways out."""
    folder = Path(folder)
    held = held_outputs(folder)
    if not held:
        return "new"
    if overwrite:
        if remove:
            gone = [name for name in TRAINING_OUTPUTS if _remove(folder / name)]
            say(f"[mempo] {stage}: overwrite=true: removed {', '.join(gone)} of the earlier run in {folder}")
        return "overwrite"
    if resume and stage == "rl":
        return "resume"
    ways = (
        "resume=true continues it from its checkpoint, overwrite=true replaces it"
        if stage == "rl"
        else "overwrite=true replaces it (the warm start keeps no checkpoint for resume=true to continue)"
    )
    raise RunDirError(
        f"run_dir {folder} already holds a run ({', '.join(held)}); {ways}, or choose another run_dir. "
        "In a sweep each job gets its own folder (docs/guide/sweeps.md)."
    )


def _remove(path: Path) -> bool:
    """Delete a file, a symlink (not its target) or a folder -> whether there was one."""
    if path.is_symlink() or path.is_file():
        path.unlink()
        return True
    if path.is_dir():
        shutil.rmtree(path)
        return True
    return False
