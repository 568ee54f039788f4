"""What a run may take over from an earlier one: a finished phase reused (the main job's, a headline's or a study's
warm start, a study's arm-seed) or a killed RL run continued (resume=true). Each is refused when it would now train
something else, naming what differs and the ways out; nothing is reused or continued silently.

What is compared: the phase's saved ``config.yaml`` (a study's arm-seed: its ``study_run.yaml``) against the config it
would run with now, plus its ``provenance``: the fingerprint of the weights it started from (``model.name_or_path``'s,
``mempo.lm.lora.base_fingerprint``), which each training stage records in its config.yaml, so a warm start trained
again in place is another warm start. What never blocks: where and how a phase runs and what it logs
(``IGNORED_CHANGES``), the keys its stage does not read (``STAGE_IGNORED``), on a resume the budget
(``RESUME_IGNORED``: the run trains to the new trainer.max_steps), and the keys the user names in ``accept_changes``
(the switch that says "I know": the phase is reused as it is, and the console says what was accepted). A key the
saved config lacks that the run now holds at its schema default (added to the code since, the old behaviour) and a
key the code no longer has are notes, not changes; so is a saved config without provenance (trained before it was
recorded). Where the saved config has the weights' fingerprint, model.name_or_path itself is not compared: the same
weights in another folder are the same warm start.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from mempo.core.base import atomic_write_text
from mempo.eval.compare import EvalConfig
from mempo.lm.loading import resolve_model_path
from mempo.lm.lora import base_fingerprint
from mempo.stages.plugins import code_provenance

UNSET = "(unset)"  # a key one side of a config comparison does not hold
PROVENANCE = "provenance"  # the saved config's block of what the phase started from (``provenance``)
# Where or how a phase runs and what it logs: never what it trained.
IGNORED_CHANGES = (
    "run_dir", "resume", "overwrite", "verbose", "sweep", "accept_changes", "name", "logger", "host", "ckpt",
    "study", "headline", "demo", "plan",
)  # fmt: skip
# Keys a stage's training does not read (mempo.stages.train: the sft stage builds no sampler, loss or optimizer of
# RL's, runs sft.max_steps and reads of the data group only the world and the objectives; the rl stage reads no sft
# key and of the eval group only in-training validation's cadence).
SFT_UNREAD_DATA = ("batch_size", "group_size", "num_val_tasks", "num_workers", "dynamic_sampling", "redraw_rounds")
STAGE_IGNORED: dict[str, tuple[str, ...]] = {
    "sft": (
        *("optim", "loss", "memory", "advantage", "reward", "sampler", "eval", "trainer.max_steps"),
        *(f"data.{k}" for k in SFT_UNREAD_DATA),
    ),
    "rl": ("sft", *(f"eval.{f.name}" for f in dataclasses.fields(EvalConfig) if f.name != "every_n_steps")),
}
# On a resume also the budget (the run trains to the new trainer.max_steps) and how a step's rows are split into
# micro-batches (accumulation gives the same objective; a rank of the two-process probe runs its own).
RESUME_IGNORED = ("trainer.max_steps", "optim.micro_batch_size")


class ReuseError(ValueError):
    """An earlier run would be reused or continued under another config, or from other weights."""


def flatten(delta: Any, prefix: str = "") -> dict[str, Any]:
    """A nested config or config delta ({memory: {alpha: 1}}) -> dotted keys ({"memory.alpha": 1})."""
    if not isinstance(delta, dict):
        return {prefix[:-1]: delta}
    return {k: v for key, sub in delta.items() for k, v in flatten(sub, f"{prefix}{key}.").items()}


def covered(key: str, prefixes: Sequence[str]) -> bool:
    """Whether dotted ``key`` is one of ``prefixes`` or lies under one (a group, or one key)."""
    return any(key == p or key.startswith(p + ".") for p in prefixes)


def config_diff(
    saved: dict[str, Any], now: dict[str, Any], *, ignored: Sequence[str] = IGNORED_CHANGES
) -> list[tuple[str, Any, Any]]:
    """(dotted key, saved value, value now) for each key whose value in a saved config (``saved_record``) differs
    from ``now`` (``recorded``), ``UNSET`` where one side lacks the key, less the keys under ``ignored``."""
    old, new = flatten(saved), flatten(now)
    keys = [k for k in dict.fromkeys([*new, *old]) if not covered(k, ignored)]
    return [(k, old.get(k, UNSET), new.get(k, UNSET)) for k in keys if old.get(k, UNSET) != new.get(k, UNSET)]


def model_fingerprint(cfg: DictConfig) -> str:
    """The identity of the weights a phase of ``cfg`` starts from (``base_fingerprint`` of model.name_or_path: a hash
    of its config.json and sampled bytes of every tensor; a hub id by its cached snapshot)."""
    try:
        path = resolve_model_path(cfg.model.name_or_path, cache_dir=cfg.model.cache_dir)
    except (FileNotFoundError, ValueError):  # not there (yet): nothing to fingerprint; loading it would fail anyway
        return f"absent:{cfg.model.name_or_path}"
    return base_fingerprint(path)


def provenance(cfg: DictConfig) -> dict[str, Any]:
    """What a phase of ``cfg`` depends on beyond its config's values: {"model": ``model_fingerprint``}, and "code":
    the file and hash of each user's function the config names by import path (``code_provenance``), when any."""
    code = code_provenance(cfg)
    return {"model": model_fingerprint(cfg), **({"code": code} if code else {})}


def recorded(cfg: DictConfig) -> dict[str, Any]:
    """``cfg`` as a training stage saves it in its config.yaml: its keys and its ``provenance``."""
    return {**OmegaConf.to_container(cfg), PROVENANCE: provenance(cfg)}


def write_config(folder: Path, cfg: DictConfig) -> Path:
    """<folder>/config.yaml: ``recorded(cfg)``, what a later reuse or resume compares (``reuse_changes``)."""
    path = Path(folder) / "config.yaml"
    atomic_write_text(path, OmegaConf.to_yaml(recorded(cfg)))  # a rank checking it meanwhile reads old or new
    return path


def saved_record(folder: Path, names: Sequence[str] = ("config.yaml",)) -> dict[str, Any] | None:
    """The first of ``names`` in ``folder`` as a plain dict, with the provenance the phase's own config.yaml recorded
    (a study's study_run.yaml holds the keys, the run's config.yaml its provenance); None when none exists."""
    files = [Path(folder) / n for n in names]
    saved = next((f for f in files if f.is_file()), None)
    if saved is None:
        return None
    out = OmegaConf.to_container(OmegaConf.load(saved))
    own = Path(folder) / "config.yaml"
    if PROVENANCE not in out and saved != own and own.is_file():
        block = OmegaConf.to_container(OmegaConf.load(own)).get(PROVENANCE)
        if block is not None:
            out[PROVENANCE] = block
    return out


def _schema_default(key: str) -> Any:
    from mempo.stages.config import schema

    v = OmegaConf.select(schema(), key, default=UNSET)
    return OmegaConf.to_container(v) if isinstance(v, (DictConfig, ListConfig)) else v


def reuse_changes(
    saved: dict[str, Any], cfg: DictConfig, *, stage: str, resume: bool = False
) -> tuple[list[str], list[str]]:
    """What a phase of ``stage`` saved as ``saved`` (``saved_record``) was trained with that ``cfg`` would change ->
    (changes, notes), each ``key (old -> new)``. A change refuses the reuse or resume; a note does not: a key the
    saved config lacks that ``cfg`` holds at its schema default, a key only the saved config holds, a saved config
    without provenance, and each change of a key in ``cfg.accept_changes`` ("accepting ...")."""
    ignored = (*IGNORED_CHANGES, *STAGE_IGNORED.get(stage, ()), *(RESUME_IGNORED if resume else ()))
    if "model" in (saved.get(PROVENANCE) or {}):  # the weights' fingerprint stands for their folder's path
        ignored = (*ignored, "model.name_or_path")
    accepted = list(cfg.get("accept_changes") or [])
    changes, notes = [], []
    for key, old, new in config_diff(saved, recorded(cfg), ignored=ignored):
        if covered(key, accepted):
            notes.append(f"accepting {key} ({old} -> {new})")
        elif key.startswith(PROVENANCE + ".model") and old == UNSET:
            notes.append(f"{key} not recorded (trained before mempo recorded it): not compared")
        elif old == UNSET and new == _schema_default(key):
            notes.append(f"{key} (added since, at its default {new})")
        elif new == UNSET:
            notes.append(f"{key} (no longer a key; it was {old})")
        else:
            changes.append(f"{key} ({old} -> {new})")
    return changes, notes


def refusal(what: str, folder: Path, changes: list[str], *, stage: str, resume: bool = False) -> ReuseError:
    """The error that refuses a reuse (or, ``resume``, a continuation) of the phase in ``folder``: what differs and
    every way out."""
    keys = ",".join(c.split(" (", 1)[0] for c in changes)
    verb, verbs = ("continued", "continues") if resume else ("reused", "reuses")
    ways = ["overwrite=true trains it again"]
    if stage == "rl" and not resume:
        ways.append("resume=true continues it (for a longer budget)")
    ways.append(f"accept_changes=[{keys}] {verbs} it as it is")
    return ReuseError(
        f"{what}: {folder} holds a run trained with another config: {'; '.join(changes)}. It is not {verb} "
        f"silently: {', '.join(ways)}, or give the run a new run_dir."
    )


def check_reuse(what: str, folder: Path, cfg: DictConfig, *, stage: str, resume: bool = False,
                names: Sequence[str] = ("config.yaml",)) -> list[str]:  # fmt: skip
    """Refuse (``refusal``) to reuse or continue the phase in ``folder`` under ``cfg`` when ``reuse_changes`` finds a
    change -> its notes. A folder without a saved config is refused too: nothing says what it trained."""
    saved = saved_record(folder, names)
    if saved is None:
        raise ReuseError(
            f"{what}: {folder} holds a run but none of {', '.join(names)}, so what it trained cannot be compared "
            "with this config; overwrite=true trains it again, or give the run a new run_dir"
        )
    changes, notes = reuse_changes(saved, cfg, stage=stage, resume=resume)
    if changes:
        raise refusal(what, folder, changes, stage=stage, resume=resume)
    return notes
