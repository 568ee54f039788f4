#!/usr/bin/env bash
# Screening probes for RL recipe variants (the protocol of docs/results.md, section 2): from one pinned warm
# start, a few RL steps of the demo recipe per probe (config.yaml: 2 steps of 2 tasks x G=4, the RL seed fixed),
# memory scoring logged in every arm (memory.log_p_ans=true) with its memory credit, then one greedy evaluation of
# every probe and the warm start on seed 0's held-out two-question tasks (eval.num_tasks of them, 64 by default):
# turns per task, failure verdicts (wrong query, fact not carried, ...) and EM with paired bootstrap intervals.
#
#   bash experiments/screen.sh WARM_START OUT RL_SEED NAME "OVERRIDES" [NAME "OVERRIDES" ...]
#   bash experiments/screen.sh runs/demo/sft/hf runs/screen 0 nomem "memory.alpha=0" mempo "" \
#        ptf "memory.normalize=per_turn memory.std_floor=0.1"
#
# A probe whose OUT/NAME/hf exists is reused. Each probe takes about 3.5 min on a 2-core AVX512-BF16 machine
# (about 2.7x that on AVX2-only); the evaluation about 1 min per checkpoint. Report:
#   python -m mempo.eval.report OUT/eval/eval          # the table, paired against the first probe (the ablation)
#   python -m mempo.eval.memory_credit OUT/NAME        # what the memory advantage paid for, per step
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ $# -ge 5 ] && [ $(( ($# - 3) % 2 )) -eq 0 ] || { sed -n 9,11p "$0"; exit 2; }
ws=$1 out=$2 seed=$3
shift 3
[ -f "$ws/config.json" ] || { echo "screen.sh: $ws is not a model folder (no config.json)"; exit 2; }
mkdir -p "$out"
ckpts=""
while [ $# -gt 0 ]; do
  name=$1 overrides=$2
  shift 2
  if [ ! -f "$out/$name/hf/config.json" ]; then
    echo "[screen] $name: ${overrides:-(recipe defaults)} ($(date +%T)); log in $out/$name.log"
    # shellcheck disable=SC2086  # the overrides are split into words on purpose
    "$PY" experiments/run.py stage=rl "model.name_or_path=$ws" "run_dir=$out/$name" "seed=$seed" \
      trainer.max_steps=2 memory.log_p_ans=true $overrides >"$out/$name.log" 2>&1
  else
    echo "[screen] $name: reused ($out/$name/hf)"
  fi
  ckpts="$ckpts$name: $out/$name/hf, "
done
ckpts="${ckpts}warm_start: $ws"
echo "[screen] evaluating on seed 0's held-out tasks ($(date +%T)); log in $out/eval.log"
"$PY" experiments/eval.py "run_dir=$out/eval" seed=0 "eval.checkpoints={$ckpts}" >"$out/eval.log" 2>&1
tail -n 30 "$out/eval.log"
