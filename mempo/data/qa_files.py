"""Real-data QA loaders: Search-R1-style ``.jsonl`` / ``.json`` / ``.parquet`` files of questions, or of tasks.

A *question row* needs ``question`` (a non-empty string) and ``golden_answers`` (a non-empty list of non-empty
strings; a single string is accepted as a one-answer list), the FlashRAG / Search-R1 field names. Fallbacks, per
cell: when ``golden_answers`` is absent or null, ``answers`` (same types), then ``answer`` (a string or a list). An
``id`` field (string or integer) becomes the question id; absent or null, it is ``f"{prefix}-{row}"``, the prefix
being the file stem (``id_prefixes``: with the parent folders in front when several files given together share a
stem). ``data_source`` (a string) becomes ``Question.source``; absent or null, the file's dataset name
(``default_source``): its stem, or, when the stem is a split name (train, dev, val, validation, test: FlashRAG's
``<dataset>/<split>.jsonl`` layout), its folder's name. Other fields are ignored.

A file may instead hold *pre-composed tasks*, one a row, taken as they are (never re-composed):
- MEM1's multi-objective rows (no ``question`` column): ``prompt`` (a chat list, or a string) whose text ends with
  ``"Answer the following questions: q1?; q2?"`` and ``reward_model.ground_truth.target``, one alias list per
  question. The questions are the text after the last ``"Answer the following questions: "``, split on ``"?; "``
  (each keeps its ``?``); their count must equal the number of alias lists.
- mempo's own rows: ``{"task_id", "objectives": [{"question", "answers", "qid"?}, ...]}`` (the teacher format's
  task part, ``mempo.data.oracle``), with an optional ``data_source``.
The first row decides which kind a file holds; every row must then be of that kind.

Any bad row stops the load with a ``ValueError`` that names the file, the line (1-based; for parquet and JSON
arrays, the 1-based row) and the key, before training starts: a broken JSON line, a row that is not an
object, a missing field, a wrong type, an empty question or answer. An unreadable parquet file, an
unsupported suffix and a file with no rows are errors too.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from mempo.core.tasks import Question, Task
from mempo.data.compose import compose_tasks

ANSWER_KEYS = ("golden_answers", "answers", "answer")
MEM1_LEAD = "Answer the following questions: "
TASK_KEYS = ("objectives", "reward_model")  # a row with one of these and no "question" is a pre-composed task
SPLIT_STEMS = ("train", "dev", "val", "validation", "test")  # file stems that name a split, not a dataset


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


def _source(row: dict[str, Any], where: str, default: str) -> str:
    value = row.get("data_source")
    if value is None:
        return default
    if not isinstance(value, str) or not value.strip():
        raise _fail(where, "data_source", f"expected a non-empty string, got {value!r}")
    return value


def question_from_row(row: dict[str, Any], where: str, default_qid: str, default_source: str = "") -> Question:
    """One ``Question`` from a Search-R1 row (see the module docstring for fields and fallbacks)."""
    text = require_str(row, "question", where)
    # Per cell: the first answer key holding a value (parquet has every column in every row, nulls included).
    key = next((k for k in ANSWER_KEYS if row.get(k) is not None), next((k for k in ANSWER_KEYS if k in row), None))
    answers = require_answers(row, key or ANSWER_KEYS[0], where)
    qid = row.get("id")
    qid = default_qid if qid is None else qid
    if isinstance(qid, bool) or not isinstance(qid, (str, int)):
        raise _fail(where, "id", f"expected a string or an integer, got {type(qid).__name__}")
    return Question(text, answers, str(qid), _source(row, where, default_source))


def mem1_questions(prompt: Any, where: str) -> list[str]:
    """The questions of a MEM1 prompt: the text after the last ``MEM1_LEAD``, split on ``"?; "`` (each keeps its
    ``?``)."""
    if isinstance(prompt, (list, tuple)):
        texts = [m.get("content") for m in prompt if isinstance(m, dict)]
        if not texts or not all(isinstance(t, str) for t in texts):
            raise _fail(where, "prompt", "expected a chat list of {role, content} messages with string contents")
        text = "\n".join(texts)
    elif isinstance(prompt, str):
        text = prompt
    else:
        raise _fail(where, "prompt", f"expected a chat list or a string, got {type(prompt).__name__}")
    head, lead, tail = text.rpartition(MEM1_LEAD)
    if not lead:
        raise _fail(where, "prompt", f"no {MEM1_LEAD.strip()!r} in the text (not a MEM1 multi-objective prompt)")
    parts = tail.strip().split("?; ")
    questions = [p + "?" for p in parts[:-1]] + [parts[-1]]
    if any(not q.strip() or q.strip() == "?" for q in questions):
        raise _fail(where, "prompt", f"an empty question in {tail.strip()[:120]!r}")
    return questions


def task_from_row(row: dict[str, Any], where: str, default_id: str, default_source: str = "") -> Task:
    """One pre-composed ``Task`` from a MEM1 row or a mempo ``objectives`` row (module docstring)."""
    source = _source(row, where, default_source)
    if "objectives" in row:
        objs = row["objectives"]
        if not isinstance(objs, (list, tuple)) or not objs:
            raise _fail(where, "objectives", "expected a non-empty list of {question, answers} objects")
        task_id = row.get("task_id")
        task_id = default_id if task_id is None else str(task_id)
        questions = []
        for i, obj in enumerate(objs):
            at = f"{where}, objective {i}"
            if not isinstance(obj, dict):
                raise _fail(at, None, f"expected an object, got {type(obj).__name__}")
            qid = obj.get("qid") or f"{task_id}-{i}"
            text, answers = require_str(obj, "question", at), require_answers(obj, "answers", at)
            questions.append(Question(text, answers, str(qid), source))
        return Task(task_id, tuple(questions))
    if "prompt" not in row:
        raise _fail(where, "prompt", "missing (a MEM1 row holds prompt and reward_model.ground_truth.target)")
    texts = mem1_questions(row["prompt"], where)
    target = (row.get("reward_model") or {}).get("ground_truth") if isinstance(row.get("reward_model"), dict) else None
    target = target.get("target") if isinstance(target, dict) else None
    key = "reward_model.ground_truth.target"
    if not isinstance(target, (list, tuple)) or not all(isinstance(t, (list, tuple)) for t in target):
        raise _fail(where, key, f"expected one alias list per question, got {str(target)[:80]}")
    if len(target) != len(texts):
        raise _fail(where, key, f"{len(target)} alias lists for {len(texts)} questions in the prompt ({texts})")
    questions = [
        Question(text.strip(), require_answers({key: list(aliases)}, key, where), f"{default_id}-{i}", source)
        for i, (text, aliases) in enumerate(zip(texts, target))
    ]
    return Task(default_id, tuple(questions))


def _parquet_rows(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
        names = parquet.schema_arrow.names
        # Only the fields we read: Search-R1 files also carry prompts and metadata we would decode for nothing
        # (MEM1's files hold no question column: their tasks are in prompt and reward_model).
        wanted = ("id", "question", "data_source", *ANSWER_KEYS)
        if "question" not in names:
            wanted += ("prompt", "reward_model", "objectives", "task_id")
        table = parquet.read(columns=[c for c in wanted if c in names])
    except (pa.ArrowException, OSError) as e:
        raise ValueError(f"{path}: unreadable parquet file: {e}") from e
    for i, row in enumerate(table.to_pylist(), start=1):
        yield f"{path}, row {i}", row


def _rows(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        return iter_json_rows(path)
    if suffix == ".parquet":
        return _parquet_rows(path)
    raise ValueError(f"{path}: unsupported QA file type {suffix!r} (expected .jsonl, .json or .parquet)")


def is_task_row(row: dict[str, Any]) -> bool:
    return "question" not in row and any(k in row for k in TASK_KEYS)


def default_source(path: str | Path) -> str:
    """The source of a file's rows without ``data_source``: its stem (``nq.jsonl`` -> nq), or its folder's name when
    the stem is a split name (FlashRAG's ``nq/test.jsonl`` -> nq, not "test")."""
    path = Path(path)
    if path.stem.lower() in SPLIT_STEMS and path.absolute().parent.name:
        return path.absolute().parent.name
    return path.stem


def id_prefixes(paths: Sequence[str | Path], what: str = "the QA files") -> list[str]:
    """The prefix of each file's default ids (``f"{prefix}-{row}"``): its stem; for files whose stem another file of
    ``paths`` shares, as many of its folders in front as tell them apart, joined by "-" (``a/test.parquet`` and
    ``b/test.parquet`` -> "a-test", "b-test"). A file listed twice is a ValueError naming ``what`` and the file."""
    resolved = [Path(p).resolve() for p in paths]
    for i, p in enumerate(resolved):
        if p in resolved[:i]:
            raise ValueError(f"{what} lists {paths[i]} twice (its tasks would be evaluated twice)")
    parts = [p.with_suffix("").parts[1:] for p in resolved]  # without the root
    prefixes = []
    for i, mine in enumerate(parts):
        depth = 1
        while depth < len(mine) and any(o[-depth:] == mine[-depth:] for j, o in enumerate(parts) if j != i):
            depth += 1
        prefixes.append("-".join(mine[-depth:]))
    return prefixes


def load_qa_items(path: str | Path, prefix: str | None = None) -> list[Question] | list[Task]:
    """A file's questions (a question file) or its pre-composed tasks (a task file), in file order; the first row
    decides which (module docstring). prefix: of the default ids, ``f"{prefix}-{row}"`` (default the file stem)."""
    path = Path(path)
    prefix = path.stem if prefix is None else prefix
    source = default_source(path)
    items: list[Any] = []
    tasks: bool | None = None
    for n, (where, row) in enumerate(_rows(path), start=1):
        if tasks is None:
            tasks = is_task_row(row)
        elif tasks != is_task_row(row):
            kind = "a pre-composed task" if tasks else "a question"
            raise _fail(where, "question", f"row 1 is {kind} but this row is not (one kind per file)")
        make = task_from_row if tasks else question_from_row
        items.append(make(row, where, f"{prefix}-{n}", source))
    if not items:
        raise ValueError(f"{path}: no questions (the dataset is empty)")
    return items


def load_qa_file(path: str | Path) -> list[Question]:
    """All questions of a ``.jsonl``, ``.json`` or ``.parquet`` QA file, in file order (a task file's are refused:
    its tasks are taken as they are, ``load_qa_items``)."""
    items = load_qa_items(path)
    if isinstance(items[0], Task):
        raise ValueError(f"{path}: holds pre-composed tasks (MEM1 or mempo rows), not questions")
    return items  # type: ignore[return-value]


def load_qa_tasks(
    path: str | Path, objectives: int, *, num_tasks: int | None = None, seed: int = 0, prefix: str | None = None
) -> list[Task]:
    """``load_qa_file`` then ``compose_tasks``; task ids default to the file stem as prefix."""
    questions = load_qa_file(path)
    return compose_tasks(questions, objectives, num_tasks=num_tasks, seed=seed, prefix=prefix or Path(path).stem)
