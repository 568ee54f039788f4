"""A study's ledger (``study.ledger``, ``mempo.stages.ledger``): a tiny study (2 arms x 2 seeds, 1 step, the tiny
model) run with a ledger, then run again into a new run_dir (its run folders, checkpoints and warm start lost, as
on a new machine) with the same ledger: nothing but the warm start trains again, nothing is evaluated again, and the
report equals the first. Then the refusals: an arm trained with another config, a warm start with other weights, an
evaluation under another config, a damaged entry."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from mempo.eval.compare import GridResult
from mempo.eval.memory_credit import RECORD_KEYS, find_credit_file, load_credit
from mempo.stages import run_stage
from mempo.stages.config import compose_config
from mempo.stages.ledger import EVAL_FILE, RUN_FILES, entry_result, merged, read_entry, write_entry
from mempo.stages.reuse import ReuseError

BASE = ("+exp=study", "+debug=default", "trainer.max_steps=1", "study.memory_scores=false")


def study_cfg(run_dir: Path, ledger: Path, *extra: str):
    return compose_config(*BASE, f"run_dir={run_dir}", f"study.ledger={ledger}", *extra)


@pytest.fixture(scope="module")
def first_study(tiny_path, tmp_path_factory):
    root = tmp_path_factory.mktemp("ledger_study")
    summary = run_stage(study_cfg(root / "a", root / "ledger"))
    return root, summary


def test_each_checkpoint_lands_in_the_ledger_with_its_run_files(first_study) -> None:
    root, summary = first_study
    ledger = root / "ledger"
    labels = ["warm_start", "ablation_s0", "ablation_s1", "mempo_s0", "mempo_s1"]
    assert sorted(p.name for p in ledger.iterdir()) == sorted(labels)
    records = [json.loads(x) for x in (root / "a" / "eval" / "results.jsonl").read_text().splitlines()]
    for label in labels:
        entry = read_entry(ledger, label)
        own = [r for r in records if r["checkpoint"] == label]
        assert own and entry["result"]["records"] == own  # the very records of the study's evaluation
        assert {r["checkpoint"] for r in entry["result"]["rows"]} == {label}
        if label != "warm_start":  # an arm-seed: what it trained, from what, and what it logged
            run = root / "a" / label[:-3] / f"seed{label[-1]}"
            for name in ("study_run.yaml", "config.yaml", "metrics.csv"):
                assert (ledger / label / name).read_text() == (run / name).read_text()
            kept = {p.name.removesuffix(".gz") for p in (ledger / label).iterdir()} - {EVAL_FILE.removesuffix(".gz")}
            assert kept == {p.name for p in run.iterdir()} & set(RUN_FILES)
    assert summary["status"]["eval"] == "reused"  # each evaluated right after it trained; the end evaluates none


def test_a_study_run_again_without_its_run_folders_takes_every_result_from_the_ledger(first_study, monkeypatch) -> None:
    from evaluations import record_evaluated

    root, _ = first_study
    evaluated = record_evaluated(monkeypatch)
    summary = run_stage(study_cfg(root / "b", root / "ledger"))
    assert evaluated == []
    assert summary["status"] == {"warm_start": "trained", "ablation_s0": "ledger", "ablation_s1": "ledger",
                                 "mempo_s0": "ledger", "mempo_s1": "ledger",
                                 "eval": "none evaluated here; warm_start, ablation_s0, ablation_s1, mempo_s0, "
                                 "mempo_s1 from the ledger"}  # fmt: skip
    assert not (root / "b" / "mempo").exists()  # no arm-seed trained
    first, again = (json.loads((root / d / "study.json").read_text()) for d in ("a", "b"))
    assert again["comparisons"] == first["comparisons"] and again["horizon"] == first["horizon"]
    assert (root / "b" / "per_task.csv").read_text() == (root / "a" / "per_task.csv").read_text()
    lines = lambda d: sorted((root / d / "eval" / "results.jsonl").read_text().splitlines())  # noqa: E731
    assert lines("b") == lines("a")


def test_an_arm_seed_in_the_ledger_under_another_config_is_refused_naming_the_key(first_study) -> None:
    root, _ = first_study
    with pytest.raises(ReuseError, match=r"mempo seed 0: .*ledger/mempo_s0 holds a run trained with another config.*"
                       r"optim\.lr \(1e-05 -> 3e-05\)"):  # fmt: skip
        run_stage(study_cfg(root / "c", root / "ledger", "+study.arms.mempo.optim.lr=3e-5"))


def test_an_evaluation_under_another_config_is_refused_naming_the_key(first_study) -> None:
    root, _ = first_study
    with pytest.raises(ReuseError, match=r"ledger/warm_start holds warm_start's evaluation under another config: "
                       r"eval\.greedy \(True -> False\)"):  # fmt: skip
        run_stage(study_cfg(root / "b", root / "ledger", "eval.greedy=false"))


def test_a_warm_start_with_other_weights_is_refused_naming_both_fingerprints(first_study) -> None:
    from weights import retrain_in_place

    root, _ = first_study
    retrain_in_place(root / "b" / "warm_start" / "hf")
    with pytest.raises(ReuseError, match=r"warm_start with weights hf:[0-9a-f]{16}, but warm_start now has weights "
                       r"hf:[0-9a-f]{16}"):  # fmt: skip
        run_stage(study_cfg(root / "b", root / "ledger"))


def grid(*labels: str) -> GridResult:
    rows = [{"checkpoint": x, "agent": "memory", "objectives": 2, "tasks": 1, "em": 1.0} for x in labels]
    records = [{"checkpoint": x, "task_id": i} for i, x in enumerate(labels)]
    return GridResult(rows, records, [])


def test_an_entry_keeps_only_its_own_results_and_a_damaged_one_is_named(tmp_path) -> None:
    cfg = study_cfg(tmp_path / "run", tmp_path / "ledger")
    write_entry(tmp_path / "ledger", "mempo_s0", cfg, weights="hf:0", result=grid("warm_start", "mempo_s0"),
                run_folder=None)  # fmt: skip
    got = entry_result("mempo_s0", read_entry(tmp_path / "ledger", "mempo_s0"), cfg, weights="hf:0")
    assert got.rows == grid("mempo_s0").rows and got.records == [{"checkpoint": "mempo_s0", "task_id": 1}]
    assert read_entry(tmp_path / "ledger", "mempo_s1") is None
    path = tmp_path / "ledger" / "mempo_s0" / EVAL_FILE
    path.write_bytes(gzip.compress(b"{not json"))
    with pytest.raises(ValueError, match=rf"{path} does not read as gzip'd JSON"):
        read_entry(tmp_path / "ledger", "mempo_s0")
    path.write_bytes(gzip.compress(json.dumps({"label": "mempo_s1"}).encode()))
    with pytest.raises(ValueError, match=r"is not mempo_s0's entry \(keys missing: \['config', 'weights'"):
        read_entry(tmp_path / "ledger", "mempo_s0")


def test_an_entry_written_again_with_the_same_evaluation_keeps_its_time_of_writing(tmp_path, monkeypatch) -> None:
    import mempo.stages.ledger as ledger_module

    cfg = study_cfg(tmp_path / "run", tmp_path / "ledger")
    path = tmp_path / "ledger" / "ablation_s0" / EVAL_FILE
    written = []
    for when, em in (("first", 1.0), ("second", 1.0), ("third", 0.5)):
        monkeypatch.setattr(ledger_module.time, "strftime", lambda _fmt, when=when: when)
        result = grid("warm_start", "ablation_s0")
        result.rows[1]["em"] = em
        write_entry(tmp_path / "ledger", "ablation_s0", cfg, weights="hf:0", result=result, run_folder=None)
        written.append(read_entry(tmp_path / "ledger", "ablation_s0")["written"])
    # the second call held the first's evaluation (a study run again keeps it): left as written; the third's differs
    assert written == ["first", "first", "third"]
    assert read_entry(tmp_path / "ledger", "ablation_s0")["result"]["rows"][0]["em"] == 0.5
    path.write_bytes(gzip.compress(b"{damaged"))  # a damaged entry is written anew, not a crash
    write_entry(tmp_path / "ledger", "ablation_s0", cfg, weights="hf:0", result=grid("ablation_s0"), run_folder=None)
    assert read_entry(tmp_path / "ledger", "ablation_s0")["result"]["rows"][0]["em"] == 1.0


def test_a_runs_memory_credit_records_are_kept_gzipd_and_read_back_by_the_diagnostics(tmp_path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    records = [dict.fromkeys(RECORD_KEYS, 0) | {"memory": f"Q1: value {i}", "action": "search"} for i in range(3)]
    (run / "memory_credit.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    cfg = study_cfg(tmp_path / "run", tmp_path / "ledger")
    write_entry(tmp_path / "ledger", "mempo_s0", cfg, weights="hf:0", result=grid("mempo_s0"), run_folder=run)
    found = find_credit_file(tmp_path / "ledger" / "mempo_s0")
    assert found.name == "memory_credit.jsonl.gz" and gzip.decompress(found.read_bytes()).startswith(b"{")
    assert load_credit(found) == load_credit(run / "memory_credit.jsonl") and len(load_credit(found)) == 3


def test_merged_results_follow_the_checkpoint_order() -> None:
    got = merged([grid("mempo_s0"), grid("warm_start", "ablation_s0")], ["warm_start", "ablation_s0", "mempo_s0"])
    assert [r["checkpoint"] for r in got.rows] == ["warm_start", "ablation_s0", "mempo_s0"]
