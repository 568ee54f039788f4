"""The oneDNN caches a long run fills: oneDNN's primitive cache and ideep's computation cache keep one entry per
matmul shape met (1,024 each by default), and an RL step's bf16 matmuls meet new sequence lengths every step, so a
run's memory grew with them for hundreds of steps (docs/performance.md, "Long runs"). ``host.onednn_cache_capacity``
caps both at the run's start (``mempo.core.hardware.bound_onednn_caches``, called by ``run_stage`` and ``fit_rl``).

What a cap must change is measured in a fresh interpreter (the libraries read their variables once, at the first
oneDNN primitive): the malloc'd bytes 300 bf16 matmuls of distinct lengths leave behind, with and without it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mempo.core.hardware import ONEDNN_CACHE_VARS, bound_onednn_caches, cpu_has_bf16
from mempo.stages.config import HostConfig, compose_config

MATMULS = """
import sys
import torch
from mempo.core.hardware import bound_onednn_caches, malloc_gb
bound_onednn_caches(int(sys.argv[1]) if sys.argv[1] != "none" else None)
torch.set_num_threads(1)
w = torch.randn(576, 1536, dtype=torch.bfloat16)  # one of SmolLM2-135M's MLP shapes
before = malloc_gb()["in_use"]
for m in range(1, 301):  # 300 sequence lengths: 300 shapes for the caches
    torch.randn(m, 576, dtype=torch.bfloat16) @ w
print(malloc_gb()["in_use"] - before)
"""


def held_gb(capacity: str) -> float:
    env = {k: v for k, v in os.environ.items() if k not in ONEDNN_CACHE_VARS}
    argv = [sys.executable, "-c", MATMULS, capacity]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=True, env=env)
    return float(out.stdout.split()[-1])


@pytest.mark.skipif(not Path("/proc/self/statm").is_file(), reason="needs glibc's mallinfo2 and Linux")
@pytest.mark.skipif(not cpu_has_bf16(), reason="bf16 matmuls go through oneDNN where the CPU has native bf16")
def test_capped_caches_stop_holding_a_primitive_per_shape() -> None:
    default, capped = held_gb("none"), held_gb("8")
    # measured on a 2-core AMX Xeon: 0.18 GB (400 lengths: 0.24) against 0.005; the bounds leave room for other CPUs
    assert default > 0.05, f"the caches held only {default:.3f} GB with the defaults: nothing to bound here"
    assert capped < 0.25 * default, f"capped at 8 the caches still held {capped:.3f} GB (defaults: {default:.3f})"


def test_a_value_the_user_set_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "64")
    monkeypatch.delenv("LRU_CACHE_CAPACITY", raising=False)
    assert bound_onednn_caches(8) == {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "64", "LRU_CACHE_CAPACITY": "8"}
    monkeypatch.delenv("LRU_CACHE_CAPACITY")
    assert bound_onednn_caches(None) == {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "64"}  # null: the libraries' own


def test_run_stage_sets_the_caps_before_the_stage_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import mempo.stages as stages

    for name in ONEDNN_CACHE_VARS:
        monkeypatch.delenv(name, raising=False)
    seen: dict[str, str | None] = {}
    monkeypatch.setitem(stages.STAGES, "rl", lambda cfg: seen.update({n: os.environ.get(n) for n in ONEDNN_CACHE_VARS}))
    stages.run_stage(compose_config("stage=rl", f"run_dir={tmp_path}", "host.onednn_cache_capacity=16"))
    assert seen == {name: "16" for name in ONEDNN_CACHE_VARS}


@pytest.mark.parametrize("value", [0, -1, 2.5, "many"])
def test_the_capacity_is_checked(value) -> None:
    with pytest.raises(ValueError, match="host.onednn_cache_capacity"):
        HostConfig(onednn_cache_capacity=value)
