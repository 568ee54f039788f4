"""How full the engine's batch is when every rollout waits for the turn's longest generation, from an evaluation.

    python -m benchmarks.turn_occupancy runs/study_horizon_w1/eval/results.jsonl --checkpoint ablation_s3
    python -m benchmarks.turn_occupancy <eval run_dir>/results.jsonl --batch 32

The rollout (``mempo.rollout.agent.collect``) is turn-synchronous: one engine call per turn carries every live rollout,
so each call decodes as many steps as its longest generation while shorter ones sit finished. From each trajectory's
trace (tokens generated per turn), cut into batches of ``--batch`` rollouts (an RL step's B x G), this prints per N:
  occupancy       generated tokens / (batch x decode steps of the synchronous loop): the share of decode slots used
  sync / critical the synchronous loop's decode steps / the longest rollout's own (the sum of its turns' tokens): what
                  a loop that let every rollout start its next turn at once (continuous batching) could save at most,
                  were a decode step's cost independent of how many rows it holds
Greedy evaluation traces stand in for the sampled rollouts of training (the same agent and turn format). Nothing is
timed: no machine kind applies.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from mempo.eval.report import read_records


def batch_figures(tokens: list[list[int]]) -> tuple[float, float]:
    """Turn-synchronous decoding of these rollouts (each a list of tokens per turn) -> (occupancy, sync / critical)."""
    turns = max(len(t) for t in tokens)
    sync = sum(max(t[k] for t in tokens if len(t) > k) for k in range(turns))
    generated = sum(sum(t) for t in tokens)
    return generated / (len(tokens) * sync), sync / max(sum(t) for t in tokens)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.turn_occupancy",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("results", type=Path, help="an evaluation's results.jsonl (each row with its trace)")
    parser.add_argument("--checkpoint", help="only this checkpoint's rows (default: the first one in the file)")
    parser.add_argument("--batch", type=int, default=32, help="rollouts a batch (an RL step's B x G; default 32)")
    args = parser.parse_args(argv)
    rows = read_records(args.results)
    if not rows:
        raise SystemExit(f"{args.results}: no rows")
    checkpoint = args.checkpoint or rows[0]["checkpoint"]
    rows = [r for r in rows if r["checkpoint"] == checkpoint]
    if not rows:
        raise SystemExit(f"{args.results}: no rows of checkpoint {checkpoint!r}")
    print(f"Turn-synchronous decoding, {checkpoint}, batches of {args.batch} rollouts ({args.results})\n")
    print("| N | rollouts | tokens a turn, mean / max | occupancy, mean [min-max] | sync / critical, mean [min-max] |")
    print("| --- | --- | --- | --- | --- |")
    for n in sorted({r["objectives"] for r in rows}):
        traces = [[t["generated_tokens"] for t in r["trace"]] for r in rows if r["objectives"] == n]
        batches = [traces[k : k + args.batch] for k in range(0, len(traces) - args.batch + 1, args.batch)]
        if not batches:
            continue
        occ, ratio = zip(*(batch_figures(b) for b in batches))
        flat = [v for t in traces for v in t]
        print(
            f"| {n} | {len(batches) * args.batch} | {statistics.mean(flat):.1f} / {max(flat)} | "
            f"{statistics.mean(occ):.2f} [{min(occ):.2f}-{max(occ):.2f}] | "
            f"{statistics.mean(ratio):.2f} [{min(ratio):.2f}-{max(ratio):.2f}] |"
        )


if __name__ == "__main__":
    main()
