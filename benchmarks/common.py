"""Helpers shared by the benchmark scripts: peak memory of this process, running one benchmark in a child process
(so engines, caches and peak memory never leak from one measurement into the next), and JSON output."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
from collections import deque
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
# A timing is compared with its target only as the median of at least this many timed steps: one step of the TRL
# comparison read 0.41, 0.49 and 0.54 on three runs of the same code, on both sides of its 0.5 target.
MIN_TIMED_STEPS = 3


def _status_mb(field: str) -> float:
    """A memory field of /proc/self/status (VmHWM: peak resident set, VmRSS: current) in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def peak_rss_mb() -> float:
    return _status_mb("VmHWM")


def rss_mb() -> float:
    return _status_mb("VmRSS")


def reset_peak_rss() -> None:
    """Start a new peak: writing 5 to clear_refs resets VmHWM to the current RSS (Linux >= 4.0)."""
    Path("/proc/self/clear_refs").write_text("5")


def machine() -> dict[str, Any]:
    flags = ""
    cpuinfo = Path("/proc/cpuinfo")
    model = platform.processor()
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name") and not model:
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = line
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "avx512_bf16": "avx512_bf16" in flags,
        "python": platform.python_version(),
    }


def write_json(path: str | Path, data: dict[str, Any]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def log(msg: str) -> None:
    """A progress line; ``run_child`` shows these from its children (everything else only in the error tail)."""
    print(f"[bench] {msg}", flush=True)


def run_child(
    module: str,
    args: list[str],
    *,
    timeout_s: float = 3600,
    verbose: bool = False,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run ``python -m module *args --json TMP`` in the repository root (``module`` such as ``"benchmarks.step_time"``;
    ``-m`` puts the root on the child's import path) and return the JSON it wrote, or ``{"error": ...}`` naming the
    module and its exit status, with ``cause`` (its last line naming an exception, or the last line of a child that
    exited with an error status and no traceback) and the end of its output (a failed benchmark is reported, not
    fatal). The child's ``[bench]`` lines are passed through (all of its output with ``verbose``); ``env`` adds to
    its environment."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", module, *args, "--json", str(out)]
        env = {**os.environ, **(env or {})}
        tail: deque[str] = deque(maxlen=20)
        with subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        ) as proc:
            timer = threading.Timer(timeout_s, proc.kill)
            timer.start()
            try:
                for line in proc.stdout:
                    tail.append(line.rstrip())
                    if verbose or line.startswith("[bench]"):
                        print(line, end="", flush=True)
            finally:
                timer.cancel()
            code = proc.wait()
        if code != 0 or not out.exists():
            what = "killed after the timeout" if code == -9 else f"exit {code}"
            cause = next((ln for ln in reversed(tail) if "Error" in ln), None)
            if cause is None and code > 0:  # exited without a traceback: its last line (a SystemExit message)
                cause = next((ln for ln in reversed(tail) if ln.strip()), None)
            return {
                "error": f"{module} {' '.join(args)}: {what}",
                "cause": cause.removeprefix("[rank0]:").strip() if cause else None,
                "output_tail": list(tail),
            }
        return json.loads(out.read_text())
