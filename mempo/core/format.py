"""The turn format of a memory agent (docs/algorithm.md §1): tag names, the canonical writer and the parser.

A well-formed turn is ``<mem>M</mem> <think>T</think>`` followed by exactly one of ``<search>Q</search>`` or
``<answer>A</answer>``. Tag names are configurable (some readers of the paper report ``<tool_call>``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

TAG_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*$")  # what a tag name may be (Tags, SearchEnv)


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
            if not TAG_NAME.match(name):
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


# --- parsing (docs/algorithm.md §1.2, validate_format) ----------------------------------------------------------------

_ACTIONS = ("search", "answer")


@dataclass(frozen=True)
class ParsedTurn:
    """The verdict on one model turn and what it says.

    ok:       the turn is well formed (docs/algorithm.md §1); a malformed turn ends its rollout as a format failure.
    error:    None when ok, else one human-readable message naming the first problem and its char position.
    memory, think, argument: block bodies with surrounding whitespace stripped (inner whitespace kept).
    action:   "search" or "answer" (the kind, not the tag name), or None.
    mem_span: (start, end) char span of ``<mem>...</mem>`` *including* the tags; mem_inner_span: between them.
              Both index the text given to :func:`parse_turn`, so token offsets of that text map onto them.

    On a malformed turn the fields hold what could still be recovered (the first complete, tag-free block of
    each kind, wherever it sits) for analysis and logging only; the agent must not act on them.
    """

    ok: bool
    error: str | None = None
    memory: str | None = None
    think: str | None = None
    action: str | None = None
    argument: str | None = None
    mem_span: tuple[int, int] | None = None
    mem_inner_span: tuple[int, int] | None = None


@dataclass(frozen=True)
class _Tag:
    start: int
    end: int
    closing: bool
    kind: str  # "mem", "think", "search", "answer" or "information" (the Tags field, not the tag name)
    raw: str  # as written, e.g. "</MEM>"


@dataclass(frozen=True)
class _Block:
    kind: str
    start_tag: _Tag
    end_tag: _Tag

    @property
    def span(self) -> tuple[int, int]:
        return (self.start_tag.start, self.end_tag.end)

    @property
    def inner(self) -> tuple[int, int]:
        return (self.start_tag.end, self.end_tag.start)


def _scan_tags(text: str, tags: Tags) -> list[_Tag]:
    """Every occurrence of one of our tags, in any letter case (other case is then reported, not ignored)."""
    kind_of = {name.lower(): kind for kind, name in _kinds(tags).items()}
    pattern = re.compile(
        "<(/?)(" + "|".join(re.escape(n) for n in sorted(kind_of, key=len, reverse=True)) + ")>", re.IGNORECASE
    )
    return [
        _Tag(m.start(), m.end(), m.group(1) == "/", kind_of[m.group(2).lower()], m.group(0))
        for m in pattern.finditer(text)
    ]


def _kinds(tags: Tags) -> dict[str, str]:
    return {
        "mem": tags.mem,
        "think": tags.think,
        "search": tags.search,
        "answer": tags.answer,
        "information": tags.information,
    }


def _snippet(s: str, limit: int = 30) -> str:
    return repr(s if len(s) <= limit else s[:limit] + "...")


def _structure(text: str, tags: Tags, found: list[_Tag]) -> tuple[str | None, list[_Block]]:
    """Left-to-right check of the grammar ``ws <mem>B</mem> ws <think>B</think> ws <action>B</action> ws``.

    Returns the first error (or None) and the blocks closed before it.
    """
    names = _kinds(tags)
    allowed = {0: ("mem",), 1: ("think",), 2: _ACTIONS}  # stage = number of blocks closed so far
    stage = 0
    blocks: list[_Block] = []
    open_tag: _Tag | None = None
    prev_end = 0

    def tag(kind: str, closing: bool = False) -> str:
        return f"<{'/' if closing else ''}{names[kind]}>"

    def gap_error(gap_start: int, gap_end: int) -> str | None:
        gap = text[gap_start:gap_end]
        if not gap.strip():
            return None
        at = gap_start + (len(gap) - len(gap.lstrip()))
        if stage == 3:
            return f"text after the action at char {at}: {_snippet(gap.strip())}"
        where = "before " + tag("mem") if stage == 0 else "after " + tag(blocks[-1].kind, closing=True)
        return f"text outside tags at char {at} ({where}): {_snippet(gap.strip())}"

    if not found:
        return (
            f"no tags: expected {tag('mem')}...{tag('mem', True)} {tag('think')}...{tag('think', True)} "
            f"then {tag('search')} or {tag('answer')}"
        ), blocks
    for t in found:
        if open_tag is None and (err := gap_error(prev_end, t.start)):
            return err, blocks
        if t.raw[2 if t.closing else 1 : -1] != names[t.kind]:
            return f"tag {t.raw} at char {t.start} is in the wrong case (expected {tag(t.kind, t.closing)})", blocks
        if open_tag is not None:
            if t.closing and t.kind == open_tag.kind:
                block = _Block(t.kind, open_tag, t)
                body = text[open_tag.end : t.start].strip()
                if not body and t.kind != "think":  # empty <think> is allowed: it carries no action
                    return f"empty {tag(t.kind)} block at char {open_tag.start}", blocks
                blocks.append(block)
                stage += 1
                open_tag = None
            else:
                problem = "mismatched" if t.closing else "nested"
                inside = f"inside {open_tag.raw} opened at char {open_tag.start}"
                return f"{problem} {t.raw} at char {t.start} {inside}", blocks
        elif t.closing:
            return f"unmatched {t.raw} at char {t.start} (no open {tag(t.kind)})", blocks
        else:
            first = next((b for b in blocks if b.kind == t.kind), None)
            action = next((b for b in blocks if b.kind in _ACTIONS), None)
            if first is not None:
                return f"duplicated {t.raw} tag at char {t.start} (first at char {first.start_tag.start})", blocks
            if t.kind in _ACTIONS and action is not None:
                return (
                    f"second action {t.raw} at char {t.start} after {action.start_tag.raw} at char "
                    f"{action.start_tag.start}: exactly one action is allowed"
                ), blocks
            if t.kind == "information":
                return f"{t.raw} at char {t.start}: the environment writes it, not the model", blocks
            if stage == 3:
                return f"text after the action at char {t.start}: {t.raw}", blocks
            if stage == 1 and t.kind in _ACTIONS:
                return f"missing {tag('think')} before {t.raw} at char {t.start}", blocks
            if t.kind not in allowed[stage]:
                want = tag("mem") if stage == 0 else tag("think") if stage == 1 else "an action"
                return f"{t.raw} at char {t.start} is out of order (expected {want})", blocks
            open_tag = t
        prev_end = t.end

    if open_tag is not None:
        return f"unclosed {open_tag.raw} opened at char {open_tag.start}", blocks
    if err := gap_error(prev_end, len(text)):
        return err, blocks
    # stage 0 cannot end here: with tags present, a turn that closes no block has already failed above
    if stage == 1:
        return f"missing {tag('think')} block after {tag('mem', True)}", blocks
    if stage == 2:
        return f"missing action: expected {tag('search')} or {tag('answer')} after {tag('think', True)}", blocks
    return None, blocks


def _salvage(text: str, tags: Tags, found: list[_Tag]) -> list[_Block]:
    """The first complete ``<x>body</x>`` of each kind (exact case, no tag of ours inside), in text order."""
    names = _kinds(tags)
    blocks: dict[str, _Block] = {}
    for a, b in zip(found, found[1:]):
        exact = a.raw == f"<{names[a.kind]}>" and b.raw == f"</{names[b.kind]}>"
        if exact and a.kind == b.kind and a.kind not in blocks:
            blocks[a.kind] = _Block(a.kind, a, b)
    return sorted(blocks.values(), key=lambda blk: blk.start_tag.start)


def parse_turn(text: str, tags: Tags = Tags(), *, max_chars: int | None = None) -> ParsedTurn:
    """Parse and validate one model turn (docs/algorithm.md §1, validate_format). Never raises on a ``str``.

    Well formed: optional whitespace, a non-empty ``<mem>`` block, a ``<think>`` block (may be empty), exactly one
    non-empty ``<search>`` or ``<answer>`` block, optional whitespace; only whitespace between blocks; no nested,
    duplicated, unmatched, unclosed or reordered tags; no tag of ours in another letter case (``<MEM>`` is an
    error, not text: a model that writes it has not learned the format); no ``<information>`` (the environment
    writes that); ``len(text) <= max_chars`` when given ("runaway length", reported before any other error). Char
    positions in errors are 0-based indices into ``text``. Other angle-bracket text (``a < b``, ``<b>``) is plain
    text.
    """
    found = _scan_tags(text, tags)
    error, blocks = _structure(text, tags, found)
    ok_blocks = blocks if error is None else _salvage(text, tags, found)
    if max_chars is not None and len(text) > max_chars:
        error = f"runaway length: {len(text)} chars > max_chars={max_chars}"
    by_kind = {b.kind: b for b in ok_blocks}
    mem = by_kind.get("mem")
    think = by_kind.get("think")
    act = next((b for b in ok_blocks if b.kind in _ACTIONS), None)

    def body(b: _Block | None) -> str | None:
        return None if b is None else text[b.inner[0] : b.inner[1]].strip()

    return ParsedTurn(
        ok=error is None,
        error=error,
        memory=body(mem),
        think=body(think),
        action=None if act is None else act.kind,
        argument=body(act),
        mem_span=None if mem is None else mem.span,
        mem_inner_span=None if mem is None else mem.inner,
    )


def validate_format(text: str, tags: Tags = Tags(), *, max_chars: int | None = None) -> tuple[bool, str | None]:
    """``(ok, error)`` of :func:`parse_turn` (the name docs/algorithm.md §1 uses)."""
    parsed = parse_turn(text, tags, max_chars=max_chars)
    return parsed.ok, parsed.error
