# shellcheck shell=bash
# Sourced by scripts/setup.sh and by tests/test_setup_disk_check.py; defines a function and runs nothing. A new
# environment needs several GB (MEMPO_EXTRA=cpu: 3.9 GB in .venv, measured on 2026-12-07: torch 0.75, triton 1.0,
# vllm 0.5); on a full disk pip dies half way with "[Errno 28] No space left on device", so setup refuses first.
#   MEMPO_SKIP_DISK_CHECK=1  skip the check

# mempo_check_disk DIR NEED_MB: return 0 when the file system holding DIR (or its nearest existing parent) has at
# least NEED_MB MB free (or the check is skipped), else 1 with a message on stderr naming the folder and both figures.
mempo_check_disk() {
  local dir="$1" need="$2" free
  if [ "${MEMPO_SKIP_DISK_CHECK:-0}" = "1" ]; then
    echo "setup: MEMPO_SKIP_DISK_CHECK=1: the free-space check (>= $need MB) is skipped" >&2
    return 0
  fi
  while [ ! -d "$dir" ]; do dir="$(dirname "$dir")"; done
  free="$(df -Pm "$dir" | awk 'NR == 2 {print $4}')"
  if ! [[ "$free" =~ ^[0-9]+$ ]]; then
    echo "setup: could not read the free space of $dir from df (got '$free'); MEMPO_SKIP_DISK_CHECK=1 skips this" \
      "check" >&2
    return 1
  fi
  if [ "$free" -lt "$need" ]; then
    echo "setup: $dir has $free MB free, but a new environment needs about $need MB; free some space there, or set" \
      "MEMPO_VENV to a folder on a larger disk (MEMPO_SKIP_DISK_CHECK=1 skips this check)" >&2
    return 1
  fi
}
