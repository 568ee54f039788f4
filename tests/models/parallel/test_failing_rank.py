"""One rank fails, every rank stops: a two-process CPU fit in which rank 0 or rank 1 raises in its rollout of step 2
(tests/support/failing_rank_probe.py). A rank left waiting in a collective for a peer that is gone would hang until the
process group's timeout (30 min); the test bounds the time from the raise until every process of the job has exited,
and prints it (the figures in docs/performance.md, "A failing rank's exit time")."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
BOUND_S = 60  # far below any collective timeout, far above a clean exit's few seconds


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.parametrize(("strategy", "fail_rank"), [("ddp", 0), ("ddp", 1), ("fsdp", 0)])
def test_every_process_exits_soon_after_one_rank_raises(strategy: str, fail_rank: int, tmp_path: Path) -> None:
    probe = ROOT / "tests" / "support" / "failing_rank_probe.py"
    cmd = [sys.executable, str(probe), str(tmp_path), strategy, str(fail_rank)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=300)
        raised = tmp_path / f"raised-rank{fail_rank}.txt"
        assert raised.is_file(), err.decode()[-3000:]
        while _alive(proc.pid) and time.time() - float(raised.read_text()) < BOUND_S + 5:
            time.sleep(0.2)
        all_gone = time.time() - float(raised.read_text())
        print(f"{strategy}, rank {fail_rank} raised: every process gone {all_gone:.1f} s later (rc {proc.returncode})")
        assert not _alive(proc.pid), f"a process of the job still runs {all_gone:.0f} s after rank {fail_rank} raised"
        assert all_gone < BOUND_S
        assert proc.returncode != 0
        assert f"planted failure in rank {fail_rank}" in err.decode() or fail_rank != 0
    finally:
        if _alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
