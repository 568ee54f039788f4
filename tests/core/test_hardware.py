"""resident_gb against the kernel's own VmRSS line, and its growth with a tensor the test allocates and touches; the CPU
kinds read from the flags."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mempo.core.hardware import resident_gb

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="needs Linux's /proc")


def vm_rss_gb() -> float:
    """VmRSS of /proc/self/status (kB), read independently of statm."""
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmRSS:"))
    return int(line.split()[1]) / 2**20


def test_resident_gb_is_the_kernels_vm_rss() -> None:
    # the two reads are a few microseconds apart: within 16 MiB of each other
    assert abs(resident_gb() - vm_rss_gb()) < 16 / 1024


GROWTH = """
import torch
from mempo.core.hardware import resident_gb
before = resident_gb()
x = torch.ones(64 * 2**20, dtype=torch.float32)  # 256 MiB, every page written
print(resident_gb() - before)
"""


def test_resident_gb_grows_by_a_touched_allocation() -> None:
    # In a fresh interpreter: in the test process an allocator may hand back pages an earlier test freed and that are
    # still resident (growth 0.0 seen in a full CI run), which says nothing about resident_gb.
    out = subprocess.run([sys.executable, "-c", GROWTH], capture_output=True, text=True, check=True, timeout=120)
    grown = float(out.stdout.strip().splitlines()[-1])
    assert 0.24 < grown < 0.30, grown


@pytest.mark.parametrize(
    ("flags", "kind", "rates"),
    [
        ("fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8", "avx512_bf16", "amx"),  # a Sapphire Rapids Xeon
        ("fpu avx2 avx512f avx512_bf16", "avx512_bf16", "avx512_bf16"),  # an EPYC of the Zen 4 kind
        ("fpu avx2 fma", "avx2", "avx2"),
        ("fpu avx2 amx_tile", "avx2", "avx2"),  # tiles without bf16 train in float32: AVX2's rates
    ],
)
def test_the_rate_kind_tells_amx_apart_while_the_cpu_kind_decides_bf16(monkeypatch, flags, kind, rates) -> None:
    import mempo.core.hardware as hardware

    monkeypatch.setattr(hardware, "cpuinfo", lambda: f"processor\t: 0\nflags\t\t: {flags}\n")
    for var in hardware.ONEDNN_ISA_VARS:
        monkeypatch.delenv(var, raising=False)
    assert (hardware.cpu_kind(), hardware.rate_kind()) == (kind, rates)


@pytest.mark.parametrize(
    ("var", "isa", "amx"),
    [
        (None, None, True),
        ("ONEDNN_MAX_CPU_ISA", "ALL", True),
        ("ONEDNN_MAX_CPU_ISA", "avx512_core_amx", True),  # oneDNN reads the name in any case
        ("ONEDNN_MAX_CPU_ISA", "AVX10_1_512_AMX_FP16", True),
        ("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16", False),
        ("ONEDNN_MAX_CPU_ISA", "AVX2", False),
        ("DNNL_MAX_CPU_ISA", "AVX512_CORE_BF16", False),  # the older name
    ],
)
def test_a_onednn_cap_below_amx_makes_an_amx_cpu_rate_as_one_without(monkeypatch, var, isa, amx) -> None:
    import mempo.core.hardware as hardware

    flags = "fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile"
    monkeypatch.setattr(hardware, "cpuinfo", lambda: f"processor\t: 0\nflags\t\t: {flags}\n")
    for v in hardware.ONEDNN_ISA_VARS:
        monkeypatch.delenv(v, raising=False)
    if var:
        monkeypatch.setenv(var, isa)
    assert hardware.has_amx() is amx
    assert hardware.rate_kind() == ("amx" if amx else "avx512_bf16")
