"""Token masks of char spans: which sampled tokens belong to a turn's ``<mem>...</mem>`` (docs/algorithm.md §3, Eq. 9).

The agent loop never re-tokenizes (docs/algorithm.md §4): it decodes the sampled ids once with
:func:`decode_with_offsets`, parses that text with :func:`mempo.core.format.parse_turn`, and maps the parsed
char span back onto the same ids with :func:`mem_token_mask`. Text and offsets come from one decode, so they
always agree.

Offsets follow the convention of a fast tokenizer's ``offset_mapping``: a token's range is every char any of its
bytes belongs to. Ranges are monotone (starts and ends non-decreasing) and cover the text; they overlap only
where byte-level BPE splits one multi-byte char across tokens (those tokens share that char), and a token that
adds no text (a special token skipped by the decode) has an empty range. A token whose merge straddles a span
boundary (``" <"`` before ``<mem>``, ``"><"`` between ``</mem>`` and ``<think>``) therefore overlaps the span and
counts as inside: it carries memory characters, and leaving it out would drop part of the memory from the
memory advantage. The price is a boundary token that also carries a char or two of its neighbour.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from mempo.core.format import ParsedTurn


class Decoder(Protocol):
    """What :func:`decode_with_offsets` needs of a tokenizer (any ``transformers`` tokenizer has it)."""

    def decode(self, token_ids: list[int], skip_special_tokens: bool = ...) -> str: ...


def _matched(piece: str, text: str, at: int) -> int:
    """Length of the common prefix of ``piece`` and ``text[at:]``."""
    n = 0
    for a, b in zip(piece, text[at : at + len(piece)]):
        if a != b:
            break
        n += 1
    return n


def _boundaries(ids: list[int], text: str, decode, windowed: bool) -> tuple[list[int], list[bool]] | None:
    """committed[i]: chars of ``text`` whose bytes all lie in tokens [0, i); pending[i]: tokens [0, i) end inside
    a char (its first bytes decode to U+FFFD until the rest arrives). Both [L + 1].

    windowed: decode short windows (a clean chunk of context plus the tokens since the last char boundary, as
    streaming detokenizers do): O(L) small decodes. Returns None where the windows disagree with ``text``
    (a decoder that is not compositional); the caller then decodes whole prefixes (windowed=False), which is
    exact for any decoder at O(L) decodes of O(L) tokens.
    """
    size = len(ids)
    committed, pending = [0] * (size + 1), [False] * (size + 1)
    ctx_start, ctx_text = 0, ""  # ctx_text == decode(ids[ctx_start:base])
    base, base_char = 0, 0  # tokens [0, base) decode exactly to text[:base_char]
    for i in range(1, size + 1):
        window = decode(ids[ctx_start:i])
        if not window.startswith(ctx_text):
            return None
        new = window[len(ctx_text) :]  # the text of tokens [base, i), a trailing partial char as U+FFFD
        n = _matched(new, text, base_char)
        if windowed and (len(new) - n > 1 or base_char + n < committed[i - 1]):
            return None  # more than one unmatched char is a disagreement, not a partial char
        committed[i] = max(base_char + n, committed[i - 1])
        pending[i] = len(new) > n
        if windowed and not pending[i]:
            ctx_start, ctx_text = base, new
            base, base_char = i, committed[i]
    if committed[size] != len(text) or pending[size]:
        return None
    return committed, pending


def decode_with_offsets(token_ids: Sequence[int], tokenizer: Decoder) -> tuple[str, list[tuple[int, int]]]:
    """token_ids [L] -> (text, offsets [L] of (start, end) char ranges into text).

    text is ``tokenizer.decode(token_ids, skip_special_tokens=True)``; offsets follow the module docstring's
    convention (monotone, covering, shared chars only where a multi-byte char is split, empty for special tokens).
    """
    ids = [int(t) for t in token_ids]

    def decode(part: list[int]) -> str:
        return tokenizer.decode(part, skip_special_tokens=True)

    text = decode(ids)
    found = _boundaries(ids, text, decode, windowed=True) or _boundaries(ids, text, decode, windowed=False)
    if found is None:  # only a decoder whose full decode is not its last prefix decode gets here
        raise RuntimeError(f"{type(tokenizer).__name__}: decode of all {len(ids)} tokens differs from its prefixes")
    committed, pending = found
    offsets = [(committed[i], committed[i + 1] + int(pending[i + 1])) for i in range(len(ids))]
    for i, (start, end) in enumerate(offsets):
        # inside an unfinished char a byte token and a skipped special token both add no committed text; only the
        # byte token carries part of that char (the special token decodes to nothing on its own)
        if end > start and committed[i] == committed[i + 1] and pending[i] and decode(ids[i : i + 1]) == "":
            offsets[i] = (start, start)
    return text, offsets


def span_token_mask(offsets: Sequence[tuple[int, int]], span: tuple[int, int] | None) -> torch.Tensor:
    """offsets [L] of char ranges, span (start, end) or None -> bool [L].

    True for tokens whose non-empty range overlaps ``[start, end)``; a token straddling a boundary counts as inside
    (it carries span characters). None or an empty span selects nothing.
    """
    if span is not None and not 0 <= span[0] <= span[1]:
        raise ValueError(f"span must be (start, end) with 0 <= start <= end, got {span}")
    if span is None or not offsets:
        return torch.zeros(len(offsets), dtype=torch.bool)
    bounds = torch.tensor(offsets, dtype=torch.long).reshape(-1, 2)  # [L, 2]
    starts, ends = bounds[:, 0], bounds[:, 1]
    return (starts < span[1]) & (ends > span[0]) & (ends > starts)


def mem_token_mask(
    offsets: Sequence[tuple[int, int]], parsed: ParsedTurn, *, include_tags: bool = True
) -> torch.Tensor:
    """offsets [L] (from :func:`decode_with_offsets`), parsed turn of the same text -> mem_mask bool [L].

    The tokens of the ``<mem>...</mem>`` span, tags included by default (docs/algorithm.md §3, Eq. 9: switch
    ``include_tags``), else only the memory body. Uses the parsed span even on a malformed turn (the parser
    recovers the first complete ``<mem>`` block); whether such a turn gets a memory advantage is the caller's call.
    No ``<mem>`` block gives an all-False mask.
    """
    return span_token_mask(offsets, parsed.mem_span if include_tags else parsed.mem_inner_span)
