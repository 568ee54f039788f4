"""A study's ledger (``study.ledger``): what each checkpoint's evaluation found, and each run's small training
outputs, kept in a folder that outlives the run folders, so a study spread over several machines or sessions whose
run folders (checkpoints, the warm start's weights) are lost on the way goes on where it stopped.

With a ledger the study evaluates each arm-seed as soon as it has trained, then writes ``<ledger>/<label>/``:

    eval.json.gz   its evaluation (``GridResult``: rows, one record per rollout, failure tallies) with the study
                   config it ran under and the fingerprint of the weights it evaluated (``base_fingerprint``)
    study_run.yaml, config.yaml, metrics.csv, memory_credit.jsonl.gz, summary.json
                   copies of the run folder's (an arm-seed's: its config and provenance, which hold the fingerprint of
                   the warm start it started from; its training curves and memory credit records)

A later study with the same ledger trains and evaluates only what the ledger lacks. An arm-seed is taken from the
ledger only when ``mempo.stages.reuse.check_reuse`` passes on its copies (the config it would train now, from the
same warm start: a warm start trained again to other weights refuses it), a warm start's results only when its
weights now have the fingerprint the ledger recorded, and every entry only when the study's evaluation config is the
one it ran under; otherwise a ``ReuseError`` names what differs. The warm starts themselves are trained again where
their folders are gone (the same recipe and seed on the same kind of CPU gives the same weights; the fingerprint
check says when it did not). Commit the ledger (a few MB a study) or copy it between machines.
"""

from __future__ import annotations

import gzip
import json
import shutil
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from mempo.core.base import temp_sibling
from mempo.eval.compare import GRID_FIELDS, GridResult
from mempo.stages.reuse import IGNORED_CHANGES, ReuseError, config_diff

EVAL_FILE = "eval.json.gz"
# The run folder's files an entry keeps: what it trained (config, provenance) and what it logged; never weights.
RUN_CONFIG = "study_run.yaml"  # an arm-seed's full config, as the study wrote it (``mempo.stages.study.launch``)
RUN_FILES = (RUN_CONFIG, "config.yaml", "metrics.csv", "memory_credit.jsonl", "summary.json")
# The study config's keys an entry's evaluation does not depend on, beyond where and how a phase runs.
EVAL_IGNORED = (*IGNORED_CHANGES, "eval.checkpoints", "model.name_or_path")


def eval_config(cfg: DictConfig) -> dict[str, Any]:
    """The study config an entry's evaluation ran under, as a plain dict (the keys ``EVAL_IGNORED`` left in; they
    are skipped when compared)."""
    return json.loads(json.dumps(OmegaConf.to_container(cfg, resolve=True), default=str))


def read_entry(ledger: Path, label: str) -> dict[str, Any] | None:
    """The ledger's entry for checkpoint ``label`` (its eval.json.gz), or None when it has none; a file that does
    not read is a ValueError naming it (nothing is taken from a damaged ledger silently)."""
    path = Path(ledger) / label / EVAL_FILE
    if not path.is_file():
        return None
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            entry = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"study.ledger: {path} does not read as gzip'd JSON ({e}); remove the folder "
                         f"{path.parent} to evaluate {label} again") from e  # fmt: skip
    missing = [k for k in ("label", "config", "weights", "result") if k not in entry]
    if missing or entry["label"] != label:
        raise ValueError(f"study.ledger: {path} is not {label}'s entry (keys missing: {missing or 'none'}; label "
                         f"{entry.get('label')!r})")  # fmt: skip
    return entry


def entry_result(label: str, entry: dict[str, Any], cfg: DictConfig, *, weights: str | None = None) -> GridResult:
    """An entry's evaluation as a ``GridResult``, once it is known to answer this study: the evaluation config it ran
    under is ``cfg``'s (but for ``EVAL_IGNORED``) and, where ``weights`` is given (a warm start, whose folder is here),
    it evaluated weights of that fingerprint; else a ``ReuseError`` naming what differs."""
    where = Path(cfg.study.ledger) / label
    changes = [f"{k} ({old} -> {new})" for k, old, new in config_diff(entry["config"], eval_config(cfg),
                                                                        ignored=EVAL_IGNORED)]  # fmt: skip
    if changes:
        raise ReuseError(
            f"study.ledger: {where} holds {label}'s evaluation under another config: {'; '.join(changes)}. It is not "
            f"reused silently: run the study with that config, remove {where} to evaluate {label} again, or give "
            "the study another study.ledger"
        )
    if weights is not None and weights != entry["weights"]:
        raise ReuseError(
            f"study.ledger: {where} holds the evaluation of {label} with weights {entry['weights']}, but {label} now "
            f"has weights {weights} (trained again to other weights: another CPU kind, or another code?); every "
            "arm-seed in the ledger started from the old ones. Train the study on the machine kind the ledger was "
            "made on, or give the study another study.ledger"
        )
    return GridResult(*(entry["result"].get(f, []) for f in GRID_FIELDS))


def write_entry(ledger: Path, label: str, cfg: DictConfig, *, weights: str, result: GridResult,
                run_folder: Path | None) -> Path:  # fmt: skip
    """``<ledger>/<label>/``: the evaluation of ``label`` (``result``, only its own entries) with ``cfg`` (the
    study's) and the evaluated weights' fingerprint, atomically, and copies of ``run_folder``'s ``RUN_FILES``. An
    entry that already holds this evaluation (the same weights, config and results: a study run again that kept the
    checkpoint's earlier results) is left as it is, so its time of writing stays the evaluation's."""
    folder = Path(ledger) / label
    own = result.only({label})
    entry = {"label": label, "weights": weights, "config": eval_config(cfg),
             "result": json.loads(json.dumps({f: getattr(own, f) for f in GRID_FIELDS}, default=str))}  # fmt: skip
    try:
        old = read_entry(ledger, label)
    except ValueError:  # a damaged entry is written anew
        old = None
    if old is not None and {k: old.get(k) for k in entry} == entry:
        return folder / EVAL_FILE
    folder.mkdir(parents=True, exist_ok=True)
    for name in RUN_FILES:
        source = Path(run_folder or folder) / name
        if run_folder is None or not source.is_file():
            continue
        if name.endswith(".jsonl"):  # a run's records (MBs): gzip'd (``read_jsonl`` reads either)
            tmp = temp_sibling(folder / f"{name}.gz")
            with source.open("rb") as f, gzip.open(tmp, "wb") as g:
                shutil.copyfileobj(f, g)
            tmp.replace(folder / f"{name}.gz")
        else:
            shutil.copyfile(source, folder / name)
    entry = {"label": label, "weights": weights, "written": time.strftime("%Y-%m-%d %H:%M:%S")} | entry
    path = folder / EVAL_FILE
    tmp = temp_sibling(path)
    with gzip.open(tmp, "wt", encoding="utf-8") as f:
        json.dump(entry, f, default=str)
    tmp.replace(path)
    return path


def merged(parts: list[GridResult], order: list[str]) -> GridResult:
    """One ``GridResult`` of ``parts`` (each a checkpoint's or an evaluation's), every list in ``order``'s order of
    checkpoints (stable: a checkpoint's entries keep theirs)."""
    out = GridResult([], [], [])
    for part in parts:
        for f in GRID_FIELDS:
            getattr(out, f).extend(getattr(part, f))
    for f in GRID_FIELDS:
        getattr(out, f).sort(key=lambda x: order.index(x["checkpoint"]))
    return out
