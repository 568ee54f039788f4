"""scripts/setup.sh's free-space check before it creates an environment: the function in scripts/disk_check.sh, run
alone under the shell options setup.sh sets, against this machine's real df. Nothing is installed."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHECK = ROOT / "scripts" / "disk_check.sh"


def run_check(folder: Path, need_mb: int, **env: str) -> subprocess.CompletedProcess[str]:
    """Source disk_check.sh under ``set -euo pipefail`` (as setup.sh does) and check ``folder`` for ``need_mb``."""
    script = 'set -euo pipefail; . "$1"; mempo_check_disk "$2" "$3"'
    environ = {k: v for k, v in os.environ.items() if k != "MEMPO_SKIP_DISK_CHECK"} | env
    cmd = ["bash", "-c", script, "check", str(CHECK), str(folder), str(need_mb)]
    return subprocess.run(cmd, env=environ, capture_output=True, text=True)


def test_more_than_the_disk_holds_is_refused_naming_the_folder_and_both_figures(tmp_path):
    need = 10**9  # a petabyte: more than any disk this runs on
    out = run_check(tmp_path, need)
    assert out.returncode == 1
    assert str(tmp_path) in out.stderr and f"{need} MB" in out.stderr, out.stderr
    said = re.search(r"has (\d+) MB free", out.stderr)
    free = int(subprocess.run(["df", "-Pm", str(tmp_path)], capture_output=True, text=True).stdout.split()[10])
    assert said and abs(int(said.group(1)) - free) <= 100, (out.stderr, free)  # files written meanwhile: 100 MB


def test_a_folder_not_yet_made_is_checked_on_its_nearest_parent(tmp_path):
    out = run_check(tmp_path / "not" / "yet" / ".venv", 1)
    assert out.returncode == 0, out.stderr
    out = run_check(tmp_path / "not" / "yet" / ".venv", 10**9)
    assert out.returncode == 1 and f"{tmp_path} has" in out.stderr, out.stderr


def test_the_skip_switch_passes_and_says_so(tmp_path):
    out = run_check(tmp_path, 10**9, MEMPO_SKIP_DISK_CHECK="1")
    assert out.returncode == 0
    assert "skipped" in out.stderr
