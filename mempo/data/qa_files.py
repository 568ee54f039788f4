"""Real-data QA loaders: Search-R1-style ``.jsonl`` / ``.json`` / ``.parquet`` files of questions.

A row needs ``question`` (a non-empty string) and ``golden_answers`` (a non-empty list of non-empty strings;
a single string is accepted as a one-answer list), the FlashRAG / Search-R1 field names. Fallbacks, used only
when ``golden_answers`` is absent: ``answers`` (same types), then ``answer`` (a string or a list). An ``id``
field (string or integer) becomes the question id; otherwise it is ``f"{file stem}-{row}"``. Other fields
are ignored.

Any bad row stops the load with a ``ValueError`` that names the file, the line (1-based; for parquet and JSON
arrays, the 1-based row) and the key, before training starts: a broken JSON line, a row that is not an
object, a missing field, a wrong type, an empty question or answer. An unreadable parquet file, an
unsupported suffix and a file with no rows are errors too.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mempo.core.tasks import Question, Task
from mempo.data.compose import compose_tasks

ANSWER_KEYS = ("golden_answers", "answers", "answer")


def _fail(where: str, key: str | None, problem: str) -> ValueError:
    return ValueError(f"{where}: key {key!r}: {problem}" if key else f"{where}: {problem}")


def iter_json_rows(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """(location, row) for each object of a JSON-lines file, or of a JSON array when the file starts with
    ``[``. The location reads ``"<path>, line N"`` (``"<path>, row N"`` in an array); blank lines are
    skipped but counted."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text: {e}") from e
    if text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}, line {e.lineno}: broken JSON: {e.msg}") from e
        numbered = [(f"{path}, row {i}", item) for i, item in enumerate(items, start=1)]
    else:
        numbered = []
        for lineno, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                numbered.append((f"{path}, line {lineno}", json.loads(line)))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}, line {lineno}: broken JSON line: {e.msg}") from e
    for where, item in numbered:
        if not isinstance(item, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(item).__name__}")
        yield where, item


def require_str(row: dict[str, Any], key: str, where: str) -> str:
    """``row[key]`` as a non-empty string, or a ValueError naming ``where`` and ``key``."""
    if key not in row:
        raise _fail(where, key, "missing")
    value = row[key]
    if not isinstance(value, str):
        raise _fail(where, key, f"expected a string, got {type(value).__name__}")
    if not value.strip():
        raise _fail(where, key, "empty")
    return value


def require_answers(row: dict[str, Any], key: str, where: str) -> tuple[str, ...]:
    """``row[key]`` as a non-empty tuple of non-empty strings (a lone string counts as one answer)."""
    if key not in row:
        raise _fail(where, key, "missing")
    value = row[key]
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise _fail(where, key, f"expected a list of strings or a string, got {type(value).__name__}")
    if not value:
        raise _fail(where, key, "no answers (empty list)")
    for i, answer in enumerate(value):
        if not isinstance(answer, str):
            raise _fail(where, key, f"answer {i} has type {type(answer).__name__}, expected a string")
        if not answer.strip():
            raise _fail(where, key, f"answer {i} is empty")
    return tuple(value)


def question_from_row(row: dict[str, Any], where: str, default_qid: str) -> Question:
    """One ``Question`` from a Search-R1 row (see the module docstring for fields and fallbacks)."""
    text = require_str(row, "question", where)
    key = next((k for k in ANSWER_KEYS if k in row), ANSWER_KEYS[0])
    answers = require_answers(row, key, where)
    qid = row.get("id", default_qid)
    if isinstance(qid, bool) or not isinstance(qid, (str, int)):
        raise _fail(where, "id", f"expected a string or an integer, got {type(qid).__name__}")
    return Question(text, answers, str(qid))


def _parquet_rows(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
        # Only the fields we read: Search-R1 files also carry prompts and metadata we would decode for nothing.
        columns = [c for c in ("id", "question", *ANSWER_KEYS) if c in parquet.schema_arrow.names]
        table = parquet.read(columns=columns)
    except (pa.ArrowException, OSError) as e:
        raise ValueError(f"{path}: unreadable parquet file: {e}") from e
    for i, row in enumerate(table.to_pylist(), start=1):
        yield f"{path}, row {i}", row


def load_qa_file(path: str | Path) -> list[Question]:
    """All questions of a ``.jsonl``, ``.json`` or ``.parquet`` QA file, in file order."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        rows = iter_json_rows(path)
    elif suffix == ".parquet":
        rows = _parquet_rows(path)
    else:
        raise ValueError(f"{path}: unsupported QA file type {suffix!r} (expected .jsonl, .json or .parquet)")
    questions = [question_from_row(row, where, f"{path.stem}-{n}") for n, (where, row) in enumerate(rows, start=1)]
    if not questions:
        raise ValueError(f"{path}: no questions (the dataset is empty)")
    return questions


def load_qa_tasks(
    path: str | Path, objectives: int, *, num_tasks: int | None = None, seed: int = 0, prefix: str | None = None
) -> list[Task]:
    """``load_qa_file`` then ``compose_tasks``; task ids default to the file stem as prefix."""
    questions = load_qa_file(path)
    return compose_tasks(questions, objectives, num_tasks=num_tasks, seed=seed, prefix=prefix or Path(path).stem)
