"""Peak memory of per-token log-probs: a naive full-vocabulary log-softmax versus ``mempo.models.logprobs``.

    python benchmarks/logprob_memory.py            # SmolLM2-135M (49,152-token vocabulary), [8, 1024] tokens
    python benchmarks/logprob_memory.py --quick    # [8, 256]

naive:   ``model(ids).logits.float().log_softmax(-1).gather(...)``: the [N, T, V] logits, their float32 copy and
         the log-softmax are all alive at once (and kept for backward).
chunked: ``token_logprobs``: the decoder once, then the head and a float32 log-softmax over 1,024 positions at a
         time, recomputed in backward; never more than one [1024, V] block.
Each (variant, mode) runs in a fresh process: load the model, run a small warm-up, reset the peak RSS, run once.
The figure is the peak RSS above the RSS just before the measured call, in MiB, so it counts what the call
allocated (activations, logits, gradients), not the weights. Modes: ``no_grad`` (scoring, reference log-probs)
and ``train`` (forward + backward of the mean log-prob, as in the update). Both under bf16 autocast, the CPU
trainer's default precision. Also checks that both variants give the same log-probs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import log, machine, peak_rss_mb, reset_peak_rss, rss_mb, run_child, write_json  # noqa: E402

VARIANTS = ("naive", "chunked")
MODES = ("no_grad", "train")


def naive_logprobs(model: Any, ids: Any, mask: Any) -> Any:
    logits = model(input_ids=ids, attention_mask=mask).logits.float()  # [N, T, V]
    logp = logits[:, :-1].log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    return logp * mask[:, 1:]


def child(variant: str, mode: str, rows: int, length: int, model_name: str) -> dict[str, Any]:
    import time

    import torch

    from mempo.models.loading import load_policy, resolve_model_path
    from mempo.models.logprobs import token_logprobs

    model, _ = load_policy(resolve_model_path(model_name))
    model.train(mode == "train")
    fn = naive_logprobs if variant == "naive" else (lambda m, i, a: token_logprobs(m, i, a)[:, 1:])
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (rows, length), generator=gen)
    mask = torch.ones_like(ids, dtype=torch.bool)

    def call(i: Any, a: Any) -> Any:
        with torch.autocast("cpu", dtype=torch.bfloat16), torch.set_grad_enabled(mode == "train"):
            logp = fn(model, i, a)
            if mode == "train":
                logp.mean().backward()
                model.zero_grad(set_to_none=False)  # gradient buffers stay allocated: not part of the figure
        return logp.detach()

    call(ids[:1, :16], mask[:1, :16])  # warm-up: lazy initialisation, kernel selection, gradient buffers
    reset_peak_rss()
    before = rss_mb()
    start = time.perf_counter()
    logp = call(ids, mask)
    seconds = time.perf_counter() - start
    peak = peak_rss_mb() - before
    torch.save(logp, Path(_logp_file(variant, mode)))
    return {"peak_mb": peak, "seconds": seconds, "vocab": vocab}


def _logp_file(variant: str, mode: str) -> str:
    import tempfile

    return str(Path(tempfile.gettempdir()) / f"mempo-bench-logp-{variant}-{mode}.pt")


def run(quick: bool, model_name: str) -> dict[str, Any]:
    import torch

    rows, length = 8, 256 if quick else 1024
    by_mode: dict[str, Any] = {}
    for mode in MODES:
        by_mode[mode] = {}
        for variant in VARIANTS:
            log(f"logprob: {variant} {mode} [{rows}, {length}]")
            args = ["--child", variant, mode, "--rows", str(rows), "--length", str(length), "--model", model_name]
            by_mode[mode][variant] = run_child(__file__, args)
        parts = by_mode[mode]
        if all("error" not in parts[v] for v in VARIANTS):
            a, b = (torch.load(_logp_file(v, mode)) for v in VARIANTS)
            # bf16 autocast: the two paths round the head's matmul differently (full [N, T, V] vs per chunk)
            parts["max_abs_diff"] = float((a - b).abs().max())
            parts["ratio"] = parts["naive"]["peak_mb"] / max(parts["chunked"]["peak_mb"], 1e-9)
    train = by_mode["train"]
    return {
        "naive_peak_mb": train["naive"].get("peak_mb"),
        "chunked_peak_mb": train["chunked"].get("peak_mb"),
        "ratio": train.get("ratio"),
        "shape": [rows, length],
        "by_mode": by_mode,
        "model": model_name,
        "quick": quick,
        "machine": machine(),
    }


def print_table(result: dict[str, Any]) -> None:
    rows, length = result["shape"]
    print(f"\nper-token log-probs of [{rows}, {length}] tokens ({result['model']}), peak RSS above the call's start")
    head = ("mode", "naive MB", "chunked MB", "ratio", "naive s", "chunked s", "max |diff|")
    print(" ".join(f"{h:>10}" for h in head))
    for mode, parts in result["by_mode"].items():
        if "ratio" not in parts:
            print(f"{mode:>10} error: {[parts[v].get('error') for v in VARIANTS]}")
            continue
        n, c = parts["naive"], parts["chunked"]
        print(
            f"{mode:>10} {n['peak_mb']:>10.0f} {c['peak_mb']:>10.0f} {parts['ratio']:>10.1f} {n['seconds']:>10.1f} "
            f"{c['seconds']:>10.1f} {parts['max_abs_diff']:>10.2e}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", help="write the result here")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--child", nargs=2, metavar=("VARIANT", "MODE"), help=argparse.SUPPRESS)
    parser.add_argument("--rows", type=int, default=8, help=argparse.SUPPRESS)
    parser.add_argument("--length", type=int, default=1024, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        result = child(*args.child, args.rows, args.length, args.model)
    else:
        result = run(args.quick, args.model)
        print_table(result)
    if args.json:
        write_json(args.json, result)


if __name__ == "__main__":
    main()
