"""The turn format of a memory agent (mempo.md §1): tag names, the canonical writer and the parser.

A well-formed turn is ``<mem>M</mem> <think>T</think>`` followed by exactly one of ``<search>Q</search>`` or
``<answer>A</answer>``. Tag names are configurable (some readers of the paper report ``<tool_call>``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_TAG_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*$")


@dataclass(frozen=True)
class Tags:
    """Tag names of the turn format (config group ``tags``)."""

    mem: str = "mem"
    think: str = "think"
    search: str = "search"
    answer: str = "answer"
    information: str = "information"

    def __post_init__(self) -> None:
        names = [self.mem, self.think, self.search, self.answer, self.information]
        for key, name in zip(("mem", "think", "search", "answer", "information"), names):
            if not _TAG_NAME.match(name):
                raise ValueError(f"tags.{key}: {name!r} is not a valid tag name")
        if len({n.lower() for n in names}) != len(names):
            raise ValueError(f"tags: names must be distinct (case-insensitively), got {names}")

    @property
    def actions(self) -> dict[str, str]:
        """Action kind -> tag name."""
        return {"search": self.search, "answer": self.answer}

    def stop_strings(self) -> tuple[str, ...]:
        """Generation stops at the action's closing tag (kept in the sampled tokens)."""
        return (f"</{self.search}>", f"</{self.answer}>")


def wrap(tag: str, body: str) -> str:
    return f"<{tag}>{body}</{tag}>"


def format_turn(memory: str, think: str, action: str, argument: str, tags: Tags = Tags()) -> str:
    """The canonical text of one well-formed turn (used by the oracle and the tests).

    action: "search" or "answer".
    """
    if action not in tags.actions:
        raise ValueError(f"action must be one of {sorted(tags.actions)}, got {action!r}")
    return "\n".join(
        [
            wrap(tags.mem, f" {memory.strip()} "),
            wrap(tags.think, f" {think.strip()} "),
            wrap(tags.actions[action], f" {argument.strip()} "),
        ]
    )
