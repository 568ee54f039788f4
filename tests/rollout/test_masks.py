"""Token offsets and memory-span masks on the real SmolLM2 tokenizer, including merges across tag boundaries."""

from __future__ import annotations

import pytest
import torch

from mempo.core.format import format_turn, parse_turn
from mempo.rollout.masks import _boundaries, decode_with_offsets, mem_token_mask, span_token_mask

TAIL = "\n<think> t </think>\n<search> q </search>"


def ids_of(tok, *parts: str | int) -> list[int]:
    """Concatenate the encodings of text parts and single vocabulary tokens (given by their token string as an
    int id): a tokenization the tokenizer itself would not choose, so merges can be placed across a boundary."""
    out: list[int] = []
    for part in parts:
        out.extend([part] if isinstance(part, int) else tok.encode(part))
    return out


def token_id(tok, token: str) -> int:
    vocab = tok.get_vocab()
    assert token in vocab, f"{token!r} is not a SmolLM2 token"
    return vocab[token]


def expected_mask(offsets, span) -> torch.Tensor:
    """The definition, token by token: a non-empty range that shares a char with the span."""
    return torch.tensor([e > s and s < span[1] and e > span[0] for s, e in offsets], dtype=torch.bool)


def test_offsets_match_bytes_and_fast_tokenizer(smollm2_tokenizer, reference_offsets):
    tok = smollm2_tokenizer
    text_in = format_turn("Paris é 漢字 🙂 x<y", "so", "answer", "Paris")
    ids = tok.encode(text_in)
    text, offsets = decode_with_offsets(ids, tok)
    assert text == text_in == tok.decode(ids, skip_special_tokens=True)
    assert (text, offsets) == reference_offsets(ids)
    # the tokenizer's own offset_mapping uses the same convention (shared chars where a char is split)
    assert offsets == [tuple(o) for o in tok(text_in, return_offsets_mapping=True)["offset_mapping"]]
    shared = [i for i in range(1, len(offsets)) if offsets[i][0] < offsets[i - 1][1]]
    assert shared and all(len(text[offsets[i][0] : offsets[i - 1][1]]) == 1 for i in shared)
    assert all(ord(text[offsets[i][0]]) > 0x7F for i in shared), "only multi-byte chars are shared"


def test_offsets_monotone_covering_and_special_tokens_empty(smollm2_tokenizer, reference_offsets):
    tok = smollm2_tokenizer
    body = format_turn("a 漢 b", "", "search", "q")
    ids = [tok.convert_tokens_to_ids("<|im_start|>"), *tok.encode(body), tok.eos_token_id]
    text, offsets = decode_with_offsets(ids, tok)
    assert text == body
    assert offsets[0] == (0, 0) and offsets[-1] == (len(text), len(text))
    assert (text, offsets) == reference_offsets(ids)
    starts, ends = zip(*offsets)
    assert list(starts) == sorted(starts) and list(ends) == sorted(ends)
    covered = set().union(*(range(s, e) for s, e in offsets))
    assert covered == set(range(len(text)))


def test_special_token_inside_a_split_char_gets_an_empty_range(smollm2_tokenizer, reference_offsets):
    tok = smollm2_tokenizer
    split = tok.encode("漢")  # three byte tokens
    ids = [*tok.encode("<mem> a"), split[0], tok.eos_token_id, *split[1:], *tok.encode(" </mem>")]
    text, offsets = decode_with_offsets(ids, tok)
    assert text == "<mem> a漢 </mem>" and (text, offsets) == reference_offsets(ids)
    where = text.index("漢")
    assert offsets[ids.index(tok.eos_token_id)] == (where, where)
    assert [offsets[ids.index(t)] for t in split[1:]] == [(where, where + 1)] * 2


def test_empty_and_special_only(smollm2_tokenizer):
    assert decode_with_offsets([], smollm2_tokenizer) == ("", [])
    assert decode_with_offsets([2, 2], smollm2_tokenizer) == ("", [(0, 0), (0, 0)])


@pytest.mark.parametrize(
    "parts, outer, inner",
    [
        # " <" covers the leading space (outside) and the "<" of <mem>
        (("", "Ġ<", "mem> fact </mem>" + TAIL), True, False),
        # "><" covers the ">" of </mem> and the "<" of <think>
        (("<mem> fact </mem", "><", "think> t </think>\n<search> q </search>"), True, False),
        # '>"' covers the ">" of <mem> and the first memory char
        (("<mem", '>"', 'quoted" fact </mem>' + TAIL), True, True),
        # ".<" covers the last memory char and the "<" of </mem>
        (("<mem> fact", ".<", "/mem>" + TAIL), True, True),
        # " </" covers the memory's trailing space and "</"
        (("<mem> fact", "Ġ</", "mem>" + TAIL), True, True),
        # "></" covers the ">" of the body's own "<b>" and the "</" of </mem>
        (("<mem> x <b", "></", "mem>" + TAIL), True, True),
    ],
    ids=["space-lt", "gt-lt", "gt-quote", "dot-lt", "space-close", "gt-close"],
)
def test_mask_with_merge_straddling_a_tag_boundary(smollm2_tokenizer, reference_offsets, parts, outer, inner):
    """outer / inner: whether the straddling token is in the mask with tags / of the body only."""
    tok = smollm2_tokenizer
    before, merged, after = parts
    ids = ids_of(tok, before, token_id(tok, merged), after)
    position = ids.index(token_id(tok, merged))
    text, offsets = decode_with_offsets(ids, tok)
    assert (text, offsets) == reference_offsets(ids)
    parsed = parse_turn(text)
    assert parsed.ok, parsed.error
    span, inner_span = parsed.mem_span, parsed.mem_inner_span
    s, e = offsets[position]
    assert any(s < boundary < e for boundary in (*span, *inner_span)), "the token must straddle a boundary"
    with_tags = mem_token_mask(offsets, parsed)
    body_only = mem_token_mask(offsets, parsed, include_tags=False)
    torch.testing.assert_close(with_tags, expected_mask(offsets, span))
    torch.testing.assert_close(body_only, expected_mask(offsets, inner_span))
    assert bool(with_tags[position]) is outer and bool(body_only[position]) is inner
    # every char of the span is carried by a selected token, and unselected tokens carry none
    selected = set().union(*(range(*offsets[i]) for i in torch.nonzero(with_tags).flatten().tolist()))
    assert set(range(*span)) <= selected
    assert not set().union(*(range(*offsets[i]) for i in torch.nonzero(~with_tags).flatten().tolist())) & set(
        range(*span)
    )


def test_multibyte_memory_split_across_tokens(smollm2_tokenizer, reference_offsets):
    tok = smollm2_tokenizer
    memory = "漢字🙂é"  # CJK and emoji are split into several byte tokens by SmolLM2
    ids = ids_of(tok, "<mem>", memory, "</mem>" + TAIL)
    text, offsets = decode_with_offsets(ids, tok)
    assert (text, offsets) == reference_offsets(ids)
    parsed = parse_turn(text)
    assert parsed.ok and parsed.memory == memory
    mask = mem_token_mask(offsets, parsed, include_tags=False)
    body_ids = tok.encode(memory)
    assert len(body_ids) > len(memory), "the memory must contain split chars for this test to mean anything"
    first = len(tok.encode("<mem>"))
    assert mask.tolist() == [first <= i < first + len(body_ids) for i in range(len(ids))]


def test_span_token_mask_edges():
    offsets = [(0, 3), (3, 3), (3, 6), (6, 9)]
    assert span_token_mask(offsets, None).tolist() == [False] * 4
    assert span_token_mask(offsets, (3, 3)).tolist() == [False] * 4
    assert span_token_mask(offsets, (2, 7)).tolist() == [True, False, True, True]
    assert span_token_mask(offsets, (3, 6)).tolist() == [False, False, True, False]
    assert span_token_mask([], (0, 4)).dtype == torch.bool and span_token_mask([], (0, 4)).shape == (0,)
    with pytest.raises(ValueError, match="span must be"):
        span_token_mask(offsets, (5, 2))


def test_mem_token_mask_without_memory_or_on_salvaged_turn(smollm2_tokenizer):
    tok = smollm2_tokenizer
    no_mem = "<think> t </think>"
    text, offsets = decode_with_offsets(tok.encode(no_mem), tok)
    assert not mem_token_mask(offsets, parse_turn(text)).any()
    salvaged = "<mem> kept </mem>\n<search> q </search>"  # malformed: no <think>
    text, offsets = decode_with_offsets(tok.encode(salvaged), tok)
    parsed = parse_turn(text)
    assert not parsed.ok and parsed.mem_span == (0, len("<mem> kept </mem>"))
    assert mem_token_mask(offsets, parsed).tolist() == expected_mask(offsets, parsed.mem_span).tolist()


class _StripLeadingSpace:
    """A real tokenizer's decode with SentencePiece's habit of dropping a leading space at the start of every
    decode. No SentencePiece model is available offline, so this wrapper stands in for one: it makes short-window
    decoding disagree with the full decode and forces the exact whole-prefix path."""

    def __init__(self, tok) -> None:
        self.tok = tok

    def decode(self, token_ids, skip_special_tokens: bool = False) -> str:
        return self.tok.decode(token_ids, skip_special_tokens=skip_special_tokens).removeprefix(" ")


def test_non_compositional_decoder_falls_back_to_prefixes(smollm2_tokenizer):
    decoder = _StripLeadingSpace(smollm2_tokenizer)
    ids = smollm2_tokenizer.encode(format_turn("one two three", "four", "search", "five six"))

    def dec(part):
        return decoder.decode(part, skip_special_tokens=True)

    text = dec(ids)
    assert _boundaries(ids, text, dec, windowed=True) is None
    text_out, offsets = decode_with_offsets(ids, decoder)
    assert text_out == text
    assert "".join(text[s:e] for s, e in offsets) == text  # ASCII only: ranges tile the text exactly
    parsed = parse_turn(text)
    mask = mem_token_mask(offsets, parsed)
    assert "".join(text[s:e] for (s, e), m in zip(offsets, mask.tolist()) if m) == text[slice(*parsed.mem_span)]


def test_windowed_decode_equals_whole_prefix_decode_on_random_ids(smollm2_tokenizer):
    """Random ids (lone continuation bytes, unfinished chars, special tokens anywhere) exercise every U+FFFD case;
    the O(L) windowed path must agree with the exact whole-prefix path and the result must tile the text."""
    tok = smollm2_tokenizer
    generator = torch.Generator().manual_seed(0)

    def dec(part):
        return tok.decode(part, skip_special_tokens=True)

    for _ in range(5):
        ids = torch.randint(0, len(tok), (512,), generator=generator).tolist()
        text = dec(ids)
        windowed = _boundaries(ids, text, dec, windowed=True)
        assert windowed is not None and windowed == _boundaries(ids, text, dec, windowed=False)
        text_out, offsets = decode_with_offsets(ids, tok)
        assert text_out == text
        starts, ends = zip(*offsets)
        assert list(starts) == sorted(starts) and list(ends) == sorted(ends) and ends[-1] == len(text)
        assert set().union(*(range(s, e) for s, e in offsets)) == set(range(len(text)))
        assert all(s == e for s, e in (offsets[i] for i in range(len(ids)) if ids[i] in tok.all_special_ids))
