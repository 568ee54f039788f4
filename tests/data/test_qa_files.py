"""Search-R1-style QA loaders on small fixtures: good files, every malformed case, composition into tasks."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mempo.core.tasks import Question
from mempo.data.compose import compose_tasks
from mempo.data.qa_files import load_qa_file, load_qa_items, load_qa_tasks

ROWS = [
    {"id": "nq-1", "question": "who wrote the velvet almanac?", "golden_answers": ["Ida Moss", "I. Moss"]},
    {"id": 2, "question": "when did the lighthouse open?", "golden_answers": "1911"},
    {"question": "what river runs through ardent?", "golden_answers": ["Tesk"], "data_source": "nq"},
    {"question": "which bird nests on the tower?", "answers": ["kestrel"]},
    {"question": "what colour is the door?", "answer": "blue"},
]


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def write_parquet(path: Path, rows: list[dict], schema: pa.Schema | None = None) -> Path:
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return path


def expected(stem: str, source: str | None = None) -> list[Question]:
    """A row's data_source, else ``source`` (default the file stem); default ids are the stem and the row."""
    source = source or stem
    return [
        Question("who wrote the velvet almanac?", ("Ida Moss", "I. Moss"), "nq-1", source),
        Question("when did the lighthouse open?", ("1911",), "2", source),
        Question("what river runs through ardent?", ("Tesk",), f"{stem}-3", "nq"),
        Question("which bird nests on the tower?", ("kestrel",), f"{stem}-4", source),
        Question("what colour is the door?", ("blue",), f"{stem}-5", source),
    ]


def test_jsonl_with_every_accepted_field_shape(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "dev.jsonl", ROWS[:2] + [""] + ROWS[2:])  # a blank line is skipped
    assert load_qa_file(path) == expected("dev", source=tmp_path.name)  # a split's name: the folder is the dataset


def test_json_array_and_json_lines(tmp_path: Path) -> None:
    array = tmp_path / "arr.json"
    array.write_text(json.dumps(ROWS, indent=1), encoding="utf-8")
    assert load_qa_file(array) == expected("arr")
    lines = write_jsonl(tmp_path / "lines.json", ROWS)
    assert load_qa_file(lines) == expected("lines")


def test_parquet_like_search_r1(tmp_path: Path) -> None:
    rows = [
        {"id": "train_0", "question": "who wrote the velvet almanac?", "golden_answers": ["Ida Moss", "I. Moss"],
         "prompt": [{"role": "user", "content": "..."}], "data_source": "nq"},
        {"id": "train_1", "question": "when did the lighthouse open?", "golden_answers": ["1911"],
         "prompt": [{"role": "user", "content": "..."}], "data_source": "hotpotqa"},
    ]  # fmt: skip
    path = write_parquet(tmp_path / "train.parquet", rows)
    assert load_qa_file(path) == [
        Question("who wrote the velvet almanac?", ("Ida Moss", "I. Moss"), "train_0", "nq"),
        Question("when did the lighthouse open?", ("1911",), "train_1", "hotpotqa"),
    ]


GOOD = {"question": "who?", "golden_answers": ["Ann"]}


@pytest.mark.parametrize(
    ("bad", "key", "problem"),
    [
        ({"golden_answers": ["Ann"]}, "'question'", "missing"),
        ({"question": "who?"}, "'golden_answers'", "missing"),
        ({"question": "who?", "golden_answers": []}, "'golden_answers'", "empty list"),
        ({"question": "who?", "golden_answers": ["Ann", " "]}, "'golden_answers'", "answer 1 is empty"),
        ({"question": "who?", "golden_answers": ""}, "'golden_answers'", "answer 0 is empty"),
        ({"question": "who?", "golden_answers": [1911]}, "'golden_answers'", "answer 0 has type int"),
        ({"question": "who?", "golden_answers": {"a": 1}}, "'golden_answers'", "got dict"),
        ({"question": "who?", "golden_answers": None}, "'golden_answers'", "got NoneType"),
        ({"question": 5, "golden_answers": ["Ann"]}, "'question'", "expected a string"),
        ({"question": "  ", "golden_answers": ["Ann"]}, "'question'", "empty"),
        ({"question": "who?", "answers": []}, "'answers'", "empty list"),
        ({"question": "who?", "golden_answers": ["Ann"], "id": [1]}, "'id'", "got list"),
        ('{"question": "who?", "golden_answers": ["Ann"]', None, "broken JSON line"),
        ('["who?", ["Ann"]]', None, "expected a JSON object"),
    ],
)
def test_malformed_jsonl_rows_name_file_line_and_key(tmp_path: Path, bad, key: str | None, problem: str) -> None:
    path = write_jsonl(tmp_path / "broken.jsonl", [GOOD, GOOD, bad, GOOD])
    with pytest.raises(ValueError) as err:
        load_qa_file(path)
    message = str(err.value)
    assert str(path) in message and "line 3" in message and problem in message
    assert key is None or f"key {key}" in message


def test_broken_json_array_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "arr.json"
    path.write_text('[\n{"question": "who?", "golden_answers": ["Ann"]},\n{"question": \n]', encoding="utf-8")
    with pytest.raises(ValueError, match=r"arr\.json, line 4: broken JSON"):
        load_qa_file(path)


@pytest.mark.parametrize(
    ("rows", "key", "problem"),
    [
        ([GOOD, {"question": "who?", "golden_answers": None}], "'golden_answers'", "got NoneType"),
        ([GOOD, {"question": "who?", "golden_answers": []}], "'golden_answers'", "empty list"),
        ([GOOD, {"question": None, "golden_answers": ["Ann"]}], "'question'", "got NoneType"),
    ],
)
def test_malformed_parquet_rows_name_file_row_and_key(tmp_path: Path, rows, key: str, problem: str) -> None:
    schema = pa.schema([("question", pa.string()), ("golden_answers", pa.list_(pa.string()))])
    path = write_parquet(tmp_path / "bad.parquet", rows, schema)
    with pytest.raises(ValueError) as err:
        load_qa_file(path)
    message = str(err.value)
    assert str(path) in message and "row 2" in message and f"key {key}" in message and problem in message


def test_parquet_without_the_answer_column(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "noans.parquet", [{"question": "who?", "target": "Ann"}])
    with pytest.raises(ValueError, match=r"noans\.parquet, row 1: key 'golden_answers': missing"):
        load_qa_file(path)


def test_unreadable_parquet_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "garbage.parquet"
    path.write_bytes(b"this is not a parquet file at all")
    with pytest.raises(ValueError, match=r"garbage\.parquet: unreadable parquet"):
        load_qa_file(path)


def test_empty_files_and_unknown_suffix_are_errors(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"empty\.jsonl: no questions"):
        load_qa_file(empty)
    no_rows = tmp_path / "none.parquet"
    schema = pa.schema([("question", pa.string()), ("golden_answers", pa.list_(pa.string()))])
    write_parquet(no_rows, [], schema)
    with pytest.raises(ValueError, match=r"none\.parquet: no questions"):
        load_qa_file(no_rows)
    with pytest.raises(ValueError, match=r"qa\.csv: unsupported"):
        load_qa_file(tmp_path / "qa.csv")
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes('{"question": "caf\u00e9?", "golden_answers": ["x"]}\n'.encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin\.jsonl: not UTF-8"):
        load_qa_file(latin)


def test_loaded_questions_go_through_the_composer(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "hotpot.jsonl", ROWS)
    tasks = load_qa_tasks(path, 2, seed=3)
    assert tasks == compose_tasks(load_qa_file(path), 2, seed=3, prefix="hotpot")
    assert len(tasks) == 2 and tasks[0].task_id == "hotpot-0"
    assert tasks[0].gold == "; ".join(q.answers[0] for q in tasks[0].objectives)
    assert len(load_qa_tasks(path, 2, num_tasks=7, seed=3, prefix="mix")) == 7


# ---- real-data formats: data_source, null cells, MEM1's pre-composed tasks -------------------------------------


def mem1_row(questions: list[str], target: list[list[str]], source: str = "hotpotqa") -> dict:
    """A row in MEM1's multi-objective layout (qa_search_*_merge_multi.py): a chat prompt whose text ends with the
    questions joined by "; ", one alias list per question under reward_model.ground_truth.target."""
    text = "You are a search agent ... Answer the following questions: " + "; ".join(questions)
    return {
        "data_source": source,
        "prompt": [{"role": "user", "content": text}],
        "ability": "fact-reasoning",
        "reward_model": {"style": "rule", "ground_truth": {"target": target}},
        "extra_info": {"split": "test", "index": 0},
    }


def test_mem1_parquet_rows_load_as_pre_composed_tasks(tmp_path: Path) -> None:
    rows = [
        mem1_row(
            ["who wrote the velvet almanac?", "when did the lighthouse open?"], [["Ida Moss", "I. Moss"], ["1911"]]
        ),
        # a "?" inside a question
        mem1_row(["who sang 'why?' first?", "what colour: the door?"], [["Annie Lennox"], ["blue"]], source="nq"),
    ]
    path = write_parquet(tmp_path / "test_mem1.parquet", rows)
    tasks = load_qa_items(path)
    assert [t.task_id for t in tasks] == ["test_mem1-1", "test_mem1-2"]
    assert tasks[0].objectives == (
        Question("who wrote the velvet almanac?", ("Ida Moss", "I. Moss"), "test_mem1-1-0", "hotpotqa"),
        Question("when did the lighthouse open?", ("1911",), "test_mem1-1-1", "hotpotqa"),
    )
    assert [(q.question, q.answers, q.source) for q in tasks[1].objectives] == [
        ("who sang 'why?' first?", ("Annie Lennox",), "nq"),
        ("what colour: the door?", ("blue",), "nq"),
    ]
    assert tasks[1].source == "nq" and tasks[0].question.startswith("(1) who wrote the velvet almanac?\n(2) when")
    with pytest.raises(ValueError, match=r"holds pre-composed tasks"):
        load_qa_file(path)


def test_mem1_count_mismatch_names_file_row_and_key(tmp_path: Path) -> None:
    rows = [
        mem1_row(["a one?", "a two?"], [["x"], ["y"]]),
        mem1_row(["b one?", "b two?", "b three?"], [["x"], ["y"]]),
    ]
    path = write_parquet(tmp_path / "multi.parquet", rows)
    with pytest.raises(ValueError) as err:
        load_qa_items(path)
    msg = str(err.value)
    assert str(path) in msg and "row 2" in msg and "key 'reward_model.ground_truth.target'" in msg
    assert "2 alias lists for 3 questions" in msg


def test_mempo_task_rows_and_mixed_kinds(tmp_path: Path) -> None:
    row = {"task_id": "t7", "data_source": "nq", "objectives": [{"question": "who?", "answers": ["Ann"], "qid": "q1"}]}
    tasks = load_qa_items(write_jsonl(tmp_path / "tasks.jsonl", [row]))
    assert tasks[0].task_id == "t7" and tasks[0].objectives == (Question("who?", ("Ann",), "q1", "nq"),)
    with pytest.raises(ValueError, match=r"mixed\.jsonl, line 2: .*one kind per file"):
        load_qa_items(write_jsonl(tmp_path / "mixed.jsonl", [row, GOOD]))


def test_null_cells_fall_back_per_cell(tmp_path: Path) -> None:
    """A null golden_answers fell back to nothing although answer held a value; a null id was an
    error. Each cell now falls back on its own."""
    rows = [
        {"id": "a", "question": "who?", "golden_answers": ["Ann"], "answer": None, "data_source": "nq"},
        {"id": None, "question": "what?", "golden_answers": None, "answer": "blue", "data_source": None},
    ]
    path = write_parquet(tmp_path / "nulls.parquet", rows)
    assert load_qa_file(path) == [
        Question("who?", ("Ann",), "a", "nq"),
        Question("what?", ("blue",), "nulls-2", "nulls"),
    ]


@pytest.mark.parametrize("split", ["train", "dev", "val", "validation", "test", "Test"])
def test_flashrag_layout_takes_the_source_from_the_dataset_folder(tmp_path: Path, split: str) -> None:
    """FlashRAG ships ``<dataset>/<split>.jsonl`` without data_source: the source was the split's name for every
    dataset. A row's own data_source still wins; a file named for its dataset keeps its stem."""
    rows = [{"question": "who?", "golden_answers": ["Ann"]}, {"question": "what?", "answer": "x", "data_source": "nq"}]
    folder = tmp_path / "triviaqa"
    folder.mkdir()
    path = write_jsonl(folder / f"{split}.jsonl", rows)
    assert [q.source for q in load_qa_file(path)] == ["triviaqa", "nq"]
    assert [q.qid for q in load_qa_file(path)] == [f"{split}-1", f"{split}-2"]  # ids keep the file stem
    flat = write_jsonl(folder / "popqa.jsonl", rows)
    assert [q.source for q in load_qa_file(flat)] == ["popqa", "nq"]
