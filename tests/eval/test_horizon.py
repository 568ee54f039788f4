"""The horizon table and figure (mempo.eval.horizon): per arm and N the EM interval of the crossed design (or the
tasks' bootstrap for one seed), token means and ratios per N, against values worked out by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from mempo.eval.horizon import horizon_markdown, horizon_rows, plot_horizon, token_ratios_by_n


def _rec(label: str, agent: str, n: int, task: str, em: float, pt: float, tt: float) -> dict:
    return {"checkpoint": label, "agent": agent, "objectives": n, "task_id": task, "em": em, "f1": em, "pt": pt,
            "tt": tt}  # fmt: skip


def _records() -> list[dict]:
    rows = []
    # mempo, 2 seeds x 3 tasks at N=2: EM seed 0 [1, 0, 1], seed 1 [1, 1, 0]; PT 100, TT 300 everywhere
    for label, ems in (("mempo_s0", [1, 0, 1]), ("mempo_s1", [1, 1, 0])):
        rows += [_rec(label, "memory", 2, f"t{i}", e, 100.0, 300.0) for i, e in enumerate(ems)]
    # at N=4: every task right in both seeds; PT 120, TT 600
    for label in ("mempo_s0", "mempo_s1"):
        rows += [_rec(label, "memory", 4, f"u{i}", 1.0, 120.0, 600.0) for i in range(3)]
    # a ReAct arm of 2 seeds: PT 200 / 480 at N=2 / 4, TT 400 / 1200
    for label in ("react_s0", "react_s1"):
        rows += [_rec(label, "full_history", 2, f"t{i}", 1.0, 200.0, 400.0) for i in range(3)]
        rows += [_rec(label, "full_history", 4, f"u{i}", 0.0, 480.0, 1200.0) for i in range(3)]
    # the warm start, one seed, every task wrong at N=2
    rows += [_rec("warm_start", "memory", 2, f"t{i}", 0.0, 90.0, 250.0) for i in range(3)]
    return rows


ARMS = {"warm_start": {0: "warm_start"}, "mempo": {0: "mempo_s0", 1: "mempo_s1"},
        "react": {0: "react_s0", 1: "react_s1"}}  # fmt: skip
AGENTS = {"react_s0": "full_history", "react_s1": "full_history"}


def test_the_rows_carry_the_crossed_interval_and_the_token_means() -> None:
    rows = {(r["arm"], r["objectives"]): r for r in horizon_rows(_records(), ARMS, agents=AGENTS)}
    assert list(rows) == [("warm_start", 2), ("mempo", 2), ("mempo", 4), ("react", 2), ("react", 4)]
    m = rows[("mempo", 2)]
    # by hand: mean 4/6; the seed means are equal (seed term 0); task means [1, .5, .5] have variance 1/12, over T=3
    # 1/36, so the standard error is 1/6 with df = 2 (the task term alone), t(0.975, 2) = 4.303
    assert m["em"] == pytest.approx(2 / 3)
    assert (m["em_lo"], m["em_hi"]) == pytest.approx((2 / 3 - 4.303 / 6, 2 / 3 + 4.303 / 6), abs=1e-3)
    assert m["interval"] == "seed+task t" and m["seeds"] == 2 and m["tasks"] == 3 and m["agent"] == "memory"
    assert (m["pt"], m["tt"]) == (100.0, 300.0)
    assert (rows[("mempo", 4)]["em_lo"], rows[("mempo", 4)]["em_hi"]) == (1.0, 1.0)  # no spread at all
    w = rows[("warm_start", 2)]
    assert w["interval"] == "task bootstrap" and (w["em"], w["em_lo"], w["em_hi"]) == (0.0, 0.0, 0.0)
    assert rows[("react", 4)]["agent"] == "full_history" and rows[("react", 4)]["pt"] == 480.0


def test_token_ratios_per_n_compare_the_same_n_only() -> None:
    rows = horizon_rows(_records(), ARMS, agents=AGENTS)
    got = token_ratios_by_n(rows, [("mempo", "react"), ("mempo", "warm_start")])
    assert got == [
        {"arm": "mempo", "against": "react", "objectives": 2, "tt_ratio": 300 / 400, "pt_ratio": 100 / 200},
        {"arm": "mempo", "against": "react", "objectives": 4, "tt_ratio": 600 / 1200, "pt_ratio": 120 / 480},
        {"arm": "mempo", "against": "warm_start", "objectives": 2, "tt_ratio": 300 / 250, "pt_ratio": 100 / 90},
    ]  # the warm start has no N=4 row: no ratio there
    text = horizon_markdown(rows, got)
    assert "| mempo | memory | 2 | 2 | 3 | 0.667 [-0.050, 1.384] |" in text
    assert "| mempo / react | 4 | 0.500 | 0.250 |" in text


def test_seeds_with_other_tasks_or_agents_are_refused() -> None:
    recs = [r for r in _records() if not (r["checkpoint"] == "mempo_s1" and r["task_id"] == "t2")]
    with pytest.raises(ValueError, match="mempo_s0/mempo_s1 at N=2: seeds 0 and 1 hold different tasks"):
        horizon_rows(recs, ARMS, agents=AGENTS)
    with pytest.raises(ValueError, match="arm 'react' mixes agents"):
        horizon_rows(_records(), ARMS, agents={"react_s0": "full_history"})


def test_the_figure_is_written(tmp_path: Path) -> None:
    path = plot_horizon(horizon_rows(_records(), ARMS, agents=AGENTS), tmp_path / "horizon.png", title="t")
    assert path.stat().st_size > 10_000
