"""A retriever that wraps a plain Python search function
(``env.retriever=examples/function_retriever.py:KeywordSearch``).

mempo calls ``KeywordSearch(corpus=PATH)`` once with the corpus the run searches (``env.corpus``, or the synthetic
world's) and then ``retrieve(queries, topk)`` once per turn with every query of the batch; it must return, per query,
a list of at most ``topk`` ``Passage``s, best first ([] for nothing found). Swap ``search`` for a call into your own
index or web API.

    python experiments/run.py +exp=grpo_cpu env.retriever=examples/function_retriever.py:KeywordSearch
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from mempo.rollout.retrievers import Passage, load_corpus

WORD = re.compile(r"\w+")


def search(query: str, passages: Sequence[Passage], k: int) -> list[int]:
    """Indices of the ``k`` passages sharing the most words with ``query`` (ties: corpus order); none share none."""
    words = set(WORD.findall(query.lower()))
    scored = [(len(words & set(WORD.findall(p.contents.lower()))), -i) for i, p in enumerate(passages)]
    best = sorted((s for s in scored if s[0] > 0), reverse=True)[:k]
    return [-i for _, i in best]


class KeywordSearch:
    """``search`` over a JSONL corpus ({"id", "contents"}), as a mempo retriever."""

    def __init__(self, corpus: str) -> None:
        self.passages = load_corpus(corpus)

    def retrieve(self, queries: Sequence[str], topk: int) -> list[list[Passage]]:
        return [[self.passages[i] for i in search(q, self.passages, topk)] for q in queries]
