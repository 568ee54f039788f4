"""Rollout fixtures: a reference for token offsets computed from bytes, independent of any decode call."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest


def _gpt2_byte_decoder() -> dict[str, int]:
    """The GPT-2 byte-level alphabet (printable stand-in char -> byte) that SmolLM2's vocabulary is written in."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: b for b in printable}
    for extra, b in enumerate(b for b in range(256) if b not in chars):
        chars[b] = 256 + extra
    return {chr(c): b for b, c in chars.items()}


Reference = Callable[[Sequence[int]], tuple[str, list[tuple[int, int]]]]


@pytest.fixture(scope="session")
def reference_offsets(smollm2_tokenizer) -> Reference:
    """ids -> (text, offsets) from each token's bytes: a token's range is every char any of its bytes is part of.

    Special tokens contribute no bytes (an empty range). Only for ids whose bytes form valid UTF-8.
    """
    tok = smollm2_tokenizer
    byte_of = _gpt2_byte_decoder()
    special = set(tok.all_special_ids) | set(tok.added_tokens_decoder)

    def reference(ids: Sequence[int]) -> tuple[str, list[tuple[int, int]]]:
        pieces = [b"" if i in special else bytes(byte_of[c] for c in tok.convert_ids_to_tokens(int(i))) for i in ids]
        data = b"".join(pieces)
        text = data.decode("utf-8")  # strict: the reference is only defined on valid UTF-8
        char_at = [ci for ci, ch in enumerate(text) for _ in ch.encode("utf-8")] + [len(text)]
        offsets, pos = [], 0
        for piece in pieces:
            start = char_at[pos]
            end = char_at[pos + len(piece) - 1] + 1 if piece else start
            offsets.append((start, end))
            pos += len(piece)
        return text, offsets

    return reference
