"""What this machine's CPU can do, read once from the kernel: no mempo imports, so every layer may ask."""

from __future__ import annotations

import os
from pathlib import Path


def cpu_has_bf16() -> bool:
    """Whether this CPU has native bf16 matrix instructions (AVX512-BF16 or AMX-BF16). Without them torch's bf16
    matmuls fall back to a scalar kernel that runs several times slower than float32 (measured: a warm-start step
    on an AVX2-only CPU took minutes under bf16 autocast)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def cpu_kind() -> str:
    """``avx512_bf16`` where the CPU has native bf16 (``cpu_has_bf16``), else ``avx2``: the two kinds the measured
    rates and every timing in the docs are given for."""
    return "avx512_bf16" if cpu_has_bf16() else "avx2"


def resident_gb() -> float:
    """This process's resident memory now, in GiB (``/proc/self/statm``; 0.0 where the kernel has no such file). Logged
    every RL step as perf/rss_gb, where a run whose steps slow down shows whether its memory grows with them."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0.0
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**30
