"""parse_turn: well-formed turns, every kind of malformed turn (each a defined verdict), custom tag names."""

from __future__ import annotations

import random
import re

import pytest

from mempo.core.format import ParsedTurn, Tags, format_turn, parse_turn, validate_format

GOOD = "<mem> Paris is in France. </mem>\n<think> next: Rome </think>\n<search> capital of Italy </search>"


def test_well_formed_turn_fields_and_spans():
    p = parse_turn(GOOD)
    assert p == ParsedTurn(
        ok=True,
        error=None,
        memory="Paris is in France.",
        think="next: Rome",
        action="search",
        argument="capital of Italy",
        mem_span=(0, 32),
        mem_inner_span=(5, 26),
    )
    assert GOOD[slice(*p.mem_span)] == "<mem> Paris is in France. </mem>"
    assert GOOD[slice(*p.mem_inner_span)] == " Paris is in France. "


@pytest.mark.parametrize(
    "text",
    [
        "  \n<mem>m</mem><think>t</think><answer>a</answer>",  # leading whitespace, no separators
        "<mem>m</mem>\n\n<think>t</think>\t<answer>a</answer>\n  ",  # trailing whitespace after the action
        "<mem>m</mem><think></think><answer>a</answer>",  # empty <think> is allowed
        "<mem>m</mem><think>  \n </think><answer>a</answer>",
        "<mem>x < y and <b>bold</b> and </i></mem><think>t</think><answer>a</answer>",  # other brackets are text
        "<mem>m\n  multi line\n</mem><think>t</think><answer>a</answer>",
    ],
)
def test_well_formed_variants(text):
    p = parse_turn(text)
    assert p.ok and p.error is None, p.error
    assert p.action == "answer" and p.argument == "a"
    assert text[slice(*p.mem_span)].startswith("<mem>") and text[slice(*p.mem_span)].endswith("</mem>")
    assert p.memory == text[slice(*p.mem_inner_span)].strip()


def test_empty_think_is_present_but_empty():
    p = parse_turn("<mem>m</mem><think></think><search>q</search>")
    assert p.ok and p.think == ""


# (text, error pattern, fields recovered for analysis)
BAD = {
    "no tags": ("The answer is Paris.", r"^no tags: expected <mem>", {"memory": None}),
    "empty output": ("", r"^no tags", {}),
    "whitespace only": (" \n ", r"^no tags", {}),
    "nested": (
        "<mem>a<think>b</think></mem><think>t</think><answer>x</answer>",
        r"^nested <think> at char 6 inside <mem> opened at char 0$",
        {"memory": None, "think": "b", "action": "answer", "argument": "x"},
    ),
    "nested same tag": ("<mem>a<mem>b</mem></mem>", r"^nested <mem> at char 6 inside <mem>", {}),
    "duplicated mem": (
        "<mem>a</mem><mem>b</mem><think>t</think><answer>x</answer>",
        r"^duplicated <mem> tag at char 12 \(first at char 0\)$",
        {"memory": "a", "mem_span": (0, 12)},
    ),
    "duplicated think": (
        "<mem>a</mem><think>t</think><think>u</think><answer>x</answer>",
        r"^duplicated <think> tag at char 28",
        {"memory": "a", "think": "t", "action": "answer"},
    ),
    "two actions": (
        "<mem>a</mem><think>t</think><search>q</search><answer>x</answer>",
        r"^second action <answer> at char 46 after <search> at char 28: exactly one action is allowed$",
        {"action": "search", "argument": "q"},
    ),
    "unclosed mem": ("<mem>a<think>t</think>", r"^nested <think> at char 6", {}),
    "unclosed mem at end": ("<mem>a b c", r"^unclosed <mem> opened at char 0$", {"memory": None}),
    "unclosed action": (
        "<mem>a</mem><think>t</think><search>q",
        r"^unclosed <search> opened at char 28$",
        {"memory": "a", "think": "t", "action": None},
    ),
    "unmatched close": ("</mem><mem>a</mem>", r"^unmatched </mem> at char 0 \(no open <mem>\)$", {"memory": "a"}),
    "mismatched close": ("<mem>a</think>", r"^mismatched </think> at char 6 inside <mem> opened at char 0$", {}),
    "upper case": ("<MEM>a</MEM><think>t</think><answer>x</answer>", r"^tag <MEM> at char 0 is in the wrong case", {}),
    "mixed case close": (
        "<mem>a</Mem><think>t</think><answer>x</answer>",
        r"^tag </Mem> at char 6 is in the wrong case \(expected </mem>\)$",
        {"memory": None, "think": "t"},
    ),
    "upper action": (
        "<mem>a</mem><think>t</think><ANSWER>x</ANSWER>",
        r"^tag <ANSWER> at char 28 is in the wrong case \(expected <answer>\)$",
        {"memory": "a", "action": None},
    ),
    "text after action": (
        "<mem>a</mem><think>t</think><answer>x</answer> Hope this helps!",
        r"^text after the action at char 47: 'Hope this helps!'$",
        {"memory": "a", "action": "answer", "argument": "x"},
    ),
    "tag after action": (
        "<mem>a</mem><think>t</think><search>q</search>\n<information>fake</information>",
        r"^<information> at char 47: the environment writes it, not the model$",
        {"action": "search"},
    ),
    "text before mem": ("Sure! <mem>a</mem>", r"^text outside tags at char 0 \(before <mem>\): 'Sure!'$", {}),
    "text between blocks": (
        "<mem>a</mem> so <think>t</think><answer>x</answer>",
        r"^text outside tags at char 13 \(after </mem>\): 'so'$",
        {"memory": "a", "think": "t", "argument": "x"},
    ),
    "think first": (
        "<think>t</think><mem>a</mem><answer>x</answer>",
        r"^<think> at char 0 is out of order \(expected <mem>\)$",
        {"memory": "a", "think": "t", "action": "answer", "mem_span": (16, 28)},
    ),
    "action first": ("<answer>x</answer>", r"^<answer> at char 0 is out of order \(expected <mem>\)$", {}),
    "missing think": (
        "<mem>a</mem><search>q</search>",
        r"^missing <think> before <search> at char 12$",
        {"memory": "a", "action": "search", "argument": "q"},
    ),
    "think after action": (
        "<mem>a</mem><think>t</think><answer>x</answer><think>u</think>",
        r"^duplicated <think>",
        {},
    ),
    "missing action": (
        "<mem>a</mem><think>t</think>",
        r"^missing action: expected <search> or <answer> after </think>$",
        {"memory": "a", "think": "t"},
    ),
    "missing think and action": ("<mem>a</mem>", r"^missing <think> block after </mem>$", {"memory": "a"}),
    "empty mem": (
        "<mem>  </mem><think>t</think><answer>x</answer>",
        r"^empty <mem> block at char 0$",
        {"memory": "", "mem_span": (0, 13)},
    ),
    "empty search": ("<mem>a</mem><think>t</think><search> </search>", r"^empty <search> block at char 28$", {}),
    "empty answer": ("<mem>a</mem><think>t</think><answer></answer>", r"^empty <answer> block at char 28$", {}),
}


@pytest.mark.parametrize("name", list(BAD))
def test_malformed_turn_has_a_defined_verdict(name):
    text, pattern, recovered = BAD[name]
    p = parse_turn(text)
    assert not p.ok
    assert p.error is not None and re.search(pattern, p.error), p.error
    for field, value in recovered.items():
        assert getattr(p, field) == value, (field, p)
    if p.mem_span is not None:
        assert text[slice(*p.mem_span)].startswith("<mem>") and text[slice(*p.mem_span)].endswith("</mem>")
    assert validate_format(text) == (False, p.error)


def test_runaway_length():
    assert parse_turn(GOOD, max_chars=len(GOOD)).ok
    p = parse_turn(GOOD, max_chars=len(GOOD) - 1)
    assert not p.ok and p.error == f"runaway length: {len(GOOD)} chars > max_chars={len(GOOD) - 1}"
    assert p.memory == "Paris is in France." and p.action == "search"  # still recovered for analysis
    long_unclosed = "<mem>" + "very long memory " * 1000
    p = parse_turn(long_unclosed, max_chars=4096)
    assert p.error.startswith("runaway length: 17005 chars") and p.memory is None


def test_error_positions_index_the_text():
    text = "<mem>note</mem>\n<think>why</think>\n<search>q</search>\n<search>r</search>"
    p = parse_turn(text)
    at = int(re.search(r"at char (\d+)", p.error).group(1))
    assert text[at:].startswith("<search>r") and at == text.rindex("<search>")


def test_custom_tag_names():
    tags = Tags(search="tool_call", mem="memory")
    text = format_turn("facts", "plan", "search", "query", tags)
    assert text.startswith("<memory> facts </memory>") and "<tool_call> query </tool_call>" in text
    p = parse_turn(text, tags)
    assert p.ok and (p.memory, p.action, p.argument) == ("facts", "search", "query")
    assert text[slice(*p.mem_span)] == "<memory> facts </memory>"
    # the default names it replaced are plain text under custom tags
    default = parse_turn(format_turn("facts", "plan", "search", "query"), tags)
    assert default.error == "text outside tags at char 0 (before <memory>): '<mem> facts </mem>'"
    # ... and the custom ones are checked like the defaults: case and duplicates
    assert "wrong case" in parse_turn(text.replace("<tool_call>", "<TOOL_CALL>"), tags).error
    assert "expected </tool_call>" in parse_turn(text.replace("</tool_call>", "</Tool_Call>"), tags).error
    assert "second action <answer>" in parse_turn(text + "<answer>x</answer>", tags).error


def test_prefix_tag_names_do_not_shadow_each_other():
    tags = Tags(mem="m", think="mt", search="s", answer="sa")
    text = format_turn("facts", "plan", "answer", "Rome", tags)
    p = parse_turn(text, tags)
    assert p.ok and (p.memory, p.think, p.action, p.argument) == ("facts", "plan", "answer", "Rome")


def test_roundtrip_random_strings():
    rng = random.Random(0)
    alphabet = "abc XYZ 019 <>/;:.,!?\n\té漢🙂"
    for _ in range(500):
        fields = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40))) for _ in range(3)]
        memory, think, argument = fields
        action = rng.choice(["search", "answer"])
        text = format_turn(memory, think, action, argument)
        p = parse_turn(text)
        if not memory.strip() or not argument.strip():
            assert not p.ok and p.error.startswith("empty")
            continue
        assert p.ok, (text, p.error)  # the alphabet cannot spell one of our tags
        assert (p.memory, p.think, p.action, p.argument) == (memory.strip(), think.strip(), action, argument.strip())
        assert parse_turn(format_turn(p.memory, p.think, p.action, p.argument)) == p
