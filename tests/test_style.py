import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUFF = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")


@pytest.mark.skipif(RUFF is None, reason="ruff is part of the dev extra")
@pytest.mark.parametrize("args", [["check", "."], ["format", "--check", "."]])
def test_ruff_clean(args):
    out = subprocess.run([RUFF, *args], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
