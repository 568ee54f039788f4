"""MetricsFile: one row per step, appended; a new column rewrites the file with the grown header; a resume drops
rows written after the checkpoint."""

from __future__ import annotations

import csv
from pathlib import Path
from types import SimpleNamespace

from mempo.models.callbacks import MetricsFile


def _step(cb: MetricsFile, module: SimpleNamespace, trainer: SimpleNamespace, metrics: dict[str, float]) -> None:
    module.batches_done += 1
    module.last_metrics = metrics
    cb.on_train_batch_start(trainer, module, None, 0)
    cb.on_train_batch_end(trainer, module, None, None, 0)


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_rows_append_and_a_new_column_grows_the_header(tmp_path: Path) -> None:
    path = tmp_path / "metrics.csv"
    cb = MetricsFile(path)
    trainer = SimpleNamespace(is_global_zero=True, global_step=0)
    module = SimpleNamespace(batches_done=0, last_metrics={})
    _step(cb, module, trainer, {"train/loss": 1.0})
    _step(cb, module, trainer, {"train/loss": 2.0})
    _step(cb, module, trainer, {"train/loss": 3.0, "val/f1": 0.5})
    _step(cb, module, trainer, {"train/loss": 4.0})
    rows = _rows(path)
    assert [r["step"] for r in rows] == ["1", "2", "3", "4"]
    assert [r["train/loss"] for r in rows] == ["1.0", "2.0", "3.0", "4.0"]
    assert [r["val/f1"] for r in rows] == ["", "", "0.5", ""]
    assert all(float(r["perf/step_s"]) >= 0 for r in rows)


def test_resume_drops_rows_after_the_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "metrics.csv"
    trainer = SimpleNamespace(is_global_zero=True, global_step=0)
    module = SimpleNamespace(batches_done=0, last_metrics={})
    cb = MetricsFile(path)
    for i in range(3):
        _step(cb, module, trainer, {"train/loss": float(i)})
    resumed = SimpleNamespace(batches_done=1, last_metrics={})
    cb2 = MetricsFile(path)
    cb2.on_train_start(trainer, resumed)
    _step(cb2, resumed, trainer, {"train/loss": 9.0})
    assert [(r["step"], r["train/loss"]) for r in _rows(path)] == [("1", "0.0"), ("2", "9.0")]
