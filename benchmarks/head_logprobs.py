"""The update's output head: log-probs of given tokens through SmolLM2's head, forward + backward, with the fused
backward (``mempo.lm.logprobs.LinearHeadLogProb``) against the checkpointed one it replaced, and for a frozen head
the fused path with its gradient computed in the forward (``optim.head_grad_in_forward``: no recompute).

    python -m benchmarks.head_logprobs                              # 4,096 rows, float32 and bf16 autocast
    python -m benchmarks.head_logprobs --isa AVX512_CORE_BF16       # oneDNN as on a CPU without AMX
    python -m benchmarks.head_logprobs --rows 1024 --repeats 2      # a quick look

Each (precision, variant) runs ``--repeats`` times after one warm-up on the same random hidden states [rows, 576]
(requiring grad, as the decoder's output does) and targets, through a random 576 x 49,152 head (SmolLM2's shape)
that is frozen (top-layers RL: SmolLM2's head is tied to its frozen embedding) or trained (``--head-trains``), in
chunks of 256 rows (``head_logprobs``' default), with a signed per-token weight on the log-probs (as an advantage).
Printed: the median seconds of each, the ratio checkpointed / fused, and whether the log-probs and the hidden
states' gradients agree bit for bit (they should: the fused backward is the same arithmetic); for a frozen head also
fused / in-forward and the in-forward gradient's largest difference from the fused one relative to its largest entry
(rounding only: bf16 rounds the gradient before the per-row weight multiplies it, not after). ``--isa`` sets
``ONEDNN_MAX_CPU_ISA`` for a child process that does the timing (oneDNN reads it once, at its first matmul).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

from benchmarks.common import RESULTS, log, machine, run_child, write_json

PRECISIONS = ("float32", "bf16_autocast")
HIDDEN, VOCAB, CHUNK = 576, 49_152, 256


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.head_logprobs", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    add = parser.add_argument
    add("--rows", type=int, default=4096, help="scored tokens (rows of hidden states), default 4096")
    add("--repeats", type=int, default=5, help="timed runs per (precision, variant) after one warm-up")
    add("--precisions", nargs="+", default=list(PRECISIONS), choices=list(PRECISIONS))
    add("--head-trains", action="store_true", help="the head's weight takes gradients too")
    add("--isa", default="", help="ONEDNN_MAX_CPU_ISA for the timing (e.g. AVX512_CORE_BF16); default: not set")
    add("--json", default=str(RESULTS / "head_logprobs.json"))
    add("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rows < 1 or args.repeats < 1:
        parser.error("--rows and --repeats: at least 1")
    return args


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Time each (precision, variant) in this process; the figures and the bit-for-bit checks."""
    import torch

    from mempo.lm.logprobs import head_logprobs

    gen = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)
    head.weight.data.normal_(0, 0.02, generator=gen)
    head.requires_grad_(args.head_trains)
    h0 = torch.randn(args.rows, HIDDEN, generator=gen)
    y = torch.randint(0, VOCAB, (args.rows,), generator=gen)
    weights = torch.randn(args.rows, generator=gen)

    variants = {"checkpointed": {"fused": False}, "fused": {"fused": True}}
    if not args.head_trains:
        variants["in_forward"] = {"fused": True, "grad_in_forward": True}

    def once(precision: str, variant: str) -> tuple[float, Any, Any]:
        head.zero_grad(set_to_none=True)
        h = h0.clone().requires_grad_(True)
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16_autocast"):
            logp, _ = head_logprobs(head, h, y, chunk_size=CHUNK, **variants[variant])
            (weights * logp).sum().backward()
        return time.perf_counter() - start, logp.detach(), h.grad

    out: dict[str, Any] = {}
    for precision in args.precisions:
        row: dict[str, Any] = {}
        for variant in variants:
            once(precision, variant)  # warm-up: kernel choice, allocator
            times = [once(precision, variant)[0] for _ in range(args.repeats)]
            row[variant] = {"median_s": statistics.median(times), "times_s": times}
            log(f"{precision} {variant}: median {row[variant]['median_s']:.3f} s over {args.repeats}")
        _, lp_f, g_f = once(precision, "fused")
        _, lp_c, g_c = once(precision, "checkpointed")
        row["ratio"] = row["checkpointed"]["median_s"] / row["fused"]["median_s"]
        row["bit_identical"] = bool(torch.equal(lp_f, lp_c) and torch.equal(g_f, g_c))
        if "in_forward" in variants:
            _, lp_i, g_i = once(precision, "in_forward")
            row["in_forward_ratio"] = row["fused"]["median_s"] / row["in_forward"]["median_s"]
            row["in_forward_logp_identical"] = bool(torch.equal(lp_i, lp_f))
            row["in_forward_grad_rel_diff"] = float((g_i - g_f).abs().max() / g_f.abs().max())
        out[precision] = row
    return out


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        write_json(args.json, {"results": measure(args)})
        return
    isa = args.isa or os.environ.get("ONEDNN_MAX_CPU_ISA", "")
    if args.isa:
        os.environ["ONEDNN_MAX_CPU_ISA"] = args.isa  # inherited by the timing process; machine_kind labels the cap
    child = ["--child", "--rows", str(args.rows), "--repeats", str(args.repeats), "--precisions", *args.precisions]
    child += ["--head-trains"] if args.head_trains else []
    res = run_child("benchmarks.head_logprobs", child)
    if "error" in res:
        raise SystemExit(f"the timing process failed: {res['error']}")
    from benchmarks.rl_throughput import machine_kind

    kind = machine_kind()
    result = {"machine": machine(), "kind": kind, "onednn_max_cpu_isa": isa, "rows": args.rows,
              "head_trains": args.head_trains, "results": res["results"]}  # fmt: skip
    write_json(args.json, result)
    print(f"\nOutput head forward + backward, {args.rows} rows of SmolLM2's head (576 x 49,152), chunks of {CHUNK}, "
          f"head {'trained' if args.head_trains else 'frozen'}; {kind['label']} ({kind['cpu']}), {kind['cores']} "
          f"cores, ONEDNN_MAX_CPU_ISA={isa or '(not set)'}\n")  # fmt: skip
    print(
        "| precision | checkpointed s | fused s | checkpointed / fused | bit for bit |"
        + ("" if args.head_trains else " in-forward s | fused / in-forward | log-probs equal | gradient rel. diff |")
    )
    print("| --- | --- | --- | --- | --- |" + ("" if args.head_trains else " --- | --- | --- | --- |"))
    for precision, row in res["results"].items():
        line = (
            f"| {precision} | {row['checkpointed']['median_s']:.3f} | {row['fused']['median_s']:.3f} | "
            f"{row['ratio']:.2f}x | {'yes' if row['bit_identical'] else 'NO'} |"
        )
        if "in_forward" in row:
            line += (
                f" {row['in_forward']['median_s']:.3f} | {row['in_forward_ratio']:.2f}x | "
                f"{'yes' if row['in_forward_logp_identical'] else 'NO'} | {row['in_forward_grad_rel_diff']:.1e} |"
            )
        print(line)
    print(f"\nwritten: {args.json}")


if __name__ == "__main__":
    main()
