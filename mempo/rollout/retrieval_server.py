"""A small retrieval server speaking the Search-R1 protocol over any Retriever (stdlib only).

    python -m mempo.rollout.retrieval_server --corpus wiki.jsonl --host 127.0.0.1 --port 8000 [--cache-dir DIR]

``POST /retrieve`` with ``{"queries": [str], "topk": int, "return_scores": bool}`` answers
``{"result": [[{"document": {"id", "contents"}, "score": s}, ...], ...]}`` (return_scores true) or
``{"result": [[{"id", "contents"}, ...], ...]}`` (false, Search-R1's default). Bad requests get HTTP 400 with
``{"error": ...}``. It lets the ``http`` retriever run without a Search-R1 install, and gives tests a real server.
"""

from __future__ import annotations

import argparse
import json
import logging
import threading
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from mempo.rollout.retrievers import BM25Retriever, Passage, Retriever

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 1 << 20


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        if self.path.split("?", 1)[0] != "/retrieve":
            return self._reply(404, {"error": f"unknown path {self.path!r}; POST /retrieve"})
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            return self._reply(411, {"error": "Content-Length required"})
        if int(length) > MAX_BODY_BYTES:
            return self._reply(413, {"error": f"body over {MAX_BODY_BYTES} bytes"})
        try:
            request = json.loads(self.rfile.read(int(length)))
            queries, topk, return_scores = _parse_request(request, self.server.default_topk, self.server.max_topk)
        except (ValueError, UnicodeDecodeError) as e:
            return self._reply(400, {"error": str(e)})
        try:
            hits = self.server.retriever.retrieve(queries, topk)
        except Exception as e:  # the client sees a 5xx and may retry; the traceback stays in the server log
            log.exception("retriever failed")
            return self._reply(500, {"error": f"retriever failed: {type(e).__name__}: {e}"})
        return self._reply(200, {"result": [[_encode(p, return_scores) for p in row] for row in hits]})

    def do_GET(self) -> None:  # noqa: N802
        self._reply(405 if self.path == "/retrieve" else 404, {"error": "POST /retrieve"})

    def _reply(self, status: int, payload: Any) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (base-class signature)
        log.debug("%s - " + format, self.address_string(), *args)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    retriever: Retriever
    default_topk: int
    max_topk: int


def _parse_request(request: Any, default_topk: int, max_topk: int) -> tuple[list[str], int, bool]:
    if not isinstance(request, dict):
        raise ValueError(f"request must be a JSON object, got {type(request).__name__}")
    queries = request.get("queries")
    if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
        raise ValueError("key 'queries' must be a list of strings")
    topk = request.get("topk")
    topk = default_topk if topk is None else topk
    if isinstance(topk, bool) or not isinstance(topk, int) or not 1 <= topk <= max_topk:
        raise ValueError(f"key 'topk' must be an int in [1, {max_topk}], got {topk!r}")
    return_scores = request.get("return_scores", False)
    if not isinstance(return_scores, bool):
        raise ValueError(f"key 'return_scores' must be a boolean, got {return_scores!r}")
    return queries, topk, return_scores


def _encode(p: Passage, return_scores: bool) -> dict[str, Any]:
    doc = {"id": p.id, "contents": p.contents}
    return {"document": doc, "score": p.score} if return_scores else doc


class RetrievalServer:
    """A threaded HTTP server bound to ``host`` only (default loopback); ``port=0`` picks a free port.

    Use ``start()``/``stop()`` (or ``with``) to serve from a background thread, ``serve_forever()`` to block.
    """

    def __init__(
        self,
        retriever: Retriever,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        default_topk: int = 3,
        max_topk: int = 100,
    ):
        self._httpd = _Server((host, port), _Handler)
        self._httpd.retriever = retriever
        self._httpd.default_topk = default_topk
        self._httpd.max_topk = max_topk
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The full endpoint, as HTTPRetriever takes it."""
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/retrieve"

    def start(self) -> RetrievalServer:
        # A short poll interval makes stop() take ~0.05 s instead of the default 0.5 s.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="retrieval-server", daemon=True
        )
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        try:
            self._httpd.serve_forever()
        finally:
            self._httpd.server_close()

    def stop(self) -> None:
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join()
            self._thread = None
        self._httpd.server_close()

    def __enter__(self) -> RetrievalServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", required=True, help='JSONL of {"id", "contents"} lines ("Title"\\ntext)')
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default: loopback only)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--cache-dir", default=None, help="save/load the BM25 index here (keyed by corpus hash)")
    parser.add_argument("--topk", type=int, default=3, help="topk when a request omits it")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    retriever = BM25Retriever.from_corpus(args.corpus, cache_dir=args.cache_dir)
    server = RetrievalServer(retriever, args.host, args.port, default_topk=args.topk)
    log.info("serving %d passages at %s", len(retriever.passages), server.url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
