"""scripts/setup.sh's NVIDIA driver check (MEMPO_EXTRA=cuda): the function in scripts/driver_check.sh, run alone
under the shell options setup.sh sets, against a fake nvidia-smi. Nothing is installed."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECK = ROOT / "scripts" / "driver_check.sh"


def run_check(tmp_path: Path, smi: str | None, **env: str) -> subprocess.CompletedProcess[str]:
    """Source driver_check.sh under ``set -euo pipefail`` (as setup.sh does) and run the check; ``smi`` is the fake
    nvidia-smi's stdout, None for no such command."""
    fake = tmp_path / "nvidia-smi"
    if smi is not None:
        fake.write_text(f"#!/bin/sh\nprintf '%s' '{smi}'\n")
        fake.chmod(0o755)
    script = 'set -euo pipefail; . "$1"; mempo_check_nvidia_driver'
    environ = {k: v for k, v in os.environ.items() if k != "MEMPO_SKIP_DRIVER_CHECK"}
    environ.update(MEMPO_NVIDIA_SMI=str(fake), **env)
    return subprocess.run(["bash", "-c", script, "check", str(CHECK)], env=environ, capture_output=True, text=True)


def test_a_driver_below_580_is_refused_naming_both_versions(tmp_path):
    out = run_check(tmp_path, "575.51.03\n")
    assert out.returncode == 1
    assert "575.51.03" in out.stderr and ">= 580" in out.stderr, out.stderr
    assert "bash scripts/setup.sh" in out.stderr  # the CPU default, as the way out


def test_a_580_driver_passes(tmp_path):
    out = run_check(tmp_path, "580.65.06\n")
    assert out.returncode == 0, out.stderr
    assert "580.65.06" in out.stdout


def test_the_first_gpu_line_is_read(tmp_path):
    assert run_check(tmp_path, "590.44.01\n570.10.00\n").returncode == 0
    assert run_check(tmp_path, "570.10.00\n590.44.01\n").returncode == 1


def test_no_nvidia_smi_means_no_driver(tmp_path):
    out = run_check(tmp_path, None)
    assert out.returncode == 1
    assert "no NVIDIA driver found" in out.stderr and ">= 580" in out.stderr, out.stderr


@pytest.mark.parametrize("smi", ["", "N/A\n"])
def test_an_unreadable_version_is_refused(tmp_path, smi):
    out = run_check(tmp_path, smi)
    assert out.returncode == 1
    assert "could not read the NVIDIA driver version" in out.stderr, out.stderr


def test_the_check_can_be_skipped(tmp_path):
    out = run_check(tmp_path, "575.51.03\n", MEMPO_SKIP_DRIVER_CHECK="1")
    assert out.returncode == 0
    assert "MEMPO_SKIP_DRIVER_CHECK=1" in out.stderr


def test_setup_runs_the_check_before_installing_and_only_for_cuda():
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    check = setup.index("mempo_check_nvidia_driver || exit 1")
    assert setup.rindex('if [ "$EXTRA" = "cuda" ]; then', 0, check) > 0
    assert check < setup.index('python3 -m venv "$VENV"') < setup.index("pip install")
