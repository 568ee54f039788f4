"""Answer scoring and the trajectory reward R^T (docs/algorithm.md §2).

EM and F1 follow the SQuAD / Search-R1 convention: answers are normalized (lowercase, punctuation and the
articles a/an/the removed, whitespace collapsed) and scored against every gold alias, keeping the best. A task
with N objectives is answered in one ``<answer>`` whose parts are separated by ``;`` (``ANSWER_SEPARATOR``).

Departures from plain SQuAD scoring, both for multi-objective answers only (N > 1):
- a part may start with the question's own numbering ``(k)`` (``Task.question`` numbers its lines that way);
  the marker is dropped before scoring, so "(1) Paris; (2) Rome" scores like "Paris; Rome".
- with N == 1 the whole answer is the one part (a single answer may itself contain ";").
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mempo.core.base import one_of, require
from mempo.core.plugins import is_import_path, registered_names
from mempo.core.tasks import ANSWER_SEPARATOR

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)
_NUMBERING = re.compile(r"^\(\d+\)\s*")


def normalize_answer(s: str) -> str:
    """SQuAD normalization: lowercase, drop ASCII punctuation, drop articles, collapse whitespace."""
    return " ".join(_ARTICLES.sub(" ", s.lower().translate(_PUNCTUATION)).split())


def _aliases(golds: Sequence[str] | str) -> Sequence[str]:
    # a bare string is one alias, not a sequence of one-letter aliases
    return (golds,) if isinstance(golds, str) else golds


def exact_match(pred: str, golds: Sequence[str] | str) -> float:
    """1.0 if the normalized prediction equals any normalized gold alias, else 0.0 (0.0 for no aliases)."""
    target = normalize_answer(pred)
    return float(any(target == normalize_answer(g) for g in _aliases(golds)))


def _token_f1(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    if not pred_tokens or not gold_tokens:
        return float(pred_tokens == gold_tokens)
    same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1_score(pred: str, golds: Sequence[str] | str) -> float:
    """Token F1 between normalized prediction and gold, the best over gold aliases (0.0 for no aliases).

    Two empty normalizations score 1.0, one empty against a non-empty one 0.0 (SQuAD v2).
    """
    pred_tokens = normalize_answer(pred).split()
    return max((_token_f1(pred_tokens, normalize_answer(g).split()) for g in _aliases(golds)), default=0.0)


def split_answers(text: str | None, n: int) -> list[str]:
    """The answer text -> its n parts, stripped.

    Split on ``;``; missing parts are ``""`` (they score 0 against a non-empty gold); parts beyond n are ignored
    (an extra guess is neither rewarded nor punished: the reward only asks whether the n objectives are answered).
    None (no answer given) gives n empty parts. With n == 1 the whole text is the part (see the module docstring).
    """
    if n < 1:
        raise ValueError(f"split_answers: n must be >= 1, got {n}")
    if text is None:
        return [""] * n
    if n == 1:
        return [text.strip()]
    parts = [_NUMBERING.sub("", p.strip()) for p in text.split(ANSWER_SEPARATOR.strip())][:n]
    return parts + [""] * (n - len(parts))


def objective_scores(pred: str | None, gold_answers: Sequence[Sequence[str]]) -> list[tuple[float, float]]:
    """The answer text and ``Task.gold_answers`` (N alias tuples) -> N (em, f1) pairs, one per objective."""
    if not gold_answers:
        raise ValueError("objective_scores: gold_answers is empty (a task has at least one objective)")
    parts = split_answers(pred, len(gold_answers))
    return [(exact_match(p, golds), f1_score(p, golds)) for p, golds in zip(parts, gold_answers)]


def _all_em(scores: list[tuple[float, float]]) -> float:
    return float(all(em == 1.0 for em, _ in scores))


def _mean_em(scores: list[tuple[float, float]]) -> float:
    return sum(em for em, _ in scores) / len(scores)


def _mean_f1(scores: list[tuple[float, float]]) -> float:
    return sum(f1 for _, f1 in scores) / len(scores)


RewardFn = Callable[[str | None, Sequence[Sequence[str]]], float]
"""A reward: (the rollout's final answer, None when it gave none; the gold aliases of each objective, in order) ->
a float, the reward before the format gate (``trajectory_reward`` gives 0.0 to a malformed rollout whatever it
returns). Called on the CPU, once per rollout, in the process that rolls out (every rank under DDP)."""


def _of_scores(score: Callable[[list[tuple[float, float]]], float]) -> RewardFn:
    """A reward from a function of the per-objective (EM, F1) scores (``objective_scores``)."""

    def reward(answer: str | None, gold_answers: Sequence[Sequence[str]]) -> float:
        return score(objective_scores(answer, gold_answers))

    return reward


REWARD_KINDS: dict[str, RewardFn] = {
    "all_em": _of_scores(_all_em),  # default (docs/algorithm.md §2): 1 iff every objective is an exact match
    "mean_em": _of_scores(_mean_em),
    "mean_f1": _of_scores(_mean_f1),
}


@dataclass(frozen=True)
class RewardConfig:
    """Config group ``reward``: kind, a key of ``REWARD_KINDS`` (each gated by the format) or an import path of a
    ``RewardFn`` (``module:name``, ``file.py:name``; ``mempo.stages.plugins`` checks and registers it)."""

    kind: str = "all_em"

    def __post_init__(self) -> None:
        known = self.kind in REWARD_KINDS or is_import_path(self.kind)
        require(
            "reward",
            self,
            [("kind", known, one_of(registered_names(REWARD_KINDS)) + " nor an import path (module:name)")],
        )


def trajectory_reward(
    pred: str | None, gold_answers: Sequence[Sequence[str]], *, format_ok: bool, kind: str = "all_em"
) -> float:
    """R^T of one rollout (docs/algorithm.md §2): the ``kind`` score of its final answer times the format gate.

    pred: the ``<answer>`` argument, or None when the rollout gave none (max turns, format failure).
    format_ok: every turn of the rollout was well formed; False gives 0.0 whatever the answer.
    kind: a key of ``REWARD_KINDS`` (config ``reward.kind``; an import path once ``mempo.stages.plugins`` registered
    it).
    """
    if kind not in REWARD_KINDS:
        raise ValueError(f"reward.kind: unknown {kind!r}; known kinds are {registered_names(REWARD_KINDS)}")
    if not format_ok:
        return 0.0
    return float(REWARD_KINDS[kind](pred, gold_answers))
