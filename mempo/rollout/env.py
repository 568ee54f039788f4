"""The search environment: a ``<search>`` query in, ``<information>`` with top-k passages out (docs/algorithm.md §1).

Shapes: ``search(queries: [Q] str) -> [Q] str``, one retriever call for the whole batch.

Each answer reads like Search-R1's, with the passages numbered and each body cut to a token budget::

    <information>Doc 1 (Title: Velorin Oskatu) Velorin Oskatu is a ...
    Doc 2 (Title: ...) ...</information>

A query with no passages (blank, or no term in common with the corpus) gets ``no_results_text`` inside the same
tag: a defined tool result the policy can learn from, never an exception. The agent loop decides the whitespace
around the block; these tokens are environment-inserted and never carry loss (docs/algorithm.md §3).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from mempo.core.base import one_of, require
from mempo.core.format import TAG_NAME, wrap
from mempo.core.plugins import is_import_path, registered_names
from mempo.rollout.retrievers import (
    RETRIEVERS,
    BM25Retriever,
    HTTPRetriever,
    Passage,
    Retriever,
    RetrieverError,
    load_corpus,
    make_retriever,
)

__all__ = [
    "RETRIEVERS",
    "EnvConfig",
    "BM25Retriever",
    "HTTPRetriever",
    "Passage",
    "Retriever",
    "RetrieverError",
    "SearchEnv",
    "TextTokenizer",
    "load_corpus",
    "make_retriever",
    "truncate_tokens",
    "truncate_words",
]

NO_RESULTS_TEXT = "No results found."
RENDERS = ("mempo", "search_r1")


@dataclass(frozen=True)
class EnvConfig:
    """Config group ``env``: the search environment over a retriever (a name in ``RETRIEVERS``, or an import path of
    a factory ``Factory(corpus=PATH)`` -> an object with ``retrieve(queries, topk)``: ``mempo.stages.plugins``).

    corpus: JSONL {"id", "contents"} for bm25; null = the synthetic world's corpus.
    url: the http retriever's endpoint, e.g. http://127.0.0.1:8000/retrieve (required for http).
    topk: passages per search. max_passage_tokens: each passage body cut to this many tokens; null = whole
    passages (Search-R1 and MEM1 cut none). max_obs_tokens: the whole <information> body cut to this many tokens
    (Search-R1's max_obs_length); null = no cap. render: mempo ("Doc 1 (Title: T) body", one line per passage) |
    search_r1 (Search-R1's "Doc 1(Title: \"T\") text" with the title's quotes and the body's newlines, for
    policies trained there). The synthetic defaults (topk 2, 64-token bodies) are tuned to its short passages;
    env=http sets Search-R1's (topk 3, whole passages, 500-token observations).
    timeout_s / max_retries / backoff_s: a failed http POST is retried, then reported; max_queries_per_post: a
    turn's queries are sent in POSTs of at most this many (one timeout and one retry cover one chunk);
    wait_s: at start, wait this long for the http server to answer (0 = not at all).
    """

    retriever: str = "bm25"
    corpus: str | None = None
    url: str | None = None
    topk: int = 2
    max_passage_tokens: int | None = 64
    max_obs_tokens: int | None = None
    render: str = "mempo"
    timeout_s: float = 10.0
    max_retries: int = 3
    backoff_s: float = 0.5
    max_queries_per_post: int = 64
    wait_s: float = 0.0

    def __post_init__(self) -> None:
        require(
            "env",
            self,
            [
                ("retriever", self.retriever in RETRIEVERS or is_import_path(self.retriever), RETRIEVER_CHOICE),
                ("url", self.retriever != "http" or bool(self.url), "is required when env.retriever=http"),
                ("topk", self.topk >= 1, "must be >= 1"),
                ("max_passage_tokens", self.max_passage_tokens is None or self.max_passage_tokens >= 1, _NULL_OR_1),
                ("max_obs_tokens", self.max_obs_tokens is None or self.max_obs_tokens >= 1, _NULL_OR_1),
                ("render", self.render in RENDERS, one_of(RENDERS)),
                ("max_queries_per_post", self.max_queries_per_post >= 1, "must be >= 1"),
                ("wait_s", self.wait_s >= 0, "must be >= 0"),
                ("timeout_s", self.timeout_s > 0, "must be > 0"),
                ("max_retries", self.max_retries >= 0, "must be >= 0"),
                ("backoff_s", self.backoff_s >= 0, "must be >= 0"),
            ],
        )


_NULL_OR_1 = "must be null or >= 1"
RETRIEVER_CHOICE = one_of(registered_names(RETRIEVERS)) + " nor an import path (module:Factory)"
_WORD = re.compile(r"\S+")
_NEWLINES = re.compile(r"\s*\n\s*")


class TextTokenizer(Protocol):
    """The part of a Hugging Face tokenizer the environment uses."""

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, token_ids: list[int], skip_special_tokens: bool = ...) -> str: ...


def truncate_words(text: str, max_words: int) -> str:
    """The first ``max_words`` whitespace-separated words of ``text``, original spacing kept; text itself if shorter."""
    for n, m in enumerate(_WORD.finditer(text), start=1):
        if n == max_words:
            return text[: m.end()]
    return text


def truncate_tokens(text: str, tokenizer: TextTokenizer, max_tokens: int) -> str:
    """The decoded first ``max_tokens`` tokens of ``text`` (no special tokens); text itself if it fits."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) <= max_tokens:
        return text
    # A cut inside a multi-byte character decodes to U+FFFD; drop that fragment rather than show it.
    return tokenizer.decode(ids[:max_tokens], skip_special_tokens=True).rstrip("\ufffd")


class SearchEnv:
    """Answers search queries with the top-k passages of a retriever.

    topk: passages per query. max_passage_tokens: budget of each passage's body (title kept whole; None = whole
    passages); max_obs_tokens: budget of the whole block's body (None = no cap); both counted in ``tokenizer``
    tokens when one is given, else in whitespace words. render: mempo | search_r1 (``EnvConfig``).
    information_tag: the tag around each answer (Tags.information of the turn format).
    """

    def __init__(
        self,
        retriever: Retriever,
        tokenizer: TextTokenizer | None = None,
        *,
        topk: int = 3,
        max_passage_tokens: int | None = 128,
        information_tag: str = "information",
        no_results_text: str = NO_RESULTS_TEXT,
        max_obs_tokens: int | None = None,
        render: str = "mempo",
    ):
        if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
            raise ValueError(f"env.topk must be an int >= 1, got {topk!r}")
        for key, cap in (("max_passage_tokens", max_passage_tokens), ("max_obs_tokens", max_obs_tokens)):
            if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
                raise ValueError(f"env.{key} must be an int >= 1 or None, got {cap!r}")
        if render not in RENDERS:
            raise ValueError(f"env.render must be one of {RENDERS}, got {render!r}")
        if not TAG_NAME.fullmatch(information_tag):
            raise ValueError(f"env.information_tag: {information_tag!r} is not a valid tag name")
        self.retriever = retriever
        self.tokenizer = tokenizer
        self.topk = topk
        self.max_passage_tokens = max_passage_tokens
        self.max_obs_tokens = max_obs_tokens
        self.render_mode = render
        self.information_tag = information_tag
        self.no_results_text = no_results_text

    def search(self, queries: Sequence[str]) -> list[str]:
        """queries: [Q] -> [Q] tool results, each ``<information>...</information>``."""
        if isinstance(queries, str):
            raise TypeError("search() takes a sequence of queries, got a single string")
        queries = list(queries)
        if not queries:
            return []
        results = self.retriever.retrieve(queries, self.topk)
        if len(results) != len(queries):
            raise RetrieverError(
                f"{type(self.retriever).__name__} returned {len(results)} result lists for {len(queries)} queries"
            )
        return [wrap(self.information_tag, self.observation(passages[: self.topk])) for passages in results]

    def observation(self, passages: Sequence[Passage]) -> str:
        """[K] passages -> the block's body: rendered, then cut to max_obs_tokens."""
        text = self.render(passages)
        return text if self.max_obs_tokens is None else self._cut(text, self.max_obs_tokens)

    def render(self, passages: Sequence[Passage]) -> str:
        """[K] passages -> ``Doc 1 (Title: T) body`` lines, bodies truncated (render=search_r1: Search-R1's
        ``Doc 1(Title: <first line>) <the other lines>`` + newline each); the no-results text when K = 0."""
        if not passages:
            return self.no_results_text
        if self.render_mode == "search_r1":
            parts = [p.contents.split("\n") for p in passages]
            return "".join(
                f"Doc {i}(Title: {lines[0]}) {self.truncate(chr(10).join(lines[1:]))}\n"
                for i, lines in enumerate(parts, start=1)
            )
        lines = []
        for i, p in enumerate(passages, start=1):
            # One line per passage, so "Doc i" always starts a line.
            body = _NEWLINES.sub(" ", self.truncate(p.text))
            lines.append(f"Doc {i} (Title: {p.title}) {body}" if p.title else f"Doc {i} {body}")
        return "\n".join(lines)

    def truncate(self, text: str) -> str:
        """``text`` cut to max_passage_tokens (tokenizer tokens, else whitespace words); whole when None."""
        return text if self.max_passage_tokens is None else self._cut(text, self.max_passage_tokens)

    def _cut(self, text: str, budget: int) -> str:
        if self.tokenizer is None:
            return truncate_words(text, budget)
        return truncate_tokens(text, self.tokenizer, budget)
