"""The base layer: plain helpers that every other layer may import (and that import nothing of mempo).

``temp_sibling`` is the one temporary-name convention of every atomic write (a file or a folder is written beside
its destination, then renamed into place, so a reader never sees half of it); ``atomic_write_text``,
``write_json`` and ``write_csv`` use it. ``require`` is the one way a config group's dataclass checks its values in
``__post_init__``: every range and choice check of a group lives in that group's dataclass, next to its fields,
and names the full config key. (``mempo.losses`` keeps its own messages: it imports torch only.)
"""

from __future__ import annotations

import csv
import gzip
import json
import os
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def temp_sibling(path: Path) -> Path:
    """``.<name>.tmp<pid>`` beside ``path``: what an atomic write writes before it renames into place."""
    return path.with_name(f".{path.name}.tmp{os.getpid()}")


def atomic_write_text(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` so that a reader sees the old file or the whole new one (parents created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_sibling(path)
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


def write_json(path: Path, data: Any) -> Path:
    """``data`` as indented JSON (non-JSON values by ``str``), atomically."""
    return atomic_write_text(path, json.dumps(data, indent=2, default=str))


def write_csv(path: Path, rows: Iterable[dict[str, Any]], columns: list[str]) -> Path:
    """``rows`` as CSV with ``columns`` (keys not in it are left out), atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_sibling(path)
    with tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp, path)
    return path


def read_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) of every non-blank line of a JSONL file (gzip'd where its name ends in .gz), read as it
    streams; a line that is not a JSON object raises a ValueError naming the file and the line."""
    path = Path(path)
    with gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg} at column {e.colno})") from e
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            yield lineno, row


@contextmanager
def timed(timings: dict[str, float], name: str) -> Iterator[None]:
    """``timings[name]`` = the wall seconds the block took."""
    start = time.perf_counter()
    try:
        yield
    finally:
        timings[name] = time.perf_counter() - start


def wandb_mode(mode: str | None) -> str:
    """``logger.mode``, or when null: online with an API key (WANDB_API_KEY), else $WANDB_MODE or offline (W&B
    raises without a key unless a mode is set; an offline run is synced later with ``wandb sync``)."""
    if mode is not None:
        return mode
    return "online" if os.environ.get("WANDB_API_KEY") else os.environ.get("WANDB_MODE", "offline")


def require(group: str, obj: object, checks: Iterable[tuple[str, bool, str]]) -> None:
    """Raise ValueError("config key {group}.{key}={value!r} {why}") for the first (key, ok, why) that is not ok
    (``group`` "" for a top-level key)."""
    prefix = f"{group}." if group else ""
    for key, ok, why in checks:
        if not ok:
            raise ValueError(f"config key {prefix}{key}={getattr(obj, key)!r} {why}")


def one_of(choices: Iterable[str]) -> str:
    """The reason text of a choice check."""
    return f"is not one of {list(choices)}"
