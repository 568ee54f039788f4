"""Runs tests/support/fsdp_probe.py: a data-parallel fit of the tiny model on two CPU processes, for the tests of
``trainer=ddp`` / ``trainer=fsdp`` (tests/models/parallel/test_fsdp.py, tests/lm/test_lora_slow.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def run_fsdp_probe(run_dir: Path, strategy: str, *args: str) -> list[dict]:
    """Runs the probe -> each rank's record; a hang (ranks out of step) fails after 300 s and kills both ranks (rank 1
    is Lightning's child process: the whole process group goes)."""
    cmd = [sys.executable, str(ROOT / "tests" / "support" / "fsdp_probe.py"), str(run_dir), strategy, *args]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=300)  # a 2-step probe takes about 40 s here
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err.decode()[-3000:]
    return [torch.load(run_dir / f"probe-rank{r}.pt") for r in (0, 1)]
