"""What this machine's CPU can do, read once from the kernel: no mempo imports, so every layer may ask."""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path


@functools.cache
def cpuinfo() -> str:
    """The kernel's /proc/cpuinfo ("" where there is none): its flags lines name what the CPU can do."""
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def cpu_has_bf16() -> bool:
    """Whether this CPU has native bf16 matrix instructions (AVX512-BF16 or AMX-BF16). Without them torch's bf16
    matmuls fall back to a scalar kernel that runs several times slower than float32 (measured: a warm-start step
    on an AVX2-only CPU took minutes under bf16 autocast)."""
    flags = cpuinfo()
    return "avx512_bf16" in flags or "amx_bf16" in flags


def cpu_kind() -> str:
    """``avx512_bf16`` where the CPU has native bf16 (``cpu_has_bf16``), else ``avx2``: what decides whether training
    and the engine run in bf16."""
    return "avx512_bf16" if cpu_has_bf16() else "avx2"


# oneDNN's cap on the instruction sets it may use (its current name first; DNNL_ is the older one)
ONEDNN_ISA_VARS = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")


def onednn_allows_amx() -> bool:
    """Whether oneDNN, which runs torch's bf16 matmuls on CPU, may pick its AMX kernels: no cap, ``ALL``, ``DEFAULT``
    or an AMX instruction set in ``ONEDNN_MAX_CPU_ISA`` (``DNNL_MAX_CPU_ISA``). Capped below AMX (for example
    ``AVX512_CORE_BF16``, to time an AMX machine as one without), bf16 matmuls run as on a CPU without AMX."""
    isa = next((os.environ[v] for v in ONEDNN_ISA_VARS if os.environ.get(v)), "").strip().upper()
    return isa in ("", "ALL", "DEFAULT") or "AMX" in isa


def has_amx() -> bool:
    """Whether bf16 matmuls run on AMX tiles here: native bf16 (``cpu_has_bf16``), AMX tiles (lscpu's amx_tile) and
    oneDNN not capped below them (``onednn_allows_amx``)."""
    return "amx_tile" in cpuinfo() and cpu_has_bf16() and onednn_allows_amx()


def rate_kind() -> str:
    """``amx`` where bf16 matmuls run on AMX tiles (``has_amx``), else ``cpu_kind()``: the three kinds the console's
    time estimates have measured rates for (the fast path's bf16 update ran 1,341 update tokens a second on a 2-core
    AMX Xeon and about 560 on a 2-core AVX512-BF16 EPYC: docs/performance.md, "Time estimates")."""
    return "amx" if has_amx() else cpu_kind()


def cpu_precision() -> str:
    """``trainer.precision=auto`` on this CPU: bf16-mixed wherever it has native bf16 (``cpu_has_bf16``: AVX512-BF16
    or AMX), else 32-true (AVX2 has no bf16 kernels). Measured on real CPUs: the fast path's compiled update ran 1.6x
    as many tokens a second in bf16 as in float32 on a 2-core Zen 4 EPYC without AMX (555 against 347), and bf16 is
    faster still on AMX; only an AMX Xeon with oneDNN capped below AMX (``ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16``, no
    real CPU) ran it faster in float32 (docs/performance.md, "Where the update's time goes")."""
    return "bf16-mixed" if cpu_has_bf16() else "32-true"


# Linux's arch_prctl request for an extended state component's permission (asm/prctl.h), and AMX's tile data
ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA, SYS_ARCH_PRCTL_X86_64 = 0x1023, 18, 158


def request_amx() -> bool:
    """Ask the kernel for the AMX tile state (Linux on x86-64, a CPU with amx_tile); True when granted.

    A process must ask before its first AMX instruction, or it dies of SIGILL. oneDNN asks when it first picks an
    AMX kernel; vLLM-CPU's own AMX kernels do not ask. So with oneDNN capped below AMX (``ONEDNN_MAX_CPU_ISA``, as
    when timing an AMX machine as one without), nothing asked and the engine's first forward killed the run with
    "Illegal instruction". Asking twice is harmless; False where there is no AMX or no such request (other OSes)."""
    if "amx_tile" not in cpuinfo() or os.uname().machine != "x86_64":
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(SYS_ARCH_PRCTL_X86_64, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0
    except (OSError, AttributeError):
        return False


def resident_gb() -> float:
    """This process's resident memory now, in GiB (``/proc/self/statm``; 0.0 where the kernel has no such file). Logged
    every RL step as perf/rss_gb, where a run whose steps slow down shows whether its memory grows with them."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0.0
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**30


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost"
    )]  # fmt: skip


def malloc_gb() -> dict[str, float]:
    """glibc's account of this process's heap, in GiB, summed over every malloc arena (``mallinfo2``): ``in_use``
    (bytes handed out and not yet freed, mmapped blocks included), ``free_held`` (freed bytes the arenas keep instead
    of returning them to the kernel: fragmentation, which RSS counts where the pages were touched), ``mmapped`` (the
    blocks glibc served by their own mmap). RSS minus ``in_use`` and ``free_held`` is memory malloc did not hand out:
    code, the interpreter's arenas, file pages. {} where the C library has no mallinfo2 (not glibc >= 2.33)."""
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return {}
    fn.restype = _MallInfo2
    m = fn()
    return {"in_use": (m.uordblks + m.hblkhd) / 2**30, "free_held": m.fordblks / 2**30, "mmapped": m.hblkhd / 2**30}


def release_free_memory() -> bool:
    """Hand the pages glibc's malloc arenas hold free back to the kernel (``malloc_trim(0)``: every arena, the free
    pages inside a heap too, not only its top), after a cyclic garbage collection; True where it ran (glibc)."""
    import gc

    gc.collect()
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    trim(ctypes.c_size_t(0))
    return True


M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)


def set_mmap_threshold(mib: float) -> bool:
    """glibc's malloc serves every later allocation of ``mib`` MiB or more by its own mmap, returned to the kernel on
    free, and stops raising that threshold by itself (by default it rises up to 32 MiB as large blocks are freed, so
    a training step's tensors end up in the heap arenas, which fragment). True where it ran (glibc)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(ctypes.c_int(M_MMAP_THRESHOLD), ctypes.c_int(int(mib * 2**20))))


# oneDNN's primitive cache (its own env var) and ideep's cache of computations (PyTorch's oneDNN wrapper; LRU_CACHE_
# CAPACITY) keep up to 1,024 entries each by default, one per matmul shape met: on CPU a training step's bf16 matmuls
# meet new sequence lengths every step, so both fill for hundreds of steps (docs/performance.md, "Long runs").
ONEDNN_CACHE_VARS = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")


def bound_onednn_caches(capacity: int | None) -> dict[str, str]:
    """Cap oneDNN's primitive cache and ideep's computation cache at ``capacity`` entries each (None: leave the
    libraries' own 1,024) by setting their environment variables where the user has not; returns the values now set.

    Both are read when the process creates its first oneDNN primitive (its first CPU bf16 matmul), so this acts only
    when called before that: at a stage's start (``mempo.stages.run_stage``), not after a model has run. Processes
    started later (an RL arm, a rank) inherit the variables. Measured: 400 bf16 matmuls of distinct lengths held
    246 MiB of malloc'd memory with the defaults and 5 MiB with both capped at 8."""
    if capacity is not None:
        for name in ONEDNN_CACHE_VARS:
            os.environ.setdefault(name, str(int(capacity)))
    return {name: os.environ[name] for name in ONEDNN_CACHE_VARS if name in os.environ}
