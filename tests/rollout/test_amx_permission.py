"""A bf16 vLLM-CPU engine runs with oneDNN capped below AMX (``ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16``, how an AMX
machine is timed as one without): the sampler asks the kernel for the AMX tile state itself
(``mempo.core.hardware.request_amx``), since vLLM-CPU's own AMX kernels do not, and oneDNN, capped, never does.
Before, the engine's first forward killed the process with SIGILL (planted: the request removed -> exit -4).
Only on a CPU with AMX (elsewhere vLLM runs no AMX kernel and the cap changes nothing)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mempo.core.hardware import cpuinfo

pytestmark = pytest.mark.skipif("amx_tile" not in cpuinfo(), reason="needs a CPU with AMX")

CHILD = """
import sys
from mempo.rollout.sampler import SamplingConfig
from mempo.rollout.vllm_sampler import VLLMSampler
sampler = VLLMSampler(sys.argv[1], dtype="bfloat16", kv_cache_space_gb=1, max_model_len=512)
out = sampler.generate([[1, 2, 3]], SamplingConfig(max_new_tokens=2, temperature=0.0))
print("generated", len(out[0][0].token_ids))
sampler.shutdown()
"""


def test_a_bf16_engine_runs_with_onednn_capped_below_amx(tiny_path: Path) -> None:
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}
    out = subprocess.run([sys.executable, "-c", CHILD, str(tiny_path)], env=env, capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert out.returncode == 0, f"exit {out.returncode}\n{out.stderr[-2000:]}"
    assert "generated 2" in out.stdout
