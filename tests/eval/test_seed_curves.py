"""Held-out curves over RL seeds (mempo.eval.seed_curves): the [seed, step, task] matrix from evaluation records, the
per-step paired differences and their interval, the half-width a study would have, the CLI and its figure."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from mempo.eval.seed_curves import curve_rows, curve_tensor, half_width, main, step_of
from mempo.eval.stats import seed_task_t_interval

# EM of 3 seeds x (warm start, s10, s20) x 4 tasks; the warm start is the same checkpoint in every seed.
WARM = [1.0, 0.5, 0.0, 0.5]
EM = {
    "seed0": {"s10": [1.0, 1.0, 0.0, 0.5], "s20": [1.0, 1.0, 0.5, 0.5]},
    "seed1": {"s10": [0.5, 0.5, 0.0, 0.5], "s20": [1.0, 1.0, 0.0, 1.0]},
    "seed2": {"s10": [1.0, 0.5, 0.5, 0.0], "s20": [1.0, 0.5, 0.5, 1.0]},
}


def records(seed: str, *, tasks: int = 4, extra_n: bool = False) -> list[dict]:
    out = []
    for ck, vals in [("warm_start", WARM), *EM[seed].items()]:
        for i, v in enumerate(vals[:tasks]):
            out.append({"checkpoint": ck, "agent": "memory", "objectives": 2, "task_id": f"val-n2-{i}", "em": v})
            if extra_n:
                out.append({"checkpoint": ck, "agent": "memory", "objectives": 3, "task_id": f"val-n3-{i}", "em": 0.0})
    out.append({"checkpoint": "other", "agent": "memory", "objectives": 2, "task_id": "val-n2-0", "em": 0.0})
    return out


def test_step_of() -> None:
    assert [step_of(c) for c in ("warm_start", "s10", "s400", "rl", "s1x")] == [0, 10, 400, None, None]


def test_matrix_and_rows_against_hand_computation() -> None:
    seeds, steps, tasks, x = curve_tensor({s: records(s) for s in EM})
    assert (seeds, steps, tasks) == (list(EM), [0, 10, 20], [f"val-n2-{i}" for i in range(4)])
    assert x.shape == (3, 3, 4)
    rows = curve_rows(seeds, steps, x)
    # step 20 by hand: per-seed means 0.75, 0.75, 0.75 against the warm start's 0.5 -> +0.25 each.
    torch.testing.assert_close(rows[2]["per_seed"], [0.75, 0.75, 0.75])
    torch.testing.assert_close(rows[2]["diff"], 0.25)
    torch.testing.assert_close(rows[2]["seed_sd"], 0.0)
    # step 10: differences per task (seed rows) [0,.5,0,0], [-.5,0,0,0], [0,0,.5,-.5]; seed means .125, -.125, 0
    d10 = np.array([[0, 0.5, 0, 0], [-0.5, 0, 0, 0], [0, 0, 0.5, -0.5]])
    torch.testing.assert_close(rows[1]["diff"], 0.0)
    torch.testing.assert_close(rows[1]["seed_sd"], 0.125)  # sd of (.125, -.125, 0) = .125
    task_means = [-1 / 6, 1 / 6, 1 / 6, -1 / 6]
    torch.testing.assert_close(rows[1]["task_sd"], float(np.std(task_means, ddof=1)))
    _, lo, hi, df = seed_task_t_interval(d10)
    torch.testing.assert_close((rows[1]["lo"], rows[1]["hi"], rows[1]["df"]), (lo, hi, df))
    assert rows[0]["step"] == 0 and "diff" not in rows[0]
    torch.testing.assert_close(rows[0]["mean"], 0.5)


def test_half_width_agrees_with_the_interval_of_a_matrix() -> None:
    rng = np.random.default_rng(0)
    d = rng.normal(0.02, 0.3, size=(4, 64)) + rng.normal(0, 0.03, size=(4, 1))
    mean, lo, hi, _ = seed_task_t_interval(d)
    got = half_width(float(d.mean(axis=1).std(ddof=1)), float(d.mean(axis=0).std(ddof=1)), k=4, t=64)
    torch.testing.assert_close(got, (hi - lo) / 2)
    # More seeds at the same spread: narrower; more tasks: narrower.
    assert half_width(0.03, 0.3, k=6, t=64) < half_width(0.03, 0.3, k=3, t=64)
    assert half_width(0.03, 0.3, k=3, t=128) < half_width(0.03, 0.3, k=3, t=64)
    with pytest.raises(ValueError, match="K >= 2"):
        half_width(0.03, 0.3, k=1, t=64)


def test_refuses_mismatched_evaluations() -> None:
    with pytest.raises(ValueError, match="seed seed1, step 0: not the same 4 tasks"):
        curve_tensor({"seed0": records("seed0"), "seed1": records("seed1", tasks=3)})
    no_s20 = [r for r in records("seed1") if r["checkpoint"] != "s20"]
    with pytest.raises(ValueError, match=r"seed seed1: steps \[0, 10\] differ"):
        curve_tensor({"seed0": records("seed0"), "seed1": no_s20})
    with pytest.raises(ValueError, match="no 'warm_start'"):
        curve_tensor({"seed0": [r for r in records("seed0") if r["checkpoint"] != "warm_start"]})
    with pytest.raises(ValueError, match="pass objectives="):
        curve_tensor({"seed0": records("seed0", extra_n=True)})
    _, _, tasks, _ = curve_tensor({"seed0": records("seed0", extra_n=True)}, objectives=3)
    assert tasks[0] == "val-n3-0"


def test_cli_table_and_figure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = []
    for seed in EM:
        folder = tmp_path / seed / "eval"
        folder.mkdir(parents=True)
        (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records(seed)))
        args.append(f"{seed}={tmp_path / seed}")
    out = tmp_path / "fig.png"
    main([*args, "--out", str(out)])
    text = capsys.readouterr().out
    assert "| 20 | 0.750, 0.750, 0.750 | 0.750 | +0.250" in text
    assert "| warm start | 0.500, 0.500, 0.500 | 0.500 |" in text
    assert out.stat().st_size > 1000
    with pytest.raises(SystemExit, match="LABEL=FOLDER"):
        main([str(tmp_path / "seed0")])
