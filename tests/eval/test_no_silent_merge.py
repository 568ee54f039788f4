"""mempo/eval reads nothing twice and merges nothing silently: the report's default mode refuses a label
that two evaluation folders hold, every reader refuses a repeated row naming its file, line and key, and
``--per-task`` compares against the study's own reference arm. Expected values are worked out by hand."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from mempo.eval.memory_scores import MemoryItem, read_turn_scores, task_means, turn_scores
from mempo.eval.report import TABLE_COLUMNS, interval_table, main, mean_checkpoint, read_records
from mempo.eval.seed_curves import curve_tensor
from mempo.eval.seeds import PER_TASK_COLUMNS, study_from_per_task


def _record(checkpoint: str, task: str, em: float) -> dict:
    return {"checkpoint": checkpoint, "agent": "memory", "objectives": 2, "task_id": task, "em": em, "f1": em,
            "reward": em, "format_fail": 0.0, "turns": 4.0, "tt": 100.0, "pt": 50.0}  # fmt: skip


def _eval_dir(folder: Path, em: dict[str, list[float]]) -> Path:
    """An evaluation folder as experiments/eval.py leaves it (table.csv, results.jsonl), checkpoint -> EM per task."""
    folder.mkdir(parents=True)
    records = [_record(c, f"t{i}", v) for c, vs in em.items() for i, v in enumerate(vs)]
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    with (folder / "table.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=TABLE_COLUMNS)
        w.writeheader()
        for c, vs in em.items():
            mean = sum(vs) / len(vs)
            w.writerow({"checkpoint": c, "agent": "memory", "objectives": 2, "tasks": len(vs), "em": mean,
                        "em_lo": mean, "em_hi": mean, "f1": mean, "f1_lo": mean, "f1_hi": mean, "reward": mean,
                        "format_fail": 0, "turns": 4, "tt": 100, "pt": 50})  # fmt: skip
    return folder


def test_the_default_mode_refuses_a_label_two_folders_hold(tmp_path: Path, capsys) -> None:
    """Two main-job evaluations, each of warm_start and rl: in A rl - warm_start = +1 on every task, in B 0. Merged,
    the table paired whichever folder came last (it printed "0.000 ... includes 0")."""
    a = _eval_dir(tmp_path / "a", {"warm_start": [0, 0, 0, 0], "rl": [1, 1, 1, 1]})
    b = _eval_dir(tmp_path / "b", {"warm_start": [1, 1, 1, 1], "rl": [1, 1, 1, 1]})
    with pytest.raises(SystemExit, match=rf"'warm_start' \(agent=memory, N=2\) has records in both {a} and {b}"):
        main([str(a), str(b)])
    main([str(a)])  # one folder: rl - warm_start = +1 on each of the 4 tasks
    assert "| rl - warm_start | 2 | 4 | 1.000 [1.000, 1.000] excludes 0" in capsys.readouterr().out


def test_an_evaluations_run_dir_is_read_as_its_eval_folder_and_a_folder_without_results_is_refused(
    tmp_path: Path, capsys
) -> None:
    """experiments/eval.py's run_dir holds the evaluation in eval/: the report reads it given either folder (it
    raised a bare FileNotFoundError for the run_dir), in both modes; a folder with neither is refused naming both."""
    _eval_dir(tmp_path / "run" / "eval", {"warm_start": [0, 0, 0, 0], "rl": [1, 1, 1, 0]})
    for folder in (tmp_path / "run", tmp_path / "run" / "eval"):
        main([str(folder)])
        assert "| rl - warm_start | 2 | 4 | 0.750 [" in capsys.readouterr().out
    main([str(tmp_path / "run"), "--arm", "a=0:rl", "--reference", "a"])
    assert "| a | 2 | 0 | 0.750 | 0.750 |" in capsys.readouterr().out
    empty = tmp_path / "empty"
    empty.mkdir()
    for argv in ([str(empty)], [str(empty), "--arm", "a=0:rl", "--reference", "a"]):
        with pytest.raises(SystemExit, match=f"{empty}: no results.jsonl there or in {empty / 'eval'}"):
            main(argv)


def test_results_jsonl_with_a_repeated_rollout_is_refused_naming_file_line_and_key(tmp_path: Path) -> None:
    folder = _eval_dir(tmp_path / "e", {"rl": [1, 0]})
    lines = (folder / "results.jsonl").read_text().splitlines()
    (folder / "results.jsonl").write_text("\n".join([*lines, lines[0]]) + "\n")
    pattern = rf"{folder / 'results.jsonl'}, line 3 repeats line 1: checkpoint='rl', agent='memory', objectives=2, "
    with pytest.raises(ValueError, match=pattern + "task_id='t0'"):
        read_records(folder / "results.jsonl")


def test_memory_scores_csv_with_a_repeated_row_is_refused(tmp_path: Path) -> None:
    """One repeated (checkpoint, N, task, turn): P_GOLD_TURN kept the last value, P_GOLD averaged both."""
    path = tmp_path / "memory_scores.csv"
    rows = [("mempo_s0", 2, "t0", 1, 0.25), ("mempo_s0", 2, "t0", 2, 0.5), ("mempo_s0", 2, "t0", 2, 0.75)]
    path.write_text("checkpoint,objectives,task_id,turn,p_gold\n" + "".join(",".join(map(str, r)) + "\n" for r in rows))
    with pytest.raises(ValueError, match=rf"{path}, line 4 repeats line 3: checkpoint='mempo_s0', objectives=2, "
                       "task_id='t0', turn=2"):  # fmt: skip
        read_turn_scores(path)


def test_scored_memories_with_a_repeated_turn_are_refused_by_both_readers() -> None:
    items = [MemoryItem("mempo_s0", 2, "t0", turn, "q", "m", "g") for turn in (1, 2, 2)]
    for reader in (task_means, turn_scores):
        with pytest.raises(ValueError, match=r"memory 3 repeats memory 2: checkpoint='mempo_s0', objectives=2, "
                           "task_id='t0', turn=2"):  # fmt: skip
            reader(items, [0.25, 0.5, 0.75])
    means = task_means(items[:2], [0.25, 0.5])  # two turns of one task: their mean
    assert means == {("mempo_s0", 2): {"t0": 0.375}}


def test_in_memory_records_with_a_repeated_task_are_refused() -> None:
    records = [_record("warm_start", "t0", 0.0), _record("s10", "t0", 1.0), _record("s10", "t0", 0.0)]
    with pytest.raises(ValueError, match=r"seed seed0: record 3 repeats record 2: checkpoint='s10'"):
        curve_tensor({"seed0": records})
    with pytest.raises(ValueError, match=r"record 3 repeats record 2: checkpoint='s10'"):
        mean_checkpoint(records + [_record("s20", "t0", 1.0)], "m", ["s10", "s20"])
    rows = [{"checkpoint": c, "agent": "memory", "objectives": 2, "tasks": 1, "em": 0.0, "em_lo": 0.0, "em_hi": 0.0,
             "f1": 0.0, "f1_lo": 0.0, "f1_hi": 0.0, "format_fail": 0, "turns": 4, "tt": 1, "pt": 1}
            for c in ("warm_start", "s10")]  # fmt: skip
    with pytest.raises(ValueError, match=r"record 3 repeats record 2"):
        interval_table(rows, records)


def _per_task_csv(path: Path, rows: list[tuple]) -> Path:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(PER_TASK_COLUMNS)
        w.writerows(rows)
    return path


def test_per_task_csv_with_a_repeated_row_is_refused(tmp_path: Path) -> None:
    path = _per_task_csv(tmp_path / "per_task.csv", [("a", 0, 2, "t0", 1, 1, ""), ("a", 0, 2, "t0", 0, 0, "")])
    with path.open(newline="") as f:
        with pytest.raises(ValueError, match=r"per_task.csv line 3 repeats line 2: arm='a', seed='0', N='2', "
                           "task='t0'"):  # fmt: skip
            study_from_per_task(list(csv.DictReader(f)))


def test_per_task_compares_against_the_studys_reference(tmp_path: Path) -> None:
    """A study whose reference was arm b (not the first arm): study.json beside per_task.csv records it, and the
    recomputed tables compare a against b. Hand-computed: a - b = 0 - 1 = -1 on both tasks of both seeds."""
    rows = [(arm, s, 2, f"t{i}", v, v, "") for arm, v in (("a", 0), ("b", 1)) for s in (0, 1) for i in range(2)]
    folder = tmp_path / "study"
    folder.mkdir()
    path = _per_task_csv(folder / "per_task.csv", rows)
    (folder / "study.json").write_text(json.dumps({"stage": "study", "reference": "b"}))
    out = tmp_path / "report.json"
    main(["--per-task", str(path), "--json", str(out)])
    report = json.loads(out.read_text())["study"]
    assert report["reference"] == "b"
    (row,) = [c for c in report["comparisons"] if c["arm"] == "a"]
    assert (row["against"], row["em"]["mean"]) == ("b", -1.0)
    main(["--per-task", str(path), "--reference", "a", "--json", str(out)])  # asked for: another reference
    assert json.loads(out.read_text())["study"]["reference"] == "a"


def test_per_task_without_the_studys_record_names_the_file_and_the_way_out(tmp_path: Path) -> None:
    rows = [(arm, s, 2, f"t{i}", v, v, "") for arm, v in (("a", 0), ("b", 1)) for s in (0, 1) for i in range(2)]
    path = _per_task_csv(tmp_path / "per_task.csv", rows)
    with pytest.raises(SystemExit, match=r"study\.json, which is missing; give --reference ARM"):
        main(["--per-task", str(path)])
    # A damaged study.json is refused even with --reference: its design (the arms' own warm starts) would be lost.
    (tmp_path / "study.json").write_text('{"stage": "study", "design": ')
    for args in ([], ["--reference", "b"]):
        with pytest.raises(SystemExit, match=r"study\.json does not read as JSON \(Expecting value: line 1"):
            main(["--per-task", str(path), *args])
    (tmp_path / "study.json").write_text("[]")
    with pytest.raises(SystemExit, match=r"study\.json holds a JSON list, not an object"):
        main(["--per-task", str(path), "--reference", "b"])
    (tmp_path / "study.json").write_text(json.dumps({"stage": "study"}))
    with pytest.raises(SystemExit, match=r"study\.json records no reference arm; give --reference ARM"):
        main(["--per-task", str(path)])
    main(["--per-task", str(path), "--reference", "b", "--json", str(tmp_path / "r.json")])  # the way out works
    assert json.loads((tmp_path / "r.json").read_text())["study"]["reference"] == "b"
