"""A reward with partial credit for the right kind of entity (``reward.kind=examples/entity_reward.py:entity_reward``).

Per objective: 1 for an exact match with a gold alias, 0.25 for a wrong answer of the gold's kind (a year for a
year, a one-word place for a place, a two-word name for a person or an organisation), else 0; the mean over the
task's objectives. mempo applies the format gate (a malformed rollout gets 0 whatever this returns).

    python experiments/run.py +exp=grpo_cpu reward.kind=examples/entity_reward.py:entity_reward
"""

from __future__ import annotations

from collections.abc import Sequence

from mempo.rollout.rewards import exact_match, split_answers

PARTIAL = 0.25


def entity_kind(text: str) -> str:
    """ "year" (digits), "place" (one word), "name" (several words: a person or an organisation), "" for nothing."""
    words = text.split()
    if not words:
        return ""
    if text.strip().isdigit():
        return "year"
    return "place" if len(words) == 1 else "name"


def entity_reward(answer: str | None, gold_answers: Sequence[Sequence[str]]) -> float:
    """Mean over objectives of 1 (exact match), ``PARTIAL`` (wrong, but the gold's kind of entity) or 0."""
    parts = split_answers(answer, len(gold_answers))
    credit = []
    for part, golds in zip(parts, gold_answers):
        if exact_match(part, golds):
            credit.append(1.0)
        else:
            kind = entity_kind(part)
            credit.append(PARTIAL if kind and kind == entity_kind(golds[0]) else 0.0)
    return sum(credit) / len(credit)
