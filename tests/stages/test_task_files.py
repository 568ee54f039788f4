"""``build_tasks`` over several real-data files: task ids unique across files, each file's source kept in FlashRAG's
``<dataset>/<split>.jsonl`` layout, and evaluation / validation subsets of a pre-composed file drawn by source with
the seed (not its first rows), with the per-source counts on the console."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mempo.stages.builders import build_tasks

MEM1_LEAD = "Answer the following questions: "  # MEM1's own prompt text (qa_search_test_merge_multi.py)


def mem1_rows(source: str | None, n_tasks: int, objectives: int = 2, tag: str = "") -> list[dict]:
    """``n_tasks`` rows in MEM1's multi-objective layout, each question unique (``tag`` keeps files apart)."""
    rows = []
    for t in range(n_tasks):
        questions = [f"{source or tag} {tag} question {t} part {i}?" for i in range(objectives)]
        row = {
            "prompt": [{"role": "user", "content": "Search, then answer. " + MEM1_LEAD + "; ".join(questions)}],
            "reward_model": {
                "style": "rule",
                "ground_truth": {"target": [[f"answer {t}-{i}"] for i in range(objectives)]},
            },
        }
        if source is not None:
            row["data_source"] = source
        rows.append(row)
    return rows


def write_parquet(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def flashrag_rows(dataset: str, n: int) -> list[dict]:
    """FlashRAG's own rows: id, question, golden_answers, and no data_source."""
    return [
        {"id": f"test_{i}", "question": f"{dataset} question {i}?", "golden_answers": [f"{dataset} {i}"]}
        for i in range(n)
    ]


def qa_cfg(make_cfg, tmp_path: Path, test_files: list[Path], *extra: str):
    train = write_jsonl(
        tmp_path / "train_only" / "train.jsonl", [{"question": "a training question?", "golden_answers": ["x"]}]
    )
    files = ",".join(str(f) for f in test_files)
    return make_cfg("data=qa_files", "env=http", f"data.train_files=[{train}]", f"data.test_files=[{files}]", *extra)


# ---- task ids ----------------------------------------------------------------------------------------------------


def test_task_ids_are_unique_across_files_with_one_stem(make_cfg, tmp_path: Path) -> None:
    """MEM1's script writes test.parquet into each output folder: a/test.parquet and b/test.parquet both gave
    test-1, test-2, test-3, and every consumer keyed by task id kept one task of each pair."""
    a = write_parquet(tmp_path / "a" / "test.parquet", mem1_rows("nq", 3, tag="a"))
    b = write_parquet(tmp_path / "b" / "test.parquet", mem1_rows("nq", 3, tag="b"))
    tasks = build_tasks(qa_cfg(make_cfg, tmp_path, [a, b]), "test", objectives=2)
    ids = [t.task_id for t in tasks]
    assert len(tasks) == 6 and len(set(ids)) == 6, ids
    assert ids == ["a-test-1", "a-test-2", "a-test-3", "b-test-1", "b-test-2", "b-test-3"]
    qids = [q.qid for t in tasks for q in t.objectives]
    assert len(set(qids)) == len(qids) == 12
    # One file: the ids a single-file run always had.
    one = build_tasks(qa_cfg(make_cfg, tmp_path, [a]), "test", objectives=2)
    assert [t.task_id for t in one] == ["test-1", "test-2", "test-3"]


def test_a_task_id_given_twice_is_refused_naming_both_files(make_cfg, tmp_path: Path) -> None:
    row = {
        "task_id": "t7",
        "objectives": [{"question": "who?", "answers": ["Ann"]}, {"question": "what?", "answers": ["x"]}],
    }
    other = {**row, "objectives": [{"question": "where?", "answers": ["y"]}, {"question": "when?", "answers": ["z"]}]}
    a = write_jsonl(tmp_path / "one.jsonl", [row])
    b = write_jsonl(tmp_path / "two.jsonl", [other])
    with pytest.raises(ValueError, match=r"task id 't7' .*one\.jsonl.* and .*two\.jsonl"):
        build_tasks(qa_cfg(make_cfg, tmp_path, [a, b]), "test", objectives=2)
    with pytest.raises(ValueError, match=r"data\.test_files lists .*one\.jsonl twice"):
        build_tasks(qa_cfg(make_cfg, tmp_path, [a, a]), "test", objectives=2)


# ---- sources in FlashRAG's layout ----------------------------------------------------------------------------------


def test_flashrag_layout_keeps_each_datasets_source_under_by_source(make_cfg, tmp_path: Path) -> None:
    """nq/test.jsonl and triviaqa/test.jsonl without data_source were both source "test": compose=by_source mixed
    the two datasets and the per-source tables vanished."""
    nq = write_jsonl(tmp_path / "nq" / "test.jsonl", flashrag_rows("nq", 20))
    tqa = write_jsonl(tmp_path / "triviaqa" / "test.jsonl", flashrag_rows("triviaqa", 20))
    tasks = build_tasks(qa_cfg(make_cfg, tmp_path, [nq, tqa], "data.compose=by_source"), "test", objectives=2)
    assert len(tasks) == 20
    for t in tasks:  # every task's questions come from one dataset, and its source says which
        datasets = {q.question.split()[0] for q in t.objectives}
        assert len(datasets) == 1 and t.source == datasets.pop(), t
    assert Counter(t.source for t in tasks) == {"nq": 10, "triviaqa": 10}


def test_flat_layout_keeps_the_file_stem_as_source(make_cfg, tmp_path: Path) -> None:
    nq = write_jsonl(tmp_path / "flat" / "nq.jsonl", flashrag_rows("nq", 4))
    tqa = write_jsonl(tmp_path / "flat" / "triviaqa.jsonl", flashrag_rows("triviaqa", 4))
    tasks = build_tasks(qa_cfg(make_cfg, tmp_path, [nq, tqa], "data.compose=by_source"), "test", objectives=2)
    assert Counter(t.source for t in tasks) == {"nq": 2, "triviaqa": 2}


# ---- evaluation and validation subsets -----------------------------------------------------------------------------


def test_a_subset_of_a_pre_composed_file_is_drawn_by_source_with_the_seed(make_cfg, tmp_path: Path, capsys) -> None:
    """MEM1's test parquet is its sources one after the other (nq first): eval.num_tasks=128 took the first 128
    rows, all NQ. 200 rows of nq then 200 of hotpotqa, 128 tasks: 64 of each (their shares of the file), the same
    subset for the same seed, another for another seed."""
    path = write_parquet(tmp_path / "mem1" / "test.parquet", mem1_rows("nq", 200) + mem1_rows("hotpotqa", 200))
    cfg = qa_cfg(make_cfg, tmp_path, [path])
    tasks = build_tasks(cfg, "test", num_tasks=128, objectives=2)
    assert Counter(t.source for t in tasks) == {"nq": 64, "hotpotqa": 64}
    assert len({t.task_id for t in tasks}) == 128
    line = [s for s in capsys.readouterr().out.splitlines() if "128 of 400" in s]
    assert len(line) == 1 and "nq 64" in line[0] and "hotpotqa 64" in line[0], line
    again = build_tasks(cfg, "test", num_tasks=128, objectives=2)
    assert [t.task_id for t in again] == [t.task_id for t in tasks]
    other = build_tasks(qa_cfg(make_cfg, tmp_path, [path], "seed=1"), "test", num_tasks=128, objectives=2)
    assert {t.task_id for t in other} != {t.task_id for t in tasks}
    # Not the first rows of each source either: row ids are 1..200 for nq.
    assert max(int(t.task_id.split("-")[1]) for t in tasks if t.source == "nq") > 64
    # Every task of the file: file order, as before.
    assert [t.task_id for t in build_tasks(cfg, "test", objectives=2)] == [f"test-{i}" for i in range(1, 401)]


def test_validation_on_a_pre_composed_file_is_drawn_by_source(make_cfg, tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "mem1" / "val.parquet", mem1_rows("nq", 30) + mem1_rows("hotpotqa", 10))
    train = write_jsonl(
        tmp_path / "train_only" / "train.jsonl", [{"question": "a training question?", "golden_answers": ["x"]}]
    )
    cfg = make_cfg("data=qa_files", "env=http", f"data.train_files=[{train}]", f"data.val_files=[{path}]")
    tasks = build_tasks(cfg, "val", num_tasks=16)
    assert Counter(t.source for t in tasks) == {"nq": 12, "hotpotqa": 4}  # 16 x 30/40 and 16 x 10/40
