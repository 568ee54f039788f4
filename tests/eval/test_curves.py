"""Learning-curve figures from metrics.csv: parsing, the moving average, one and several run dirs."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from mempo.eval.curves import main, moving_average, plot_runs, read_metrics


def write_metrics(run_dir: Path, rows: list[dict]) -> Path:
    run_dir.mkdir(parents=True)
    fields = list(dict.fromkeys(k for r in rows for k in r))
    with (run_dir / "metrics.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    return run_dir


def small_run(run_dir: Path, shift: float = 0.0) -> Path:
    rows = []
    for step in range(1, 9):
        row = {"step": step, "rollout/reward_mean": 0.1 * step + shift, "rollout/em_mean": 0.05 * step,
               "memory/p_ans_mean": 0.01 * step, "perf/tokens": 1000 + step, "perf/response_tokens": 300}  # fmt: skip
        if step % 4 == 0:  # validation every 4 steps; other rows leave the cells empty
            row.update({"val/em": 0.5 + shift, "val/f1": 0.6})
        rows.append(row)
    return write_metrics(run_dir, rows)


def test_read_metrics_fills_missing_cells_with_nan(tmp_path) -> None:
    rows = read_metrics(small_run(tmp_path / "a") / "metrics.csv")
    assert [r["step"] for r in rows] == list(range(1, 9))
    assert math.isnan(rows[0]["val/em"]) and rows[3]["val/em"] == 0.5
    with pytest.raises(FileNotFoundError, match="no metrics file"):
        read_metrics(tmp_path / "missing.csv")


def test_moving_average_is_a_trailing_mean_skipping_nan() -> None:
    assert moving_average([1.0, 2.0, 3.0, 4.0], 2) == [1.0, 1.5, 2.5, 3.5]
    assert moving_average([1.0, math.nan, 3.0], 3) == [1.0, 1.0, 2.0]
    with pytest.raises(ValueError):
        moving_average([1.0], 0)


def test_one_run_and_a_comparison_of_two_write_pngs(tmp_path) -> None:
    a, b = small_run(tmp_path / "a"), small_run(tmp_path / "b", shift=0.1)
    one = plot_runs([a], a / "curves.png")
    two = plot_runs([a, b], tmp_path / "cmp.png", labels=["mempo", "nomem"])
    for path in (one, two):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
    with pytest.raises(ValueError, match="labels"):
        plot_runs([a, b], tmp_path / "x.png", labels=["only one"])
    main([str(a), str(b), "--out", str(tmp_path / "cli.png")])
    assert (tmp_path / "cli.png").is_file()


def test_a_two_step_run_gets_whole_step_ticks_and_its_empty_panels_say_why(tmp_path, monkeypatch) -> None:
    """The demo's 2-step RL figure once had ticks at 1.2, 1.4, ... and a validation panel that only said "not
    logged"."""
    import matplotlib.figure

    seen = {}
    real = matplotlib.figure.Figure.savefig

    def spy(fig, *args, **kw):
        fig.canvas.draw()
        seen["ticks"] = [[t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]] for ax in fig.axes]
        seen["texts"] = [[t.get_text() for t in ax.texts] for ax in fig.axes]
        return real(fig, *args, **kw)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", spy)
    run = write_metrics(tmp_path / "r", [{"step": s, "rollout/reward_mean": 0.1 * s, "perf/tokens": 900 + s}
                                         for s in (1, 2)])  # fmt: skip
    plot_runs([run], run / "curves.png")
    assert all(float(t).is_integer() for ticks in seen["ticks"] for t in ticks)
    reward, validation, p_ans, tokens = seen["texts"]
    assert reward == tokens == []  # drawn
    assert validation == ["no in-training validation in these runs\n(eval.every_n_steps = 0, or more than their steps)"]
    assert p_ans[0].startswith("no memories scored in these runs")


def test_a_validation_logged_at_one_step_sits_on_the_runs_step_axis(tmp_path, monkeypatch) -> None:
    """The demo validates at its last step only: that panel once drew ticks at 1.900, 1.925, ... around its one
    point; every panel now spans the run's steps 1-2 and ticks whole steps only."""
    import matplotlib.figure

    seen = {}
    real = matplotlib.figure.Figure.savefig

    def spy(fig, *args, **kw):
        fig.canvas.draw()
        seen["xlim"] = [ax.get_xlim() for ax in fig.axes]
        seen["ticks"] = [[t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]] for ax in fig.axes]
        return real(fig, *args, **kw)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", spy)
    rows = [{"step": 1, "rollout/reward_mean": 0.6, "perf/tokens": 900},
            {"step": 2, "rollout/reward_mean": 0.7, "perf/tokens": 901, "val/em": 0.72, "val/f1": 0.72}]  # fmt: skip
    run = write_metrics(tmp_path / "r", rows)
    plot_runs([run], run / "curves.png")
    for lo, hi in seen["xlim"]:
        assert lo < 1 < 2 < hi < 2.5
    assert list(seen["ticks"][1]) == [1.0, 2.0]  # the validation panel
