"""Property tests: parse_turn on generated tag soup and mutated turns; memory masks on real tokenizations."""

from __future__ import annotations

import re

import torch
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from mempo.core.format import ParsedTurn, Tags, format_turn, parse_turn
from mempo.rollout.masks import decode_with_offsets, mem_token_mask

TAG_SETS = [Tags(), Tags(search="tool_call"), Tags(mem="memory", think="reasoning", answer="final")]
KINDS = ("mem", "think", "search", "answer", "information")


def names(tags: Tags) -> list[str]:
    return [getattr(tags, k) for k in KINDS]


def mentions_a_tag(text: str, tags: Tags) -> bool:
    return re.search("</?(" + "|".join(map(re.escape, names(tags))) + ")>", text, re.IGNORECASE) is not None


@st.composite
def case_variant(draw, name: str) -> str:
    flips = draw(st.lists(st.booleans(), min_size=len(name), max_size=len(name)))
    return "".join(c.swapcase() if f else c for c, f in zip(name, flips))


@st.composite
def tag_soup(draw, tags: Tags) -> str:
    """Fragments: our tags (sometimes in another case), near-tags, brackets, whitespace and unicode text."""
    fragment = st.one_of(
        st.sampled_from(names(tags)).flatmap(lambda n: st.sampled_from([f"<{n}>", f"</{n}>"])),
        st.sampled_from(names(tags)).flatmap(case_variant).flatmap(lambda n: st.sampled_from([f"<{n}>", f"</{n}>"])),
        st.sampled_from(["<", ">", "</", "/>", "< mem>", "<mem", "mem>", "<b>", "<|im_end|>", "<<mem>>"]),
        st.sampled_from([" ", "\n", "\t", "\u00a0", "\u2028"]),
        st.text(max_size=12),
    )
    return "".join(draw(st.lists(fragment, max_size=30)))


plain = st.text(max_size=60)  # may hold brackets, unicode, whitespace-only


@st.composite
def mutated_turn(draw, tags: Tags) -> str:
    """A well-formed turn, then zero or more edits: delete/insert/duplicate/swap a piece, change case, truncate."""
    text = format_turn(draw(plain), draw(plain), draw(st.sampled_from(["search", "answer"])), draw(plain), tags)
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(text)))
        end = draw(st.integers(at, len(text)))
        edit = draw(st.sampled_from(["delete", "insert", "duplicate", "swap", "case", "truncate"]))
        if edit == "delete":
            text = text[:at] + text[end:]
        elif edit == "insert":
            text = text[:at] + draw(tag_soup(tags)) + text[at:]
        elif edit == "duplicate":
            text = text[:end] + text[at:end] + text[end:]
        elif edit == "swap":
            text = text[at:end] + text[:at] + text[end:]
        elif edit == "case":
            text = text[:at] + text[at:end].swapcase() + text[end:]
        else:
            text = text[:at]
    return text


def check_verdict(text: str, tags: Tags, max_chars: int | None) -> ParsedTurn:
    p = parse_turn(text, tags, max_chars=max_chars)  # must not raise
    assert isinstance(p, ParsedTurn)
    event("ok" if p.ok else re.sub(r"</?[\w-]+>", "<tag>", p.error.split(" at char")[0].split(":")[0]))
    assert p.ok == (p.error is None)
    assert p.error is None or (isinstance(p.error, str) and p.error)
    if max_chars is not None and len(text) > max_chars:
        assert not p.ok and p.error.startswith("runaway length")
    open_mem, close_mem = f"<{tags.mem}>", f"</{tags.mem}>"
    if p.mem_span is not None:
        piece = text[slice(*p.mem_span)]
        assert piece.startswith(open_mem) and piece.endswith(close_mem)
        assert p.mem_inner_span == (p.mem_span[0] + len(open_mem), p.mem_span[1] - len(close_mem))
        assert p.memory == text[slice(*p.mem_inner_span)].strip()
    if p.ok:
        assert p.memory and p.argument and p.think is not None and p.action in ("search", "answer")
        again = parse_turn(format_turn(p.memory, p.think, p.action, p.argument, tags), tags)
        assert again.ok and (again.memory, again.think, again.action, again.argument) == (
            p.memory,
            p.think,
            p.action,
            p.argument,
        )
        assert not text[: p.mem_span[0]].strip()  # <mem> comes first
    return p


FAST = settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(data=st.data(), max_chars=st.none() | st.integers(0, 400))
def test_tag_soup_never_raises(data, max_chars):
    tags = data.draw(st.sampled_from(TAG_SETS))
    check_verdict(data.draw(tag_soup(tags)), tags, max_chars)


@FAST
@given(data=st.data(), max_chars=st.none() | st.integers(0, 400))
def test_mutated_turns_never_raise(data, max_chars):
    tags = data.draw(st.sampled_from(TAG_SETS))
    check_verdict(data.draw(mutated_turn(tags)), tags, max_chars)


@settings(max_examples=200, deadline=None)
@given(body=st.text(min_size=2000, max_size=6000), tags=st.sampled_from(TAG_SETS))
def test_long_turns(body, tags):
    assume(not mentions_a_tag(body, tags) and body.strip())
    text = format_turn(body, body, "answer", body, tags)
    assert check_verdict(text, tags, None).ok
    assert check_verdict(text, tags, len(text) // 2).error.startswith("runaway length")
    assert not check_verdict(f"<{tags.mem}>" + body, tags, None).ok  # runaway memory that never closes


@FAST
@given(data=st.data())
def test_well_formed_turns_are_ok(data):
    tags = data.draw(st.sampled_from(TAG_SETS))
    memory, think, argument = data.draw(plain), data.draw(plain), data.draw(plain)
    assume(memory.strip() and argument.strip())
    assume(not mentions_a_tag(memory + think + argument, tags))
    action = data.draw(st.sampled_from(["search", "answer"]))
    p = check_verdict(format_turn(memory, think, action, argument, tags), tags, None)
    assert p.ok and (p.memory, p.think, p.action, p.argument) == (
        memory.strip(),
        think.strip(),
        action,
        argument.strip(),
    )


@settings(max_examples=500, deadline=None)
@given(
    memory=st.text(min_size=1, max_size=40),
    think=st.text(max_size=20),
    cuts=st.lists(st.integers(0, 200), max_size=6),
    lead=st.sampled_from(["", " ", "\n"]),
)
def test_mask_selects_tokens_overlapping_memory(smollm2_tokenizer, reference_offsets, memory, think, cuts, lead):
    """On a real tokenization (whole text, or pieces encoded apart at random cuts so merges fall anywhere), the
    mask is exactly the tokens whose bytes touch the memory span, with and without the tags."""
    tok = smollm2_tokenizer
    tags = Tags()
    assume(memory.strip() and not mentions_a_tag(memory + think, tags))
    text_in = lead + format_turn(memory, think, "search", "q")
    bounds = sorted({0, len(text_in), *(c for c in cuts if c < len(text_in))})
    ids = [i for a, b in zip(bounds, bounds[1:]) for i in tok.encode(text_in[a:b])]
    # SmolLM2's GGUF vocabulary lacks a few control bytes (encode drops them) and text may spell a special token
    assume(tok.decode(ids, skip_special_tokens=True) == text_in)
    text, offsets = decode_with_offsets(ids, tok)
    assert text == text_in
    assert offsets == reference_offsets(ids)[1]
    parsed = parse_turn(text)
    assert parsed.ok, parsed.error
    for include_tags, span in ((True, parsed.mem_span), (False, parsed.mem_inner_span)):
        expected = [e > s and s < span[1] and e > span[0] for s, e in offsets]
        torch.testing.assert_close(mem_token_mask(offsets, parsed, include_tags=include_tags), torch.tensor(expected))


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_masks_agree_with_the_text_on_malformed_turns(smollm2_tokenizer, data):
    """Any turn, malformed included, through a real tokenization: the mask is exactly the tokens touching the
    parsed memory span (all False when there is none), and the masked tokens' text covers that span."""
    tok, tags = smollm2_tokenizer, Tags()
    text_in = data.draw(st.one_of(mutated_turn(tags), tag_soup(tags)))
    ids = tok.encode(text_in)
    text, offsets = decode_with_offsets(ids, tok)
    assume(text == text_in)  # control bytes missing from the vocabulary, or text spelling a special token
    parsed = check_verdict(text, tags, None)
    for include_tags, span in ((True, parsed.mem_span), (False, parsed.mem_inner_span)):
        mask = mem_token_mask(offsets, parsed, include_tags=include_tags)
        assert mask.shape == (len(ids),) and mask.dtype == torch.bool
        if span is None:
            assert not mask.any()
            continue
        event("memory span found")
        expected = [e > s and s < span[1] and e > span[0] for s, e in offsets]
        torch.testing.assert_close(mask, torch.tensor(expected, dtype=torch.bool))
        covered = [(s, e) for (s, e), m in zip(offsets, mask.tolist()) if m]
        if span[1] > span[0]:
            assert covered[0][0] <= span[0] and covered[-1][1] >= span[1]
