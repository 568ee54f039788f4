# shellcheck shell=bash
# Sourced by scripts/setup.sh (MEMPO_EXTRA=cuda only) and by tests/test_setup_driver_check.py; defines a function and
# runs nothing. The CUDA extra installs torch 2.14 and vLLM 0.33, CUDA 13 builds that need an NVIDIA driver >= 580:
# on an older driver the install succeeds and the first CUDA call fails, so setup refuses before installing.
#   MEMPO_SKIP_DRIVER_CHECK=1  skip the check (e.g. a driver the query below cannot read, or a build machine)
#   MEMPO_NVIDIA_SMI=<command> the command the version is read with (default nvidia-smi; tests substitute a fake)

MEMPO_MIN_NVIDIA_DRIVER=580

# Return 0 when the NVIDIA driver is >= MEMPO_MIN_NVIDIA_DRIVER (or the check is skipped), else 1 with a message on
# stderr that says what was found and what to do.
mempo_check_nvidia_driver() {
  local smi="${MEMPO_NVIDIA_SMI:-nvidia-smi}" need="$MEMPO_MIN_NVIDIA_DRIVER" out version major
  local what="MEMPO_EXTRA=cuda installs torch 2.14 and vLLM 0.33, CUDA 13 builds that need an NVIDIA driver >= $need"
  local todo="install an NVIDIA driver >= $need, or use the CPU default: bash scripts/setup.sh"
  if [ "${MEMPO_SKIP_DRIVER_CHECK:-0}" = "1" ]; then
    echo "setup: MEMPO_SKIP_DRIVER_CHECK=1: the NVIDIA driver check (>= $need, CUDA 13) is skipped" >&2
    return 0
  fi
  if ! command -v "$smi" >/dev/null 2>&1; then
    echo "setup: no NVIDIA driver found (no command '$smi'); $what (CUDA 13): $todo" >&2
    return 1
  fi
  if ! out="$("$smi" --query-gpu=driver_version --format=csv,noheader 2>&1)"; then
    echo "setup: '$smi' failed, so no working NVIDIA driver was found ($out); $what (CUDA 13): $todo" >&2
    return 1
  fi
  version="${out%%$'\n'*}"                # the first GPU's line
  version="${version//[[:space:]]/}"
  major="${version%%.*}"
  if ! [[ "$major" =~ ^[0-9]+$ ]]; then
    echo "setup: could not read the NVIDIA driver version from '$smi' (got '$version'); $what (CUDA 13): $todo" \
      "(MEMPO_SKIP_DRIVER_CHECK=1 skips this check)" >&2
    return 1
  fi
  if [ "$major" -lt "$need" ]; then
    echo "setup: NVIDIA driver $version found, but $what (CUDA 13); $todo" \
      "(MEMPO_SKIP_DRIVER_CHECK=1 skips this check)" >&2
    return 1
  fi
  echo "setup: NVIDIA driver $version (>= $need, CUDA 13)"
}
