"""Run the benchmark suite, print a table, write benchmarks/results/latest.json.

    python -m benchmarks.run                    # everything, full size (815 s on 2 CPU cores, see docs/performance.md)
    python -m benchmarks.run --quick            # 7 min: smaller shapes, no warm-up steps (targets need the full run)
    python -m benchmarks.run --only step trl    # some sections; the others are kept from the previous latest.json

Run from the repository root. Sections (one module each, run one after another in child processes as
``python -m benchmarks.<module>``; never run two heavy jobs at once on these machines, the figures collapse under
contention):
  sampler  benchmarks.sampler_throughput  raw vLLM vs VLLMSampler vs HFSampler, same prompts (tok/s)
  step     benchmarks.step_time           one MemPO step by part at two batch sizes, peak RSS
  logprob  benchmarks.logprob_memory      peak memory of per-token log-probs, naive vs chunked
  trl      benchmarks.trl_compare         a single-turn GRPO step: TRL's GRPOTrainer vs mempo, median of 3 timed
                                          steps per side (needs the ``bench`` extra:
                                          ``MEMPO_BENCH=1 bash scripts/setup.sh``)
  rl       benchmarks.rl_throughput       rollouts per hour of ``+exp=grpo_cpu`` by phase, this checkout (run the
                                          module itself for two commits side by side: ``--commits A B``)
Each section records its own ``measured_at`` and ``quick``; a failed section is recorded as ``{"error": ...}``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import MIN_TIMED_STEPS, RESULTS, ROOT, log, machine, run_child, write_json

SECTIONS = {
    "sampler": "benchmarks.sampler_throughput",
    "step": "benchmarks.step_time",
    "logprob": "benchmarks.logprob_memory",
    "trl": "benchmarks.trl_compare",
    "rl": "benchmarks.rl_throughput",
}
# (section, key, target, direction): the targets on this machine (docs/performance.md). trl.ratio is the ratio of the
# medians of at least MIN_TIMED_STEPS timed steps per side (a section with fewer ``timed_steps`` gets no verdict). A
# figure whose ``<key>_range`` (the lowest and highest ratio of any repeat pair) spans its target is reported as
# inconclusive.
TARGETS = [
    ("sampler", "vllm_vs_raw", 0.9, ">="),
    ("trl", "ratio", 0.5, "<="),
    ("logprob", "ratio", 4.0, ">="),
]


def _commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, (int, float)) for v in value):
        return f"{_fmt(value[0])}-{_fmt(value[1])}"  # a (min, max) range
    return str(value)


def summary_rows(results: dict[str, Any]) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    s = results.get("sampler", {})
    for key in (
        "raw_vllm_tok_per_s",
        "raw_vllm_tok_per_s_range",
        "vllm_tok_per_s",
        "vllm_tok_per_s_range",
        "hf_tok_per_s",
        "vllm_vs_raw",
        "vllm_vs_raw_range",
        "repeats",
        "push_s",
    ):
        rows.append((f"sampler.{key}", _fmt(s.get(key, s.get("error")))))
    st = results.get("step", {})
    for b, r in st.get("by_batch", {}).items():
        if "error" in r:
            rows.append((f"step.by_batch.{b}", r["error"]))
            continue
        split = ", ".join(f"{k} {v:.1f}" for k, v in r["split"].items())
        rows.append((f"step.by_batch.{b} seconds", f"{r['seconds']:.1f} ({split}); {r['samples']} samples"))
        rows.append((f"step.by_batch.{b} peak_rss_mb", f"{r['peak_rss_mb']:.0f}"))
    if "error" in st:
        rows.append(("step", st["error"]))
    lp = results.get("logprob", {})
    for key in ("naive_peak_mb", "chunked_peak_mb", "ratio"):
        rows.append((f"logprob.{key}", _fmt(lp.get(key, lp.get("error")))))
    t = results.get("trl", {})
    for key in (
        "mempo_step_s",
        "mempo_step_range_s",
        "trl_step_s",
        "trl_step_range_s",
        "ratio",
        "ratio_range",
        "timed_steps",
    ):
        rows.append((f"trl.{key}", _fmt(t.get(key, t.get("error")))))
    rl = results.get("rl", {})
    if "error" in rl:
        rows.append(("rl", rl["error"]))
    for side in rl.get("sides", []):
        f = side["figures"]
        for key in ("rollouts_per_h_steady", "steady_step_s", "gen_tok_per_s", "update_tok_per_s"):
            rows.append((f"rl.{side['commit']['short']}.{key}", _fmt(f.get(key))))
    return rows


def target_rows(results: dict[str, Any]) -> list[tuple[str, str]]:
    rows = []
    for section, key, target, op in TARGETS:
        value = results.get(section, {}).get(key)
        if not isinstance(value, (int, float)):
            rows.append((f"{section}.{key} {op} {target}", "not measured"))
            continue
        met = value >= target if op == ">=" else value <= target
        verdict = "met" if met else "MISSED"
        steps = results[section].get("timed_steps")
        if results[section].get("quick"):  # the targets are set for the full sizes
            verdict = "quick run: smaller shapes, the target applies to the full run"
        elif isinstance(steps, int) and steps < MIN_TIMED_STEPS:  # one step's ratio is too noisy to judge
            verdict = f"{steps} timed step(s): the target is judged on the median of >= {MIN_TIMED_STEPS}"
        span = results[section].get(f"{key}_range")
        if span and verdict in ("met", "MISSED") and min(span) <= target <= max(span):
            verdict = f"inconclusive: the range of its repeats spans the target ({verdict} by the median)"
        shown = f"{value:.3g}" + (f" (range {_fmt(span)})" if span else "")
        rows.append((f"{section}.{key} {op} {target}", f"{shown}: {verdict}"))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.run", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="the few-minute version")
    parser.add_argument("--only", nargs="+", choices=sorted(SECTIONS), help="run only these sections")
    parser.add_argument("--out", default=str(RESULTS / "latest.json"))
    parser.add_argument("--verbose", action="store_true", help="show the children's whole output")
    args = parser.parse_args()

    out = Path(args.out)
    results: dict[str, Any] = json.loads(out.read_text()) if args.only and out.exists() else {}
    start = time.perf_counter()
    for name in args.only or list(SECTIONS):
        log(f"== {name} ({SECTIONS[name]}{' --quick' if args.quick else ''})")
        t = time.perf_counter()
        section = run_child(SECTIONS[name], ["--quick"] if args.quick else [], verbose=args.verbose)
        section["measured_at"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        section["wall_s"] = time.perf_counter() - t
        section.setdefault("quick", args.quick)
        results[name] = section
        if "error" in section:
            log(f"   {name} failed: {section['error']}" + (f" ({section['cause']})" if section.get("cause") else ""))
    results["meta"] = {
        "commit": _commit(),
        "written_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "wall_s": time.perf_counter() - start,
        "machine": machine(),
        "command": " ".join(["python", "-m", "benchmarks.run", *sys.argv[1:]]),
    }
    write_json(out, results)

    width = max(len(k) for k, _ in summary_rows(results) + target_rows(results))
    print("\nfigure".ljust(width + 1), "value")
    for key, value in summary_rows(results):
        print(key.ljust(width), value)
    print("\ntarget".ljust(width + 1), "measured")
    for key, value in target_rows(results):
        print(key.ljust(width), value)
    print(f"\nwritten: {out}")


if __name__ == "__main__":
    main()
