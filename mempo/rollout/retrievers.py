"""Retriever backends behind the search tool (docs/algorithm.md §1.3: a search returns top-k passages).

Shapes: ``retrieve(queries: [Q] str, topk) -> [Q][<= topk] Passage``, best first.

Backends (``make_retriever(kind, **kwargs)``):
- ``bm25``: an in-process bm25s index over a JSONL corpus of ``{"id", "contents"}`` lines, where ``contents`` is
  ``"Title"\\ntext`` (the Search-R1 / FlashRAG wiki convention).
- ``http``: a client of the Search-R1 retrieval-server protocol (``POST /retrieve`` with ``queries``, ``topk``,
  ``return_scores``), as served by Search-R1's ``retrieval_server.py`` or by ``mempo.rollout.retrieval_server``.

Defined outcomes: a blank query, or one that shares no term with the corpus, gets ``[]`` (never an error), so
the environment can answer it with a fixed "no results" text.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import logging
import math
import os
import shutil
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from mempo.core.base import read_jsonl
from mempo.core.jax_guard import keep_jax_off_gpu
from mempo.core.plugins import registered_names

keep_jax_off_gpu()  # before bm25s imports (and starts) JAX, where it is installed: mempo.core.jax_guard
import bm25s  # noqa: E402

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Passage:
    """One retrieved passage. ``contents`` is ``title\\ntext`` (Search-R1); ``score`` is None when unscored."""

    id: str
    contents: str
    score: float | None = None

    @property
    def title(self) -> str:
        """The first line, without the surrounding double quotes wiki dumps put there; "" when one line only."""
        head, sep, _ = self.contents.partition("\n")
        if not sep:
            return ""
        head = head.strip()
        if len(head) >= 2 and head[0] == head[-1] == '"':
            head = head[1:-1]
        return head

    @property
    def text(self) -> str:
        """Everything after the first newline; the whole contents when there is no newline."""
        head, sep, rest = self.contents.partition("\n")
        return rest.strip() if sep else head.strip()


@runtime_checkable
class Retriever(Protocol):
    def retrieve(self, queries: Sequence[str], topk: int) -> list[list[Passage]]:
        """queries: [Q] -> [Q][<= topk] passages, best first; [] for a blank or unmatched query."""
        ...


class RetrieverError(RuntimeError):
    """The retrieval backend could not answer (after retries, where retrying made sense)."""

    def __init__(self, message: str, *, url: str = "", attempts: int = 0, last_error: BaseException | None = None):
        super().__init__(message)
        self.url = url
        self.attempts = attempts
        self.last_error = last_error


def _check_topk(topk: int) -> None:
    if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
        raise ValueError(f"topk must be an int >= 1, got {topk!r}")


def load_corpus(path: str | os.PathLike) -> list[Passage]:
    """A JSONL corpus -> [D] passages. Every non-blank line is ``{"id": str | int, "contents": str, ...}``.

    Bad lines raise ValueError naming the file, the line number and the key; duplicate ids and an empty corpus
    are errors too (a retriever over nothing would answer every query with "no results", silently).
    """
    path = Path(path)
    passages: list[Passage] = []
    first_line_of: dict[str, int] = {}
    for lineno, row in read_jsonl(path):
        for key in ("id", "contents"):
            if key not in row:
                raise ValueError(f"{path}:{lineno}: missing key {key!r} (keys: {sorted(row)})")
        pid, contents = row["id"], row["contents"]
        if isinstance(pid, bool) or not isinstance(pid, (str, int)):
            raise ValueError(f"{path}:{lineno}: key 'id' must be a string or an int, got {type(pid).__name__}")
        if not isinstance(contents, str):
            raise ValueError(f"{path}:{lineno}: key 'contents' must be a string, got {type(contents).__name__}")
        pid = str(pid)
        if pid in first_line_of:
            raise ValueError(f"{path}:{lineno}: duplicate id {pid!r} (first seen on line {first_line_of[pid]})")
        first_line_of[pid] = lineno
        passages.append(Passage(id=pid, contents=contents))
    if not passages:
        raise ValueError(f"{path}: the corpus is empty (no JSONL lines)")
    return passages


# ---------------------------------------------------------------------------------------------------------------
# bm25


def _tokenize(texts: Sequence[str]) -> list[list[str]]:
    # bm25s's scikit-learn-style splitter: lowercase, words of >= 2 word characters, English stopwords removed.
    # No stemming: invented proper nouns ("Velorin Oskatu") must match verbatim, and PyStemmer is not a dependency.
    return bm25s.tokenize(list(texts), stopwords="en", return_ids=False, show_progress=False)


class BM25Retriever:
    """An in-process BM25 (Lucene variant) index over a list of passages.

    Scores: the ``lucene`` IDF is positive for every indexed term, so a passage scores > 0 exactly when it shares a
    term with the query; passages scoring 0 are dropped (fewer than topk, or [], is the defined no-match result).
    """

    def __init__(self, passages: Sequence[Passage], *, k1: float = 1.5, b: float = 0.75, index: Any = None):
        if not passages:
            raise ValueError("BM25Retriever needs at least one passage")
        self.passages: list[Passage] = list(passages)
        self.k1, self.b = k1, b
        self.loaded_from_cache = index is not None
        if index is None:
            index = bm25s.BM25(k1=k1, b=b, method="lucene", backend="numpy")
            index.index(_tokenize([p.contents for p in self.passages]), show_progress=False)
        if index.scores["num_docs"] != len(self.passages):
            raise ValueError(
                f"index holds {index.scores['num_docs']} documents but {len(self.passages)} passages given"
            )
        self._index = index

    @classmethod
    def from_corpus(
        cls, path: str | os.PathLike, cache_dir: str | os.PathLike | None = None, *, k1: float = 1.5, b: float = 0.75
    ) -> BM25Retriever:
        """Load a JSONL corpus (see load_corpus) and index it.

        cache_dir: when given, the index is saved under ``cache_dir/bm25-<key>`` and loaded from there next time;
        the key hashes the corpus file's bytes and the index parameters, so an edited corpus is re-indexed.
        """
        passages = load_corpus(path)
        if cache_dir is None:
            return cls(passages, k1=k1, b=b)
        key = _cache_key(Path(path), k1=k1, b=b)
        index_dir = Path(cache_dir) / f"bm25-{key}"
        if index_dir.is_dir():
            index = bm25s.BM25.load(str(index_dir), show_progress=False)
            if index.scores["num_docs"] == len(passages):
                return cls(passages, k1=k1, b=b, index=index)
            log.warning(
                "BM25 cache %s holds %d documents, corpus has %d: rebuilding",
                index_dir,
                index.scores["num_docs"],
                len(passages),
            )
            shutil.rmtree(index_dir, ignore_errors=True)
        retriever = cls(passages, k1=k1, b=b)
        retriever._save(index_dir)
        return retriever

    def _save(self, index_dir: Path) -> None:
        # Build in a sibling temp dir, then rename: a crash or a concurrent builder never leaves a half-written index.
        index_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=index_dir.name + ".tmp-", dir=index_dir.parent))
        self._index.save(str(tmp), show_progress=False)
        try:
            tmp.rename(index_dir)
        except OSError:  # another process finished first; its index is equivalent
            shutil.rmtree(tmp, ignore_errors=True)

    def retrieve(self, queries: Sequence[str], topk: int) -> list[list[Passage]]:
        """queries: [Q] -> [Q][<= topk] passages with BM25 scores, best first."""
        _check_topk(topk)
        vocab = self._index.vocab_dict
        # Out-of-vocabulary terms are dropped here so that a query with no known term is answered [] directly.
        tokens = [[t for t in q if t and t in vocab] for q in _tokenize(queries)] if queries else []
        out: list[list[Passage]] = [[] for _ in queries]
        live = [i for i, toks in enumerate(tokens) if toks]
        if not live:
            return out
        for i in live:
            scores = self._index.get_scores(tokens[i])  # [D] float32
            out[i] = [
                Passage(self.passages[d].id, self.passages[d].contents, float(scores[d]))
                for d in top_k_stable(scores, topk).tolist()
                if scores[d] > 0
            ]
        return out


def top_k_stable(scores: np.ndarray, k: int) -> np.ndarray:
    """scores: [D] -> [min(k, D)] indices of the highest scores, best first, equal scores in corpus order.

    bm25s's own top-k (argpartition, then an unstable argsort) orders equal scores by whichever sort numpy
    dispatches to: on AVX512 machines its SIMD sort returned other tied passages, in another order, than on
    AVX2-only ones, so the synthetic world's teacher trajectories and every rollout differed between machine kinds
    (tests/models/sft/test_sft_pin.py's pins, made on AVX2, failed on AVX512-BF16). Ties are common there: templated
    passages of equal length score equally for an entity they all name. So ``retrieve`` never calls bm25s's
    ``BM25.retrieve`` or its selection backends (``backend_selection``, which is JAX where jax is installed): JAX sees
    only bm25s's import-time call (tests/core/test_jax_guard.py).
    """
    n = scores.shape[0]
    k = min(k, n)
    if k <= 0:
        return np.zeros(0, dtype=np.int64)
    # The k-th largest value is the same whatever algorithm partitions; every index scoring at least it is kept.
    kth = np.partition(scores, n - k)[n - k]
    candidates = np.flatnonzero(scores >= kth)
    order = np.lexsort((candidates, -scores[candidates]))  # by score descending, then by index: a total order
    return candidates[order][:k]


def _cache_key(path: Path, *, k1: float, b: float) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    h.update(json.dumps({"k1": k1, "b": b, "method": "lucene", "stopwords": "en", "bm25s": bm25s.__version__}).encode())
    return h.hexdigest()[:24]


# ---------------------------------------------------------------------------------------------------------------
# http


SERVER_HINT = (
    " Is the server running? For a Wikipedia index, Search-R1's, in its own environment (faiss, e5): python "
    "search_r1/search/retrieval_server.py --index_path e5_Flat.index --corpus_path wiki-18.jsonl --topk 3 "
    "--retriever_name e5 --retriever_model intfloat/e5-base-v2 (it listens on port 8000 after loading the index, "
    "minutes; MEM1's copy on 8013). For a small corpus, mempo's BM25 server: "
    "python -m mempo.rollout.retrieval_server --corpus CORPUS.jsonl"
)


class _BadResponse(ValueError):
    """The server answered 2xx with a body that is not the Search-R1 response shape (retried)."""


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    # Only the configured URL is ever contacted: a 3xx surfaces as an HTTPError instead of being followed.
    def redirect_request(
        self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any, newurl: str
    ) -> None:
        return None


# 4xx means the request itself is wrong and would fail again; 408/429 are the server asking us to come back later.
_RETRIABLE_4XX = frozenset({408, 429})


class HTTPRetriever:
    """A client of a Search-R1 retrieval server.

    url: the full endpoint, e.g. ``http://127.0.0.1:8000/retrieve``. Proxies from the environment are ignored and
    redirects are not followed, so no other host is contacted.
    timeout_s: per socket operation (connect, each read). Attempts: 1 + max_retries; before retry r (1-based) it
    sleeps ``min(backoff_s * 2**(r-1), backoff_max_s)``. Retried: connection errors, timeouts, HTTP 5xx/408/429,
    bodies that are not JSON or not the expected shape. Not retried: other 4xx and 3xx.
    max_queries_per_post: a turn's queries go in POSTs of at most this many, one after the other, so one timeout
    covers one chunk and a retry resends one chunk (a batch of 2048 queries in one POST outlives any sane timeout
    on a flat e5 index, and a retry would resend all of it while the server still computes the abandoned one).
    """

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 10.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        backoff_max_s: float = 8.0,
        return_scores: bool = True,
        max_queries_per_post: int = 64,
    ):
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"retriever url must be http(s)://host[:port]/path, got {url!r}")
        if not (timeout_s > 0 and math.isfinite(timeout_s)):
            raise ValueError(f"timeout_s must be a positive number, got {timeout_s!r}")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ValueError(f"max_retries must be an int >= 0, got {max_retries!r}")
        if (
            isinstance(max_queries_per_post, bool)
            or not isinstance(max_queries_per_post, int)
            or max_queries_per_post < 1
        ):
            raise ValueError(f"max_queries_per_post must be an int >= 1, got {max_queries_per_post!r}")
        if backoff_s < 0 or backoff_max_s < 0:
            raise ValueError(f"backoff_s and backoff_max_s must be >= 0, got {backoff_s!r}, {backoff_max_s!r}")
        self.url = url
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self.return_scores = return_scores
        self.max_queries_per_post = max_queries_per_post
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())

    def backoff_delay(self, retry: int) -> float:
        """Seconds slept before retry ``retry`` (1-based)."""
        return min(self.backoff_s * 2 ** (retry - 1), self.backoff_max_s)

    def retrieve(self, queries: Sequence[str], topk: int) -> list[list[Passage]]:
        """queries: [Q] -> [Q][<= topk] passages; the non-blank queries in POSTs of at most max_queries_per_post,
        each retried on its own (blank queries get [])."""
        _check_topk(topk)
        out: list[list[Passage]] = [[] for _ in queries]
        live = [i for i, q in enumerate(queries) if q.strip()]
        for start in range(0, len(live), self.max_queries_per_post):
            chunk = live[start : start + self.max_queries_per_post]
            body = json.dumps(
                {"queries": [queries[i] for i in chunk], "topk": topk, "return_scores": self.return_scores}
            )
            results = self._with_retries(lambda b=body.encode(), n=len(chunk): _parse_response(self._post(b), n, topk))
            for i, hits in zip(chunk, results):
                out[i] = hits
        return out

    def wait_ready(self, wait_s: float, say: Callable[[str], None] = print, poll_s: float = 2.0) -> float:
        """Block until the server answers a one-query POST, at most ``wait_s`` seconds -> seconds waited. A
        Search-R1 server loads its index and corpus for minutes before it listens. Any HTTP answer counts as up
        (a wrong one is reported by the first real call); connection errors and timeouts mean "not yet". Says one
        line when it has to wait, and one when the server answers; a ``RetrieverError`` with the server hint when
        ``wait_s`` passes."""
        start = time.monotonic()
        body = json.dumps({"queries": ["ready"], "topk": 1, "return_scores": self.return_scores}).encode()
        announced = False
        while True:
            try:
                self._post(body)
                break
            except urllib.error.HTTPError as e:
                e.close()
                break
            except (OSError, http.client.HTTPException, _BadResponse) as e:
                waited = time.monotonic() - start
                if waited >= wait_s:
                    raise RetrieverError(
                        f"retrieval server {self.url} did not answer within env.wait_s={wait_s:g} s "
                        f"(last error: {type(e).__name__}: {e}).{SERVER_HINT}",
                        url=self.url,
                        attempts=0,
                        last_error=e,
                    ) from e
                if not announced:
                    say(
                        f"[mempo] waiting up to {wait_s:g} s for the retrieval server at {self.url} "
                        f"({type(e).__name__}: {e})"
                    )
                    announced = True
                time.sleep(max(0.0, min(poll_s, wait_s - waited)))
        waited = time.monotonic() - start
        if announced:
            say(f"[mempo] the retrieval server at {self.url} answers (after {waited:.0f} s)")
        return waited

    def _post(self, data: bytes) -> Any:
        req = urllib.request.Request(self.url, data=data, method="POST", headers={"Content-Type": "application/json"})
        with self._opener.open(req, timeout=self.timeout_s) as resp:
            raw = resp.read()
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise _BadResponse(f"response is not JSON ({e}); body starts {raw[:80]!r}") from e

    def _with_retries(self, call: Callable[[], list[list[Passage]]]) -> list[list[Passage]]:
        attempts = self.max_retries + 1
        last: BaseException | None = None
        last_desc = ""
        for attempt in range(1, attempts + 1):
            try:
                return call()
            except urllib.error.HTTPError as e:
                last, last_desc = e, f"HTTP {e.code} {_error_body(e)}"
                if e.code < 500 and e.code not in _RETRIABLE_4XX:
                    if e.code < 400:
                        last_desc = f"HTTP {e.code} redirect to {e.headers.get('Location')!r} (not followed)"
                    raise RetrieverError(
                        f"retrieval server {self.url} answered {last_desc}; not retried",
                        url=self.url,
                        attempts=attempt,
                        last_error=e,
                    ) from e
            except (OSError, http.client.HTTPException, _BadResponse) as e:
                # OSError covers URLError (refused, DNS), TimeoutError and connection resets.
                last = e
                reason = e.reason if isinstance(e, urllib.error.URLError) else e
                last_desc = f"{type(e).__name__}: {reason}"
            if attempt < attempts:
                delay = self.backoff_delay(attempt)
                log.warning(
                    "retrieval %s failed (attempt %d/%d: %s); retrying in %.2fs",
                    self.url,
                    attempt,
                    attempts,
                    last_desc,
                    delay,
                )
                time.sleep(delay)
        unreachable = isinstance(last, (urllib.error.URLError, ConnectionError)) and not isinstance(
            last, urllib.error.HTTPError
        )
        hint = SERVER_HINT if unreachable else ""
        if isinstance(last, TimeoutError) or isinstance(getattr(last, "reason", None), TimeoutError):
            hint = (
                f" Each POST carries at most {self.max_queries_per_post} queries (env.max_queries_per_post) and waits "
                f"{self.timeout_s:g} s (env.timeout_s): for a slow server (a large index, a GPU shared with training) "
                "raise env.timeout_s or lower env.max_queries_per_post."
            )
        raise RetrieverError(
            f"retrieval server {self.url} failed after {attempts} attempt(s); last error: {last_desc}." + hint,
            url=self.url,
            attempts=attempts,
            last_error=last,
        )


def _error_body(e: urllib.error.HTTPError) -> str:
    # Read once, then close: the body is only decoration for the message, and an unclosed error leaks a socket.
    try:
        body = e.read()[:200].decode("utf-8", "replace")
    except Exception:
        body = ""
    finally:
        e.close()
    return f"{e.reason} {body}".strip()


def _parse_response(payload: Any, n_queries: int, topk: int) -> list[list[Passage]]:
    """Search-R1 response -> [n_queries][<= topk] passages.

    ``{"result": [[{"document": {"id", "contents"}, "score": s}, ...], ...]}`` (return_scores true) or
    ``{"result": [[{"id", "contents"}, ...], ...]}`` (false).
    """
    if not isinstance(payload, dict) or "result" not in payload:
        raise _BadResponse(f"expected a JSON object with key 'result', got {str(payload)[:80]!r}")
    result = payload["result"]
    if not isinstance(result, list) or len(result) != n_queries:
        got = f"{len(result)} entries" if isinstance(result, list) else type(result).__name__
        raise _BadResponse(f"expected 'result' to hold {n_queries} lists (one per query), got {got}")
    out: list[list[Passage]] = []
    for qi, hits in enumerate(result):
        if not isinstance(hits, list):
            raise _BadResponse(f"result[{qi}] must be a list, got {type(hits).__name__}")
        passages = []
        for hi, hit in enumerate(hits[:topk]):
            where = f"result[{qi}][{hi}]"
            doc, score = (
                (hit.get("document"), hit.get("score")) if isinstance(hit, dict) and "document" in hit else (hit, None)
            )
            if not isinstance(doc, dict) or not isinstance(doc.get("contents"), str):
                raise _BadResponse(f"{where}: expected a document with a string 'contents', got {str(doc)[:80]!r}")
            if score is not None and (isinstance(score, bool) or not isinstance(score, (int, float))):
                raise _BadResponse(f"{where}: 'score' must be a number, got {score!r}")
            # Some corpora carry no id; the environment only shows contents, so a missing id is tolerated.
            passages.append(Passage(str(doc.get("id", "")), doc["contents"], None if score is None else float(score)))
        out.append(passages)
    return out


# ---------------------------------------------------------------------------------------------------------------
# registry

RETRIEVERS: dict[str, Callable[..., Retriever]] = {
    "bm25": BM25Retriever.from_corpus,
    "http": HTTPRetriever,
}


def make_retriever(kind: str, **kwargs: Any) -> Retriever:
    """``bm25``: kwargs of BM25Retriever.from_corpus (path, cache_dir, k1, b); ``http``: of HTTPRetriever (url, ...)."""
    if kind not in RETRIEVERS:
        raise ValueError(f"unknown retriever kind {kind!r}; known: {registered_names(RETRIEVERS)}")
    return RETRIEVERS[kind](**kwargs)
