"""MEM1's evaluation rules, to report numbers on its scale beside mempo's.

mempo scores a task as the *mean* over its N objectives of SQuAD-normalised EM / token-multiset F1, padding a short
answer and ignoring extra parts (``mempo.rollout.rewards``). MEM1's ``inference/eval.py`` (``compute_score``)
instead:
- splits the answer on ";" and scores the whole task 0 when the number of parts is not N;
- normalises by lowercasing, turning every ASCII punctuation character into a space and collapsing whitespace
  (articles are kept: "the Beatles" does not match "Beatles");
- scores F1 on token *sets*, max over aliases;
- *sums* over objectives (a task scores 0..N), then averages over tasks.
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence

_PUNCT = str.maketrans({c: " " for c in string.punctuation})
_SPACES = re.compile(r"\s+")


def mem1_normalize(text: str) -> str:
    """Lowercase, punctuation -> space, whitespace collapsed (MEM1's ``preprocess_text``)."""
    return _SPACES.sub(" ", text.lower().translate(_PUNCT)).strip()


def _set_f1(pred: str, gold: str) -> float:
    p, g = set(pred.split()), set(gold.split())
    common = len(p & g)
    if not p or not g or not common:
        return 0.0
    precision, recall = common / len(p), common / len(g)
    return 2 * precision * recall / (precision + recall)


def mem1_scores(answer: str | None, gold_answers: Sequence[Sequence[str]]) -> tuple[float, float]:
    """(EM, F1) of one task under MEM1's rules: sums over the N objectives, 0 when the answer has not N parts."""
    if answer is None:
        return 0.0, 0.0
    parts = [mem1_normalize(a) for a in answer.split(";")]
    if len(parts) != len(gold_answers):
        return 0.0, 0.0
    em = f1 = 0.0
    for part, aliases in zip(parts, gold_answers):
        golds = [mem1_normalize(g) for g in aliases]
        em += float(part in golds)
        f1 += max((_set_f1(part, g) for g in golds), default=0.0)
    return em, f1
