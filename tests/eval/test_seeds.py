"""Seed-level statistics (mempo.eval.stats, mempo.eval.seeds): the seed-only t-interval, the pairing by seed and task,
and the seed-level report's comparisons (the seed-plus-task t-interval its verdict reads), against values worked out
by hand (tests/eval/test_crossed_interval.py checks the crossed-design intervals themselves)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from mempo.core.base import write_csv
from mempo.eval.report import MEAN_FIELDS, interval_table, main, mean_checkpoint
from mempo.eval.seeds import compare, paired_differences, paired_matrix, parse_arm, seed_study, study_markdown
from mempo.eval.stats import t_interval, t_quantile, verdict


def test_t_quantiles_are_the_printed_ones_and_the_expansion_continues_them() -> None:
    # Printed tables (two-sided 95%): df 1, 2, 3, 10, 30, 40, 120 -> 12.706, 4.303, 3.182, 2.228, 2.042, 2.021, 1.980
    for df, printed in ((1, 12.706), (2, 4.303), (3, 3.182), (10, 2.228), (30, 2.042), (40, 2.021), (120, 1.980)):
        assert t_quantile(df) == pytest.approx(printed, abs=6e-4)
    assert t_quantile(1, 0.99) == pytest.approx(63.657, abs=1e-3) and t_quantile(4, 0.90) == pytest.approx(
        2.132, abs=1e-3
    )
    assert t_quantile(30) > t_quantile(31) > t_quantile(1000) > 1.96
    with pytest.raises(ValueError, match="level must be one of"):
        t_quantile(3, 0.8)


def test_t_interval_by_hand() -> None:
    # [0.1, 0.3, 0.2]: mean 0.2, sd 0.1, se 0.1 / sqrt(3); t_{0.975, 2} = 4.3027 -> 0.2 +- 0.24841
    mean, low, high = t_interval([0.1, 0.3, 0.2])
    half = 4.3027 * 0.1 / math.sqrt(3)
    assert mean == pytest.approx(0.2) and low == pytest.approx(0.2 - half) and high == pytest.approx(0.2 + half)
    assert verdict(low, high) == "includes 0" and verdict(0.01, 0.2) == "above 0" and verdict(-0.3, -0.1) == "below 0"
    with pytest.raises(ValueError, match="at least two values"):
        t_interval([0.5])


def _scores(per_seed: dict[int, list[float]], order: int = 1) -> dict[int, dict[str, float]]:
    """seed -> task_id -> value, tasks inserted in order (1) or reversed (-1)."""
    return {s: dict(list({f"t{i}": v for i, v in enumerate(vals)}.items())[::order]) for s, vals in per_seed.items()}


def test_the_crossed_matrix_by_hand_and_seeds_on_other_tasks_refused() -> None:
    a = {0: {"t1": 0.0, "t0": 1.0}, 1: {"t0": 0.0, "t1": 0.0}}
    b = {0: {"t0": 1.0, "t1": 1.0}, 1: {"t1": 1.0, "t0": 0.0}}
    seeds, tasks, d = paired_matrix(a, b, names=("ablation", "mempo"))
    assert (seeds, tasks) == ([0, 1], ["t0", "t1"])
    assert d.tolist() == [[0.0, 1.0], [0.0, 1.0]]  # b - a by task id, whatever order the dicts hold them in
    a[1], b[1] = {"t0": 0.0, "t2": 0.0}, {"t0": 1.0, "t2": 1.0}  # seed 1 scored on other tasks than seed 0
    with pytest.raises(
        ValueError, match=r"mempo - ablation: seeds 0 and 1 hold different tasks \(e.g. \['t1', 't2'\]\)"
    ):
        paired_matrix(a, b, names=("ablation", "mempo"))


def test_pairing_by_seed_and_task_removes_the_seeds_spread() -> None:
    """B is A + 0.1 on every task of every seed, while A's seeds lie far apart (means 0.2, 0.5, 0.7) and so do
    the tasks within a seed: paired, each seed's difference is exactly 0.1 and so are both intervals; unpaired, the
    seeds' spread or the tasks' would swamp it."""
    a = _scores({0: [0.0, 0.4], 1: [0.3, 0.7], 2: [0.5, 0.9]})
    b = _scores({2: [0.6, 1.0], 0: [0.1, 0.5], 1: [0.4, 0.8]}, order=-1)  # other seed and task order
    got = compare(a, b)
    assert got["seeds"] == [0, 1, 2] and got["tasks"] == [2, 2, 2]
    assert got["per_seed"] == pytest.approx([0.1, 0.1, 0.1]) and got["mean"] == pytest.approx(0.1)
    assert got["interval"] == pytest.approx([0.1, 0.1]) and got["crossed_bootstrap"] == pytest.approx([0.1, 0.1])
    assert got["verdict"] == "above 0"


def test_the_paired_difference_of_each_seed_by_hand() -> None:
    a = _scores({0: [0, 1, 0, 1], 1: [1, 1, 0, 0]})
    b = _scores({0: [1, 1, 1, 1], 1: [0, 1, 0, 0]})
    # seed 0: +1 on t0 and t2 -> 0.5; seed 1: -1 on t0 -> -0.25. Seed-only t over [0.5, -0.25] (df 1): 0.125 +-
    # 12.7062 * 0.53033 / sqrt(2) = 0.125 +- 4.76483.
    got = compare(a, b)
    assert got["per_seed"] == pytest.approx([0.5, -0.25])
    half = 12.7062 * math.sqrt(((0.5 - 0.125) ** 2 + (-0.25 - 0.125) ** 2) / 1) / math.sqrt(2)
    assert got["seed_t_interval"] == pytest.approx([0.125 - half, 0.125 + half])
    # The verdict's: seed term s^2(0.5, -0.25) / 2 = 0.28125 / 2 = 0.140625; task means over seeds 0, 0, 0.5, 0:
    # s^2 = 0.0625, / 4 = 0.015625; Var = 0.15625. df = 0.15625^2 / (0.140625^2 / 1 + 0.015625^2 / 3) = 1.22951;
    # t between df 1 and 2, harmonic in 1 / df: w = (1 - 1 / 1.22951) / (1 - 1 / 2) = 0.37333 -> 12.7062 - 0.37333 *
    # (12.7062 - 4.3027) = 9.5689; half-width 9.5689 * sqrt(0.15625) = 3.78244
    assert got["df"] == pytest.approx(1.229508, abs=1e-6)
    assert got["interval"] == pytest.approx([0.125 - 3.78244, 0.125 + 3.78244], abs=1e-5)
    assert got["verdict"] == "includes 0"
    with pytest.raises(ValueError, match=r"seeds \[0\] against \[0, 1\]"):
        paired_differences(a, {0: b[0]})
    with pytest.raises(ValueError, match="seed 1: not the same tasks"):
        paired_differences(a, {0: b[0], 1: {"t0": 1.0}})


def _records(label: str, ems: list[float], n: int = 2) -> list[dict]:
    zeros = dict.fromkeys(MEAN_FIELDS, 0.0)  # the fields --mean averages (turns, tokens, ...)
    return [
        {"checkpoint": label, "agent": "memory", "objectives": n, "task_id": f"t{i}"} | zeros | {"em": e, "f1": e}
        for i, e in enumerate(ems)
    ]


# Three seeds, 40 tasks, EM. Against the ablation, MemPO's seed 0 wins tasks t0-t9 (+0.25), seed 1 wins t0-t3
# (+0.10), seed 2 loses t38-t39 (-0.05).
SEED_DIFFS = {0: range(0, 10), 1: range(0, 4), 2: range(38, 40)}


def _study_records() -> list[dict]:
    recs = []
    for s, won in SEED_DIFFS.items():
        base = [0.0] * 38 + [1.0, 1.0]
        recs += _records(f"ablation_s{s}", base)
        recs += _records(f"mempo_s{s}", [1.0 if i in won and i < 38 else 0.0 if i >= 38 and s == 2 else b
                                         for i, b in enumerate(base)])  # fmt: skip
    return recs + _records("warm", [0.0] * 40)


def test_a_tasks_only_interval_excludes_0_where_the_seed_level_one_does_not() -> None:
    recs = _study_records()
    # The tasks-only way (--mean): per task the mean over seeds, then a bootstrap over tasks with the seeds fixed.
    # Per task: t0-t3 +2/3, t4-t9 +1/3, t38-t39 -1/3, else 0: mean 0.1, per-task SD 0.238, interval about
    # 0.1 +- 0.074, above 0.
    rows, means = [], []
    for arm in ("ablation", "mempo"):
        r, m = mean_checkpoint(recs, arm, [f"{arm}_s{s}" for s in SEED_DIFFS])
        rows, means = rows + r, means + m
    line = next(x for x in interval_table(rows, means).splitlines() if x.startswith("| mempo - ablation"))
    assert "| 0.100 [0.0" in line and "excludes 0" in line
    # Seed level: per-seed differences 0.25, 0.10, -0.05 (seed term s^2 = 0.0225, / 3 = 0.0075); the task means over
    # seeds above (s^2 = (4 (2/3)^2 + 6 (1/3)^2 + 2 (1/3)^2 - 40 * 0.1^2) / 39 = 0.058120, / 40 = 0.0014530): Var =
    # 0.0089530, df = Var^2 / (0.0075^2 / 2 + 0.0014530^2 / 39) = 2.8445, t = 4.3027 - 0.89067 * 1.1203 = 3.3049
    # (harmonic between df 2 and 3), half-width 3.3049 * 0.094620 = 0.31271 -> [-0.21271, 0.41271], includes 0.
    study = seed_study(recs, {a: {s: f"{a}_s{s}" for s in SEED_DIFFS} for a in ("ablation", "mempo")})
    (c,) = study["comparisons"]
    assert c["em"]["per_seed"] == pytest.approx([0.25, 0.10, -0.05])
    assert c["em"]["df"] == pytest.approx(2.8445, abs=1e-4)
    assert c["em"]["interval"] == pytest.approx([0.1 - 0.31271, 0.1 + 0.31271], abs=1e-4)
    assert c["em"]["verdict"] == "includes 0"
    # S1-S4's seed-only t: 0.1 +- 4.3027 * 0.15 / sqrt(3) = 0.1 +- 0.37262
    assert c["em"]["seed_t_interval"] == pytest.approx([0.1 - 0.37262, 0.1 + 0.37262], abs=1e-4)


def test_seed_study_holds_every_arm_and_comparison() -> None:
    arms = {"ablation": {s: f"ablation_s{s}" for s in SEED_DIFFS}, "mempo": {s: f"mempo_s{s}" for s in SEED_DIFFS}}
    study = seed_study(_study_records(), arms, reference="ablation", warm_start="warm")
    assert study["objectives"] == [2] and study["reference"] == "ablation"
    assert study["arms"]["ablation"]["seeds"] == [0, 1, 2]
    assert study["arms"]["mempo"]["by_n"]["2"]["em"]["per_seed"] == pytest.approx([0.3, 0.15, 0.0])
    assert study["arms"]["mempo"]["by_n"]["2"]["em"]["mean"] == pytest.approx(0.15)
    assert study["warm_start"]["by_n"]["2"] == {"em": 0.0, "f1": 0.0}
    pairs = [(c["arm"], c["against"]) for c in study["comparisons"]]
    assert pairs == [("mempo", "ablation"), ("ablation", "warm_start"), ("mempo", "warm_start")]
    # The ablation's seeds are each 0.05 above the warm start, all from the same two tasks (t38, t39): the seed-only t
    # was zero-wide ("above 0" from 2 tasks); the task term sees them: s^2 of the task means (1, 1, 38 x 0) = (2 - 40 *
    # 0.05^2) / 39 = 0.048718, / 40 = 0.0012179, df = 39 (no seed term), t(39) = 2.0227: 0.05 +- 0.07059.
    vs_warm = study["comparisons"][1]["em"]
    assert vs_warm["per_seed"] == pytest.approx([0.05] * 3) and vs_warm["seed_t_interval"] == pytest.approx([0.05] * 2)
    assert vs_warm["df"] == pytest.approx(39.0) and vs_warm["verdict"] == "includes 0"
    assert vs_warm["interval"] == pytest.approx([0.05 - 0.07059, 0.05 + 0.07059], abs=1e-4)
    text = study_markdown(study)
    assert "| mempo - ablation | 2 | EM | 0.250, 0.100, -0.050 | 0.100 | [-0.213, 0.413] | 2.8 |" in text
    # also_reference: every other arm against it too; ablation - mempo is mempo - ablation's mirror image, by hand
    also = seed_study(_study_records(), arms, reference="ablation", warm_start="warm", also_reference=["mempo"])
    assert [(c["arm"], c["against"]) for c in also["comparisons"]] == [
        ("mempo", "ablation"), ("ablation", "mempo"), ("ablation", "warm_start"), ("mempo", "warm_start")
    ]  # fmt: skip
    assert also["also_reference"] == ["mempo"]
    assert "| ablation - mempo | 2 | EM | -0.250, -0.100, 0.050 | -0.100 | [-0.413, 0.213] | 2.8 |" in study_markdown(
        also
    )
    with pytest.raises(ValueError, match="reference arm 'grpo' is not among"):
        seed_study(_study_records(), arms, reference="grpo")
    with pytest.raises(ValueError, match="reference arm 'react' is not among"):
        seed_study(_study_records(), arms, reference="ablation", also_reference=["react"])
    with pytest.raises(ValueError, match="checkpoint 'nope': no records"):
        seed_study(_study_records(), {"x": {0: "nope"}})


def test_the_report_cli_seed_level_mode(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _study_records()))
    arms = [f"--arm={a}=" + ",".join(f"{s}:{a}_s{s}" for s in SEED_DIFFS) for a in ("ablation", "mempo")]
    main([str(tmp_path), *arms, "--warm-start", "warm", "--json", str(tmp_path / "study.json")])
    assert "| mempo - ablation | 2 | EM | 0.250, 0.100, -0.050 |" in capsys.readouterr().out
    assert json.loads((tmp_path / "study.json").read_text())["comparisons"][0]["em"]["verdict"] == "includes 0"
    assert parse_arm("mempo=0:a,1:b") == ("mempo", {0: "a", 1: "b"})
    with pytest.raises(ValueError, match="expected NAME=SEED:LABEL"):
        parse_arm("mempo=a,b")
    with pytest.raises(SystemExit, match="--arm: reference arm 'x'"):
        main([str(tmp_path), *arms, "--reference", "x"])


def test_turns_and_failures_per_arm_by_hand() -> None:
    from mempo.eval.failures import VERDICTS
    from mempo.eval.seeds import turns_and_failures, turns_and_failures_markdown

    recs = [{"checkpoint": c, "agent": "memory", "objectives": 2, "task_id": f"t{i}", "turns": t}
            for c, ts in (("a0", [3, 5]), ("a1", [4, 4]), ("w", [6, 6])) for i, t in enumerate(ts)]  # fmt: skip
    zero = dict.fromkeys(VERDICTS, 0)
    fails = [{"checkpoint": c, "agent": "memory", "objectives": 2} | zero | {"correct": k, "wrong_query": 4 - k}
             for c, k in (("a0", 3), ("a1", 1), ("w", 2))]  # fmt: skip
    got = turns_and_failures(recs, fails, {"warm_start": {0: "w"}, "a": {0: "a0", 1: "a1"}})
    assert got["a"]["2"]["turns_per_seed"] == [4.0, 4.0] and got["a"]["2"]["turns"] == 4.0
    assert got["a"]["2"]["verdicts"]["correct"] == 4 and got["a"]["2"]["verdicts"]["wrong_query"] == 4
    assert got["warm_start"]["2"]["turns"] == 6.0 and got["warm_start"]["2"]["verdicts"]["correct"] == 2
    assert "| a | 2 | 4.00, 4.00 | 4.000 | 4 | 0 | 4 |" in turns_and_failures_markdown(got)


def _write_eval(folder: Path, labels: dict[str, list[float]]) -> Path:
    folder.mkdir(parents=True)
    recs = [r for label, ems in labels.items() for r in _records(label, ems)]
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return folder


def test_report_arm_refuses_two_eval_dirs_that_hold_the_same_label(tmp_path: Path) -> None:
    """Two evaluations that both use the demo's labels warm_start and rl (one per RL seed): seed 0's rl is +0.25 over
    the warm start, seed 1's -0.25. Merged by task id they would be one run counted twice ([-0.25, -0.25], a
    zero-wide seed-only interval): refused, naming the label and both folders."""
    a = _write_eval(tmp_path / "seed0", {"warm_start": [0, 0, 1, 1], "rl": [1, 0, 1, 1]})
    b = _write_eval(tmp_path / "seed1", {"warm_start": [0, 0, 1, 1], "rl": [0, 0, 0, 1]})
    with pytest.raises(SystemExit, match=rf"checkpoint 'warm_start'.*both {a}.* and {b}"):
        main([str(a), str(b), "--arm", "rl=0:rl,1:rl", "--warm-start", "warm_start"])
    # the same folder given twice is the same mistake
    with pytest.raises(SystemExit, match=rf"checkpoint 'warm_start'.*both {a}.* and {a}"):
        main([str(a), str(a), "--arm", "rl=0:rl", "--warm-start", "warm_start"])


def test_a_label_serving_two_seeds_or_two_arms_is_refused(tmp_path: Path) -> None:
    d = _write_eval(tmp_path / "ev", {"warm_start": [0, 0, 1, 1], "rl": [1, 0, 1, 1], "rl2": [0, 0, 0, 1]})
    with pytest.raises(SystemExit, match="label 'rl' serves both arm 'rl' seed 0 and arm 'rl' seed 1"):
        main([str(d), "--arm", "rl=0:rl,1:rl", "--warm-start", "warm_start"])
    with pytest.raises(SystemExit, match="label 'rl2' serves both arm 'a' seed 1 and arm 'b' seed 1"):
        main([str(d), "--arm", "a=0:rl,1:rl2", "--arm", "b=1:rl2"])
    with pytest.raises(SystemExit, match="label 'warm_start' serves both the warm start and arm 'a' seed 0"):
        main([str(d), "--arm", "a=0:warm_start,1:rl", "--warm-start", "warm_start"])


def test_a_task_id_repeated_for_one_label_is_refused() -> None:
    """Records that repeat a task id for one label (two tasks sharing an id, or two evaluations merged) would keep
    one of them silently."""
    recs = _records("x", [1, 0]) + _records("x", [0])
    with pytest.raises(ValueError, match="checkpoint 'x': task 't0' has two records at agent=memory, N=2"):
        seed_study(recs, {"x": {0: "x"}})


def test_per_task_rows_recompute_the_study(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """per_task.csv's rows (what the study commits) give back the same comparisons as the records they came from,
    memory scores included; through the CLI (``--per-task``) the same table as ``--arm`` on the evaluation."""
    from mempo.eval.memory_scores import score_means
    from mempo.eval.seeds import PER_TASK_COLUMNS, per_task_rows, study_from_per_task

    recs = _study_records()
    arms = {a: {s: f"{a}_s{s}" for s in SEED_DIFFS} for a in ("ablation", "mempo")}
    # memory scores on t0-t2 of every checkpoint: mempo's seed s at 0.3 + s / 100, the ablation's 0.2, warm 0.1
    means = {(f"{a}_s{s}", 2): dict.fromkeys(("t0", "t1", "t2"), 0.3 + s / 100 if a == "mempo" else 0.2)
             for a in arms for s in SEED_DIFFS} | {("warm", 2): dict.fromkeys(("t0", "t1", "t2"), 0.1)}  # fmt: skip
    rows = per_task_rows(recs, arms, warm_start="warm", memory_means=means)
    assert len(rows) == 7 * 40 and list(rows[0]) == PER_TASK_COLUMNS
    assert rows[0] == {"arm": "warm_start", "seed": "", "N": 2, "task": "t0", "em": 0.0, "f1": 0.0,
                       "memory_score": 0.1}  # fmt: skip
    # sorted by task id, t9 is the last of t0..t39: the ablation's seed 0 scores 0 there and wrote no scored memory
    assert rows[40 + 39] == {"arm": "ablation", "seed": "0", "N": 2, "task": "t9", "em": 0.0, "f1": 0.0,
                             "memory_score": ""}  # fmt: skip
    csv_path = tmp_path / "per_task.csv"
    write_csv(csv_path, rows, PER_TASK_COLUMNS)
    with csv_path.open(newline="") as f:
        back, back_arms, warm, back_means = study_from_per_task(list(csv.DictReader(f)))
    assert back_arms == arms and warm == "warm_start"
    want = seed_study(recs, arms, warm_start="warm")["comparisons"]
    got = seed_study(back, back_arms, warm_start=warm)["comparisons"]
    assert [c["em"]["interval"] for c in got] == [c["em"]["interval"] for c in want]
    assert [c["em"]["verdict"] for c in got] == [c["em"]["verdict"] for c in want]
    scores = score_means(back_means, back_arms, memories=None, reference="ablation", warm_start=warm)
    mempo_vs_ablation = scores["comparisons"][0]["p_gold"]  # 0.1 + s / 100 at seeds 0, 1, 2 on the same 3 tasks
    assert mempo_vs_ablation["per_seed"] == pytest.approx([0.10, 0.11, 0.12])
    # the CLI: the same EM table as --arm on the evaluation itself
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    main([str(tmp_path), *[f"--arm={a}=" + ",".join(f"{s}:{a}_s{s}" for s in SEED_DIFFS) for a in arms]])
    from_eval = capsys.readouterr().out
    (tmp_path / "study.json").write_text(json.dumps({"reference": "ablation"}))  # what the study writes beside it
    main(["--per-task", str(csv_path)])
    from_csv = capsys.readouterr().out
    line = "| mempo - ablation | 2 | EM | 0.250, 0.100, -0.050 | 0.100 | [-0.213, 0.413] | 2.8 |"
    assert line in from_eval and line in from_csv and "P_GOLD" in from_csv
    bad = [dict(r) for r in rows[:2]]
    bad[1]["N"] = "two"
    with pytest.raises(ValueError, match="per_task.csv line 3: invalid literal"):
        study_from_per_task([{k: str(v) for k, v in r.items()} for r in bad])


def test_arms_of_two_agents_pair_by_seed_and_task_and_each_meets_its_own_warm_start() -> None:
    """A GRPO arm (memory agent, from warm_start) and a ReAct arm (full-history agent, from react_warm_start), two
    seeds, four tasks; grpo_s0 is also in the records as a full-history agent, a decoy the agent filter must skip.
    Seed means by hand: warm_start 0.5, react_warm_start 0.25, grpo 0.75 / 1.0, react 0.5 / 0.5."""
    em = {
        ("warm_start", "memory"): [0, 0, 1, 1],
        ("react_warm_start", "full_history"): [0, 1, 0, 0],
        ("grpo_s0", "memory"): [1, 0, 1, 1],
        ("grpo_s1", "memory"): [1, 1, 1, 1],
        ("grpo_s0", "full_history"): [0, 0, 0, 0],
        ("react_s0", "full_history"): [0, 1, 1, 0],
        ("react_s1", "full_history"): [1, 1, 0, 0],
    }
    records = [{"checkpoint": c, "agent": a, "objectives": 2, "task_id": f"t{i}", "em": float(v), "f1": float(v)}
               for (c, a), vs in em.items() for i, v in enumerate(vs)]  # fmt: skip
    arms = {"grpo": {0: "grpo_s0", 1: "grpo_s1"}, "react": {0: "react_s0", 1: "react_s1"}}
    agents = {"react_s0": "full_history", "react_s1": "full_history", "react_warm_start": "full_history"}
    study = seed_study(records, arms, reference="grpo", warm_start="warm_start", agents=agents,
                       arm_warm_starts={"react": "react_warm_start"})  # fmt: skip
    got = {(c["arm"], c["against"]): c["em"]["per_seed"] for c in study["comparisons"]}
    assert got == {
        ("react", "grpo"): pytest.approx([-0.25, -0.5]),
        ("grpo", "warm_start"): pytest.approx([0.25, 0.5]),
        ("react", "react_warm_start"): pytest.approx([0.25, 0.25]),
    }
    assert study["other_warm_starts"]["react_warm_start"]["by_n"]["2"]["em"] == 0.25
    assert study["warm_start"]["by_n"]["2"]["em"] == 0.5
    # per_task.csv's rows (each label's own agent; the ReAct warm start a row set of its own) give back the same
    from mempo.eval.seeds import per_task_rows, study_from_per_task

    rows = per_task_rows(records, arms, warm_start="warm_start", agents=agents, other_warm_starts=["react_warm_start"])
    assert len(rows) == 6 * 4 and {r["arm"] for r in rows if r["seed"] == ""} == {"warm_start", "react_warm_start"}
    back, back_arms, warm, _ = study_from_per_task([{k: str(v) for k, v in r.items()} for r in rows])
    again = seed_study(back, back_arms, reference="grpo", warm_start=warm,
                       arm_warm_starts={"react": "react_warm_start"})  # fmt: skip
    assert [c["em"]["per_seed"] for c in again["comparisons"]] == [c["em"]["per_seed"] for c in study["comparisons"]]
    with pytest.raises(ValueError, match="'warm_start' serves both"):
        seed_study(records, {"a": {0: "warm_start"}}, warm_start="x", arm_warm_starts={"a": "warm_start"})
