"""The base layer: plain helpers that every other layer may import (and that import nothing of mempo).

``require`` is the one way a config group's dataclass checks its values in ``__post_init__``: every range and
choice check of a group lives in that group's dataclass, next to its fields, and names the full config key.
(``mempo.losses`` keeps its own messages: it imports torch only.)
"""

from __future__ import annotations

from collections.abc import Iterable


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
