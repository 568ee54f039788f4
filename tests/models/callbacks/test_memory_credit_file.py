"""MemoryCreditFile: every record into the JSONL, the first ``table_rows`` of a step into a real (offline) W&B table."""

from __future__ import annotations

import json
from types import SimpleNamespace

from lightning.pytorch.loggers import WandbLogger

from mempo.eval.memory_credit import RECORD_KEYS
from mempo.models.callbacks import MemoryCreditFile


def test_records_go_to_the_file_and_a_capped_wandb_table(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    logger = WandbLogger(project="mempo-test", save_dir=str(tmp_path), offline=True)
    records = [{k: (i if k in ("step", "turn", "rollout") else f"{k}{i}") for k in RECORD_KEYS} for i in range(12)]
    trainer = SimpleNamespace(is_global_zero=True, loggers=[logger], global_step=1)
    callback = MemoryCreditFile(tmp_path / "memory_credit.jsonl", table_rows=5)
    callback.on_train_batch_end(trainer, SimpleNamespace(last_credit=records), None, None, 0)
    logger.experiment.finish()
    lines = (tmp_path / "memory_credit.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == records  # every record, in order
    tables = list(tmp_path.glob("wandb/offline-run-*/files/media/table/memory/credit_*.table.json"))
    assert len(tables) == 1, tables
    table = json.loads(tables[0].read_text())
    assert table["columns"] == list(RECORD_KEYS)
    assert [row[0] for row in table["data"]] == [0, 1, 2, 3, 4]  # the first 5 rows of the step
