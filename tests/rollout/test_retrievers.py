"""Retriever backends: a real bm25s index over a corpus written here, and a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from mempo.rollout.retrieval_server import RetrievalServer
from mempo.rollout.retrievers import (
    BM25Retriever,
    HTTPRetriever,
    Passage,
    RetrieverError,
    load_corpus,
    make_retriever,
    top_k_stable,
)

CORPUS = [
    {
        "id": "velorin",
        "contents": '"Velorin Oskatu"\nVelorin Oskatu is a cartographer born in the harbour town of Quessel.',
    },
    {
        "id": "quessel",
        "contents": '"Quessel"\nQuessel is a harbour town on the Brenmark coast, known for salt marshes.',
    },
    {"id": "lighthouse", "contents": '"Brenmark Lighthouse"\nThe Brenmark Lighthouse was designed by Amsel Doveritch.'},
    {"id": "amsel", "contents": '"Amsel Doveritch"\nAmsel Doveritch was an engineer who studied in Tarvona.'},
    {"id": "tarvona", "contents": '"Tarvona"\nTarvona is the capital of the Lusk Republic.'},
    {"id": "paris", "contents": '"Paris"\nParis is the capital of France.'},
]


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture
def corpus_path(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "corpus.jsonl", CORPUS)


@pytest.fixture
def bm25(corpus_path: Path) -> BM25Retriever:
    return BM25Retriever.from_corpus(corpus_path)


# ---------------------------------------------------------------------------------------------------------------
# Passage and load_corpus


def test_passage_title_and_text_follow_search_r1_convention():
    p = Passage("1", '"Velorin Oskatu"\nborn in Quessel.\nSecond line.')
    assert (p.title, p.text) == ("Velorin Oskatu", "born in Quessel.\nSecond line.")
    assert Passage("2", "Plain title\nbody").title == "Plain title"
    assert (Passage("3", "no newline at all").title, Passage("3", "no newline at all").text) == (
        "",
        "no newline at all",
    )


def test_load_corpus_reads_ids_and_contents(tmp_path: Path):
    path = tmp_path / "c.jsonl"
    path.write_text('{"id": 7, "contents": "T\\nx", "extra": 1}\n\n{"id": "b", "contents": "U\\ny"}\n')
    assert load_corpus(path) == [Passage("7", "T\nx"), Passage("b", "U\ny")]


@pytest.mark.parametrize(
    "bad_line, message",
    [
        ('{"id": "x", "contents": "T\\nx"', "not valid JSON"),
        ('["x", "T"]', "expected a JSON object"),
        ('{"id": "x"}', "missing key 'contents'"),
        ('{"contents": "T\\nx"}', "missing key 'id'"),
        ('{"id": ["x"], "contents": "T\\nx"}', "key 'id' must be a string or an int"),
        ('{"id": true, "contents": "T\\nx"}', "key 'id' must be a string or an int"),
        ('{"id": "x", "contents": 3}', "key 'contents' must be a string"),
        ('{"id": "a", "contents": "dup"}', "duplicate id 'a' (first seen on line 1)"),
    ],
)
def test_load_corpus_names_file_and_line_of_bad_input(tmp_path: Path, bad_line: str, message: str):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "a", "contents": "A\\na"}\n\n' + bad_line + "\n")
    with pytest.raises(ValueError, match="bad.jsonl:3: ") as info:
        load_corpus(path)
    assert message in str(info.value)


def test_load_corpus_rejects_empty_corpus(tmp_path: Path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n  \n")
    with pytest.raises(ValueError, match="empty.jsonl: the corpus is empty"):
        load_corpus(path)


# ---------------------------------------------------------------------------------------------------------------
# bm25


@pytest.mark.parametrize(
    "query, expected",
    [
        ("Velorin Oskatu", "velorin"),
        ("where was Velorin Oskatu born?", "velorin"),
        ("who designed the Brenmark Lighthouse", "lighthouse"),
        ("capital of the Lusk Republic", "tarvona"),
        ("Amsel Doveritch", "amsel"),
    ],
)
def test_bm25_top1_for_entity_queries(bm25: BM25Retriever, query: str, expected: str):
    [hits] = bm25.retrieve([query], topk=3)
    assert hits[0].id == expected
    assert hits[0].contents == next(r["contents"] for r in CORPUS if r["id"] == expected)


def test_bm25_respects_topk_and_orders_by_score(bm25: BM25Retriever):
    query = "harbour town capital Brenmark"  # shares a term with 5 of the 6 passages
    for topk in (1, 2, 3):
        [hits] = bm25.retrieve([query], topk)
        assert len(hits) == topk
    [hits] = bm25.retrieve([query], topk=50)  # more than the corpus holds: every matching passage, no error
    assert {h.id for h in hits} == {"velorin", "quessel", "lighthouse", "tarvona", "paris"}
    scores = [h.score for h in hits]
    assert all(s > 0 for s in scores) and scores == sorted(scores, reverse=True)


def test_top_k_stable_orders_by_score_then_index():
    scores = np.array([1.0, 3.0, 3.0, 2.0, 3.0, 0.0], dtype=np.float32)
    assert top_k_stable(scores, 3).tolist() == [1, 2, 4]
    assert top_k_stable(scores, 4).tolist() == [1, 2, 4, 3]
    assert top_k_stable(scores, 2).tolist() == [1, 2]  # three tie for first: the two earliest
    assert top_k_stable(scores, 9).tolist() == [1, 2, 4, 3, 0, 5]
    assert top_k_stable(scores, 0).tolist() == []


def test_bm25_breaks_ties_by_corpus_order():
    # 300 equal passages between unrelated ones: every one scores the same for "orsk". bm25s's own top-k orders ties
    # by numpy's sort, which differs between AVX512 and AVX2 machines (seen: this test failed with it on AVX512).
    passages = [
        Passage(f"p{i}", "Orsk\nOrsk harbour" if i % 3 else f"Filler {i}\nunrelated text {i}") for i in range(450)
    ]
    tied = [p.id for p in passages if p.contents.startswith("Orsk")]
    [hits] = BM25Retriever(passages).retrieve(["Orsk"], topk=20)
    assert [h.id for h in hits] == tied[:20]
    assert len({h.score for h in hits}) == 1


def test_bm25_blank_stopword_and_unmatched_queries_return_nothing(bm25: BM25Retriever):
    results = bm25.retrieve(["", "   ", "the of and", "zyzzyva quarkonium", "Tarvona"], topk=3)
    assert results[:4] == [[], [], [], []]
    assert results[4][0].id == "tarvona"
    assert bm25.retrieve([], topk=3) == []


def test_bm25_only_returns_passages_sharing_a_term(bm25: BM25Retriever):
    [hits] = bm25.retrieve(["Lusk"], topk=3)
    assert [h.id for h in hits] == ["tarvona"]


def test_bm25_batch_keeps_query_order(bm25: BM25Retriever):
    queries = ["Paris", "Amsel Doveritch", "Quessel salt marshes"]
    batch = bm25.retrieve(queries, topk=2)
    assert [hits[0].id for hits in batch] == ["paris", "amsel", "quessel"]
    assert batch == [bm25.retrieve([q], topk=2)[0] for q in queries]


@pytest.mark.parametrize("topk", [0, -1, 1.5, True])
def test_bm25_rejects_bad_topk(bm25: BM25Retriever, topk):
    with pytest.raises(ValueError, match="topk must be an int >= 1"):
        bm25.retrieve(["Paris"], topk)


def test_bm25_from_passages_without_a_file():
    retriever = BM25Retriever([Passage("a", "Alpha\nzorbel"), Passage("b", "Beta\nquint")])
    assert retriever.retrieve(["quint"], 1)[0][0].id == "b"
    with pytest.raises(ValueError, match="at least one passage"):
        BM25Retriever([])


def test_bm25_index_cache_is_built_once_and_keyed_by_corpus(tmp_path: Path, corpus_path: Path):
    cache = tmp_path / "cache"
    first = BM25Retriever.from_corpus(corpus_path, cache_dir=cache)
    assert not first.loaded_from_cache
    assert len(list(cache.iterdir())) == 1
    second = BM25Retriever.from_corpus(corpus_path, cache_dir=cache)
    assert second.loaded_from_cache
    queries = ["Velorin Oskatu", "capital", "Brenmark Lighthouse designer"]
    assert second.retrieve(queries, 3) == first.retrieve(queries, 3)

    # An edited corpus gets its own index: the new passage is found, the old index is untouched.
    write_jsonl(corpus_path, CORPUS + [{"id": "new", "contents": "Zorbel\nZorbel Quint founded Quessel."}])
    third = BM25Retriever.from_corpus(corpus_path, cache_dir=cache)
    assert not third.loaded_from_cache
    assert third.retrieve(["Zorbel Quint"], 1)[0][0].id == "new"
    assert len(list(cache.iterdir())) == 2


def test_make_retriever_registry(corpus_path: Path):
    assert isinstance(make_retriever("bm25", path=corpus_path), BM25Retriever)
    assert isinstance(make_retriever("http", url="http://127.0.0.1:1/retrieve"), HTTPRetriever)
    with pytest.raises(ValueError, match=r"unknown retriever kind 'dense'; known: \['bm25', 'http'\]"):
        make_retriever("dense")


# ---------------------------------------------------------------------------------------------------------------
# http: the real server


@pytest.fixture
def server(bm25: BM25Retriever):
    with RetrievalServer(bm25) as srv:
        yield srv


def test_http_matches_bm25_through_the_real_server(server: RetrievalServer, bm25: BM25Retriever):
    assert server.url.startswith("http://127.0.0.1:") and server.url.endswith("/retrieve")
    queries = ["Velorin Oskatu", "capital", "zyzzyva", "  ", "Brenmark"]
    client = HTTPRetriever(server.url, timeout_s=2.0)
    assert client.retrieve(queries, topk=2) == bm25.retrieve(queries, topk=2)

    unscored = HTTPRetriever(server.url, return_scores=False).retrieve(queries, topk=2)
    assert unscored == [[Passage(p.id, p.contents) for p in hits] for hits in bm25.retrieve(queries, topk=2)]


def post(url: str, payload, method: str = "POST") -> tuple[int, dict]:
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=2) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        with e:
            return e.code, json.loads(e.read())


def test_server_protocol_defaults_and_bad_requests(server: RetrievalServer):
    status, body = post(server.url, {"queries": ["Paris"]})  # Search-R1 defaults: server topk, no scores
    assert status == 200 and body == {"result": [[{"id": "paris", "contents": CORPUS[5]["contents"]}]]}
    status, body = post(server.url, {"queries": ["capital"], "topk": 1, "return_scores": True})
    assert status == 200 and body["result"][0][0]["score"] > 0 and len(body["result"][0]) == 1
    for bad, key in [
        ({"queries": "Paris"}, "queries"),
        ({"queries": ["x"], "topk": 0}, "topk"),
        ({"queries": ["x"], "return_scores": "yes"}, "return_scores"),
        ([1], "JSON object"),
    ]:
        status, body = post(server.url, bad)
        assert status == 400 and key in body["error"]
    assert post(server.url.replace("/retrieve", "/search"), {"queries": []})[0] == 404
    assert post(server.url, None, method="GET")[0] == 405


def test_server_cli_serves_a_corpus(tmp_path: Path, corpus_path: Path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "mempo.rollout.retrieval_server", "--corpus", str(corpus_path), "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        # Retries cover the server's start-up (imports take ~1 s here, longer on a loaded machine).
        client = HTTPRetriever(
            f"http://127.0.0.1:{port}/retrieve", timeout_s=2.0, max_retries=300, backoff_s=0.1, backoff_max_s=0.1
        )
        assert client.retrieve(["Velorin Oskatu"], 1)[0][0].id == "velorin"
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(timeout=10)


# ---------------------------------------------------------------------------------------------------------------
# http: a real server that misbehaves on purpose


class FaultServer(ThreadingHTTPServer):
    """Answers request i with script[min(i, len - 1)]; records every request body."""

    daemon_threads = True

    def __init__(self, script: list[tuple], retriever: BM25Retriever | None = None):
        super().__init__(("127.0.0.1", 0), FaultHandler)
        self.script, self.retriever, self.requests = script, retriever, []
        self.thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/retrieve"

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class FaultHandler(BaseHTTPRequestHandler):
    server: FaultServer

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append(body)
        action, *args = self.server.script[min(len(self.server.requests), len(self.server.script)) - 1]
        if action == "slow":
            time.sleep(args[0])
            action = "ok"
        if action == "ok":
            hits = self.server.retriever.retrieve(body["queries"], body["topk"])
            payload = {
                "result": [
                    [{"document": {"id": p.id, "contents": p.contents}, "score": p.score} for p in row] for row in hits
                ]
            }
            return self.reply(200, json.dumps(payload).encode())
        if action == "status":
            return self.reply(args[0], b'{"error": "injected"}')
        if action == "raw":
            return self.reply(200, args[0])
        if action == "redirect":
            self.send_response(302)
            self.send_header("Location", args[0])
            self.send_header("Content-Length", "0")
            self.end_headers()

    def reply(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except OSError:  # the client timed out and left
            pass

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def fault_server(bm25: BM25Retriever):
    servers = []

    def start(*script: tuple) -> FaultServer:
        servers.append(FaultServer(list(script), bm25))
        return servers[-1]

    yield start
    for s in servers:
        s.stop()


def fast_client(url: str, **kwargs) -> HTTPRetriever:
    return HTTPRetriever(url, **{"timeout_s": 1.0, "max_retries": 2, "backoff_s": 0.01, **kwargs})


def test_http_server_down_raises_after_bounded_retries_with_backoff():
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there now
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/retrieve"
    client = HTTPRetriever(url, timeout_s=1.0, max_retries=3, backoff_s=0.05, backoff_max_s=0.1)
    start = time.monotonic()
    with pytest.raises(RetrieverError) as info:
        client.retrieve(["Paris"], 1)
    elapsed = time.monotonic() - start
    assert info.value.attempts == 4 and info.value.url == url
    assert elapsed >= 0.05 + 0.1 + 0.1  # slept between attempts, the third delay capped at backoff_max_s
    message = str(info.value)
    assert url in message and "4 attempt(s)" in message and "refused" in message.lower()


def test_backoff_doubles_up_to_the_cap():
    client = HTTPRetriever("http://127.0.0.1:1/retrieve", backoff_s=0.5, backoff_max_s=2.0)
    assert [client.backoff_delay(r) for r in (1, 2, 3, 4, 5)] == [0.5, 1.0, 2.0, 2.0, 2.0]


def test_http_500_then_recovery_succeeds(fault_server, bm25: BM25Retriever):
    srv = fault_server(("status", 500), ("status", 503), ("ok",))
    assert fast_client(srv.url).retrieve(["Quessel"], 2) == bm25.retrieve(["Quessel"], 2)
    assert len(srv.requests) == 3


def test_http_persistent_500_fails_after_max_retries(fault_server):
    srv = fault_server(("status", 500))
    with pytest.raises(RetrieverError, match="HTTP 500") as info:
        fast_client(srv.url).retrieve(["Quessel"], 2)
    assert info.value.attempts == 3 and len(srv.requests) == 3


def test_http_404_is_not_retried(fault_server):
    srv = fault_server(("status", 404))
    with pytest.raises(RetrieverError, match="HTTP 404.*not retried") as info:
        fast_client(srv.url).retrieve(["Quessel"], 2)
    assert info.value.attempts == 1 and len(srv.requests) == 1


@pytest.mark.parametrize(
    "body, message",
    [
        (b"<html>oops</html>", "not JSON"),
        (b'{"results": []}', "key 'result'"),
        (b'{"result": [[]]}', "hold 2 lists"),  # two queries asked, one list answered
        (b'{"result": [[{"document": {"id": "x"}}], []]}', "string 'contents'"),
        (b'{"result": [[{"document": {"id": "x", "contents": "T\\nx"}, "score": "high"}], []]}', "'score' must"),
    ],
)
def test_http_malformed_responses_are_retried_then_reported(fault_server, body: bytes, message: str):
    srv = fault_server(("raw", body))
    with pytest.raises(RetrieverError, match=message) as info:
        fast_client(srv.url).retrieve(["Quessel", "Paris"], 2)
    assert info.value.attempts == 3 and len(srv.requests) == 3


def test_http_malformed_then_valid_succeeds(fault_server):
    srv = fault_server(("raw", b"not json"), ("ok",))
    assert fast_client(srv.url).retrieve(["Paris"], 1)[0][0].id == "paris"


def test_http_slow_server_times_out_then_retry_succeeds(fault_server):
    srv = fault_server(("slow", 0.6), ("ok",))
    start = time.monotonic()
    assert fast_client(srv.url, timeout_s=0.15).retrieve(["Paris"], 1)[0][0].id == "paris"
    assert len(srv.requests) == 2 and time.monotonic() - start < 0.6


def test_http_always_slow_server_fails_with_timeout(fault_server):
    srv = fault_server(("slow", 0.5))
    with pytest.raises(RetrieverError, match=r"timed out.*waits 0.1 s \(env.timeout_s\)") as info:
        fast_client(srv.url, timeout_s=0.1, max_retries=1).retrieve(["Paris"], 1)
    assert info.value.attempts == 2 and len(srv.requests) == 2


def test_http_blank_queries_are_answered_locally(fault_server):
    srv = fault_server(("ok",))
    client = fast_client(srv.url)
    assert client.retrieve(["", "  "], 2) == [[], []] and srv.requests == []
    results = client.retrieve(["", "Paris", " "], 2)
    assert [len(r) for r in results] == [0, 1, 0]
    assert srv.requests == [{"queries": ["Paris"], "topk": 2, "return_scores": True}]


def test_http_does_not_follow_redirects_to_another_server(fault_server):
    elsewhere = fault_server(("ok",))
    srv = fault_server(("redirect", elsewhere.url))
    with pytest.raises(RetrieverError, match="redirect.*not followed") as info:
        fast_client(srv.url).retrieve(["Paris"], 1)
    assert info.value.attempts == 1 and len(srv.requests) == 1 and elsewhere.requests == []


def test_http_ignores_proxy_environment(fault_server, monkeypatch):
    proxy = fault_server(("status", 500))
    srv = fault_server(("ok",))
    for var in ("http_proxy", "HTTP_PROXY", "all_proxy"):
        monkeypatch.setenv(var, f"http://127.0.0.1:{proxy.server_address[1]}")
    for var in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(var, raising=False)
    assert fast_client(srv.url).retrieve(["Paris"], 1)[0][0].id == "paris"
    assert proxy.requests == [] and len(srv.requests) == 1


@pytest.mark.parametrize("url", ["localhost:8000/retrieve", "ftp://127.0.0.1/retrieve", "http:///retrieve"])
def test_http_rejects_bad_urls(url: str):
    with pytest.raises(ValueError, match="retriever url must be"):
        HTTPRetriever(url)


def test_http_rejects_bad_retry_settings():
    with pytest.raises(ValueError, match="max_retries"):
        HTTPRetriever("http://127.0.0.1:1/retrieve", max_retries=-1)
    with pytest.raises(ValueError, match="timeout_s"):
        HTTPRetriever("http://127.0.0.1:1/retrieve", timeout_s=0)


# ---- real corpora: chunked POSTs, waiting for a server that loads its index, the hint ----------------------------


def test_queries_go_in_chunks_and_a_retry_resends_one_chunk(bm25: BM25Retriever):
    """Every query of a turn went in one POST and a retry resent all of them. Chunks of 2 queries: 5
    queries make 3 POSTs; a 500 on the second chunk retries that chunk alone."""
    server = FaultServer([("ok",), ("status", 500), ("ok",)], retriever=bm25)
    try:
        client = HTTPRetriever(server.url, max_retries=1, backoff_s=0.0, max_queries_per_post=2)
        queries = ["Velorin Oskatu", "Brask Holdings", "", "Lisbara", "Ometh Works", "Raitukrum"]
        got = client.retrieve(queries, 2)
    finally:
        server.stop()
    live = [q for q in queries if q]
    assert [r["queries"] for r in server.requests] == [live[0:2], live[2:4], live[2:4], live[4:5]]
    assert got == bm25.retrieve(queries, 2)


def test_wait_ready_waits_for_a_late_server_and_says_so(bm25: BM25Retriever):
    port = free_port()
    url = f"http://127.0.0.1:{port}/retrieve"
    lines: list[str] = []
    late = threading.Timer(0.6, lambda: holder.append(RetrievalServer(bm25, port=port).start()))
    holder: list[RetrievalServer] = []
    late.start()
    try:
        waited = HTTPRetriever(url).wait_ready(20, say=lines.append, poll_s=0.1)
    finally:
        late.join()
        for s in holder:
            s.stop()
    assert 0.5 < waited < 20
    assert len(lines) == 2 and lines[0].startswith(f"[mempo] waiting up to 20 s for the retrieval server at {url}")
    assert lines[1].startswith(f"[mempo] the retrieval server at {url} answers")


def test_wait_ready_gives_up_naming_both_servers():
    """About 3.5 s of patience and a hint naming only mempo's server. The bounded wait's error names
    env.wait_s, Search-R1's server and mempo's."""
    url = f"http://127.0.0.1:{free_port()}/retrieve"
    with pytest.raises(RetrieverError) as err:
        HTTPRetriever(url).wait_ready(0.3, say=lambda line: None, poll_s=0.1)
    msg = str(err.value)
    assert "env.wait_s=0.3" in msg and "search_r1/search/retrieval_server.py" in msg
    assert "python -m mempo.rollout.retrieval_server" in msg


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
