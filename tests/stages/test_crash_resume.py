"""A training process killed with SIGKILL after its first checkpoint resumes with ``resume=true``: the step counter
and optimizer state continue, and metrics.csv ends with each step exactly once (the real CLI, the tiny model)."""

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
ARGS = [
    "+exp=ablation_nomem",
    "+debug=default",
    "trainer.max_steps=4",
    "ckpt.every_n_steps=1",
    "agent.max_turns=1",
    "sampler.max_new_tokens=8",
    # The random tiny model's rewards are all 0, so every advantage is 0: with optim.skip_no_signal no AdamW step
    # would run and there would be no optimizer state whose continuation this test checks; skip_zero_adv_rows=false
    # computes every row, a full step's forward and backward.
    "optim.skip_no_signal=false",
    "optim.skip_zero_adv_rows=false",
    "eval.every_n_steps=0",  # no validation (the debug config's): the kill and the resume are what this tests
]


def _start(run_dir: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(ROOT / "experiments" / "run.py"), *ARGS, f"run_dir={run_dir}", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


@pytest.mark.slow
def test_sigkill_after_first_checkpoint_then_resume(tmp_path):
    run_dir = tmp_path / "run"
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    proc = _start(run_dir)
    deadline = time.monotonic() + 300
    while not ckpt.exists():
        assert proc.poll() is None, f"run ended before its first checkpoint:\n{proc.stdout.read()[-3000:]}"
        assert time.monotonic() < deadline, "no checkpoint within 300 s"
        time.sleep(0.02)
    assert proc.poll() is None, "the run finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    assert not (run_dir / "summary.json").exists()
    killed_at = torch.load(ckpt, weights_only=False)["mempo"]["batches_done"]
    assert 1 <= killed_at < 4
    # What a kill in the middle of a save leaves: a truncated temporary file next to the intact last.ckpt.
    (ckpt.parent / ".last.ckpt.tmp99999").write_bytes(ckpt.read_bytes()[:1000])

    resumed = _start(run_dir, "resume=true")
    out, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, out[-3000:]
    assert f"resuming from {ckpt}" in out
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 4
    rows = list(csv.DictReader((run_dir / "metrics.csv").open()))
    assert [int(r["step"]) for r in rows] == [1, 2, 3, 4]  # appended: none duplicated, none missing
    state = torch.load(ckpt, weights_only=False)
    assert state["mempo"]["batches_done"] == 4
    assert {int(s["step"]) for s in state["optimizer_states"][0]["state"].values()} == {4}  # Adam continued
    assert state["global_step"] == 4
    assert not list(ckpt.parent.glob(".last.ckpt.tmp*"))  # the half-written file was removed, never read
