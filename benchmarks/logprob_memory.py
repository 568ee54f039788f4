"""Peak memory of per-token log-probs: a naive full-vocabulary log-softmax versus ``mempo.lm.logprobs``.

    python -m benchmarks.logprob_memory            # SmolLM2-135M (49,152-token vocabulary), [8, 1024] tokens
    python -m benchmarks.logprob_memory --quick    # [8, 256]

naive:   ``logits.float().log_softmax(-1).gather(...)`` over the whole [N, T, V] logits: the logits, their float32
         copy and the log-softmax are alive at once (and kept for backward).
chunked: ``mempo.lm.logprobs`` (``head_logprobs`` / ``token_logprobs``): the head and a float32 log-softmax over
         256 positions at a time (the default chunk_size), recomputed in backward; never more than one [256, V]
         block.
Modes (each (variant, mode) in a fresh process: load the model, run a small warm-up, reset the peak RSS, run once;
the figure is the peak RSS above the RSS just before the measured call, in MiB):
  train        (headline) the log-prob stage of an update: from the decoder's last hidden states [N, T, H]
               (computed beforehand, requiring grad) through head, log-softmax and gather, forward + backward.
               This is the part the two variants differ in; the decoder's own activations come on top of both.
  no_grad      a whole no-grad forward, ids to log-probs (scoring, reference log-probs).
  model_train  a whole forward + backward, ids to gradients, at [8, 256] in both runs (at [8, 1024] the decoder's
               activations alone approach this machine's 24 GB): shows how much of a full update's peak the
               log-prob stage is.
All under bf16 autocast, the CPU trainer's default precision, with MALLOC_MMAP_THRESHOLD_=65536 so that the RSS
counts live tensors. Also checks that both variants give the same
log-probs (max |difference| over the scored tokens).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from benchmarks.common import log, machine, peak_rss_mb, reset_peak_rss, rss_mb, run_child, write_json

VARIANTS = ("naive", "chunked")
MODES = ("train", "no_grad", "model_train")
MODEL_TRAIN_SHAPE = (8, 256)
# glibc serves allocations of 64 KiB and more with mmap and unmaps them on free: the RSS then follows the live
# tensors, instead of memory freed earlier (the decoder's activations) being reused without showing in the peak.
EXACT_RSS = {"MALLOC_MMAP_THRESHOLD_": "65536"}


def naive_logprobs(model: Any, ids: Any, mask: Any) -> Any:
    logits = model(input_ids=ids, attention_mask=mask).logits.float()  # [N, T, V]
    logp = logits[:, :-1].log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    return logp * mask[:, 1:]


def naive_head_logprobs(head: Any, hidden: Any, targets: Any) -> Any:
    logits = head(hidden).float()  # [M, V]
    return logits.log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1)


def child(variant: str, mode: str, rows: int, length: int, model_name: str) -> dict[str, Any]:
    import time

    import torch

    from mempo.lm.loading import load_policy, resolve_model_path
    from mempo.lm.logprobs import head_logprobs, token_logprobs

    model, _ = load_policy(resolve_model_path(model_name))
    model.train(mode != "no_grad")
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (rows, length), generator=gen)
    mask = torch.ones_like(ids, dtype=torch.bool)
    head = model.get_output_embeddings()
    naive = variant == "naive"

    def prepare(i: Any, a: Any) -> tuple[Any, Any]:
        """What the measured call starts from: the ids, or (train) the decoder's hidden states requiring grad."""
        if mode != "train":
            return i, a
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            hidden = model.get_decoder()(input_ids=i, attention_mask=a).last_hidden_state
        return hidden[:, :-1].reshape(-1, hidden.shape[-1]).detach().requires_grad_(True), i[:, 1:].reshape(-1)

    def call(x: tuple[Any, Any]) -> Any:
        with torch.autocast("cpu", dtype=torch.bfloat16), torch.set_grad_enabled(mode != "no_grad"):
            if mode == "train":
                logp = naive_head_logprobs(head, *x) if naive else head_logprobs(head, *x)[0]
            else:
                logp = naive_logprobs(model, *x) if naive else token_logprobs(model, *x)[:, 1:]
            if logp.requires_grad:
                logp.mean().backward()
                model.zero_grad(set_to_none=False)  # gradient buffers stay allocated: not part of the figure
        return logp.detach().flatten()

    call(prepare(ids[:1, :16], mask[:1, :16]))  # warm-up: lazy initialisation, kernel selection, gradient buffers
    x = prepare(ids, mask)
    reset_peak_rss()
    before = rss_mb()
    start = time.perf_counter()
    logp = call(x)
    seconds = time.perf_counter() - start
    peak = peak_rss_mb() - before
    torch.save(logp, Path(_logp_file(variant, mode)))
    return {"peak_mb": peak, "seconds": seconds, "vocab": vocab, "shape": [rows, length]}


def _logp_file(variant: str, mode: str) -> str:
    import tempfile

    return str(Path(tempfile.gettempdir()) / f"mempo-bench-logp-{variant}-{mode}.pt")


def run(quick: bool, model_name: str) -> dict[str, Any]:
    import torch

    rows, length = (8, 256) if quick else (8, 1024)
    by_mode: dict[str, Any] = {}
    for mode in MODES:
        by_mode[mode] = {}
        r, t = MODEL_TRAIN_SHAPE if mode == "model_train" else (rows, length)
        for variant in VARIANTS:
            log(f"logprob: {variant} {mode} [{r}, {t}]")
            args = ["--child", variant, mode, "--rows", str(r), "--length", str(t), "--model", model_name]
            by_mode[mode][variant] = run_child("benchmarks.logprob_memory", args, env=EXACT_RSS)
        parts = by_mode[mode]
        if all("error" not in parts[v] for v in VARIANTS):
            a, b = (torch.load(_logp_file(v, mode)) for v in VARIANTS)
            # bf16 autocast: the two paths round the head's matmul differently (full [N, T, V] vs per chunk)
            parts["max_abs_diff"] = float((a - b).abs().max())
            parts["shape"] = list(parts["naive"]["shape"])
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
    print(f"\nper-token log-probs ({result['model']}), peak RSS above the call's start")
    head = ("mode", "shape", "naive MB", "chunked MB", "ratio", "naive s", "chunked s", "max |diff|")
    print(" ".join(f"{h:>10}" for h in head))
    for mode, parts in result["by_mode"].items():
        if "ratio" not in parts:
            print(f"{mode:>10} error: {[parts[v].get('error') for v in VARIANTS]}")
            continue
        n, c = parts["naive"], parts["chunked"]
        print(
            f"{mode:>10} {str(parts['shape']):>10} {n['peak_mb']:>10.0f} {c['peak_mb']:>10.0f} "
            f"{parts['ratio']:>10.1f} {n['seconds']:>10.1f} {c['seconds']:>10.1f} {parts['max_abs_diff']:>10.2e}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.logprob_memory",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
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
