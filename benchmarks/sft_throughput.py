"""Warm-start (SFT) training throughput: tokens per second of real SmolLM2 steps on the oracle's teacher turns.

    python -m benchmarks.sft_throughput [--steps 6] [--batch-size 8] [--json out.json]

Compares, on the same length-bucketed batches and the trainer's precision (``--precision auto``: bf16 autocast on
CPUs with native bf16, else float32; ``--precision both`` adds the head_target side under the other one):
  head_all     the output head and log-softmax on every position (the warm start before ``score_mask``)
  head_target  only on the teacher's tokens (``score_mask``, the warm start now)
Each side: one warm-up step, then ``--steps`` timed optimizer steps (forward, backward, AdamW); figures are the
median step's tokens per second (prompt + target tokens read) and the ratio head_target / head_all.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from benchmarks.common import log, machine, write_json


def sft_step(
    policy: Any, opt: Any, batch: dict[str, Any], *, bf16: bool, head_all: bool = False
) -> tuple[float, float]:
    """One warm-start optimizer step (forward, backward, AdamW) as the sft stage takes it -> (seconds, loss)."""
    import torch

    from mempo.lm.logprobs import token_logprobs

    t0 = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        mask = None if head_all else batch["target_mask"]
        logp = token_logprobs(policy, batch["input_ids"], batch["attention_mask"], score_mask=mask)
        tgt = batch["target_mask"].to(logp.dtype)
        loss = -(logp * tgt).sum() / tgt.sum()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return time.perf_counter() - t0, float(loss)


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.sft_throughput", description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--precision", choices=("auto", "32", "bf16", "both"), default="auto")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import torch

    from mempo.core.hardware import cpu_has_bf16
    from mempo.data.oracle import oracle_dataset
    from mempo.lm.loading import load_policy, resolve_model_path
    from mempo.models.sft import build_sft_examples, sft_dataloader
    from mempo.stages.builders import build_builder, build_env, synthetic_world
    from mempo.stages.config import compose_config

    cfg = compose_config()
    path = resolve_model_path(cfg.model.name_or_path, cache_dir=cfg.model.cache_dir)
    _, tokenizer = load_policy(path, dtype="float32")
    trajectories = [
        item for n in (1, 2) for item in oracle_dataset(synthetic_world(cfg), "train", n, num_tasks=24, seed=0)
    ]
    examples = build_sft_examples(trajectories, build_builder(cfg, tokenizer), build_env(cfg, tokenizer))
    batches = list(sft_dataloader(examples, batch_size=args.batch_size, pad_id=tokenizer.pad_token_id, seed=0))
    batches = batches[: args.steps + 1]
    native = "bf16" if cpu_has_bf16() else "32"
    main_precision = native if args.precision in ("auto", "both") else args.precision
    sides = [("head_all", main_precision), ("head_target", main_precision)]
    if args.precision == "both":
        sides.append(("head_target_" + ("32" if main_precision == "bf16" else "bf16"), "32" if main_precision ==
                      "bf16" else "bf16"))  # fmt: skip
    log(f"CPU native bf16: {cpu_has_bf16()}; precision {main_precision}")
    results = {}
    for side, precision in sides:
        policy, _ = load_policy(path, dtype="float32")  # a fresh copy: both sides start from the same weights
        policy.train()
        opt = torch.optim.AdamW(policy.parameters(), lr=1e-5)
        rates = []
        for i, b in enumerate(batches):
            dt = sft_step(policy, opt, b, bf16=precision == "bf16", head_all=side == "head_all")[0]
            if i > 0:  # the first step warms up allocators and kernels
                rates.append(float(b["attention_mask"].sum()) / dt)
        results[side] = {"tok_per_s_median": statistics.median(rates), "tok_per_s": rates, "precision": precision}
        log(f"{side}: {statistics.median(rates):.0f} tok/s (median of {len(rates)} steps, {min(rates):.0f}-"
            f"{max(rates):.0f})")  # fmt: skip
        del policy, opt
    ratio = results["head_target"]["tok_per_s_median"] / results["head_all"]["tok_per_s_median"]
    tokens = [int(b["attention_mask"].sum()) for b in batches[1:]]
    targets = [int(b["target_mask"].sum()) for b in batches[1:]]
    log(f"head_target / head_all = {ratio:.2f}x; {statistics.mean(tokens):.0f} tokens per batch, "
        f"{100 * sum(targets) / sum(tokens):.0f}% of them teacher tokens")  # fmt: skip
    out = {
        "machine": machine(),
        "batch_size": args.batch_size,
        "cpu_native_bf16": cpu_has_bf16(),
        "steps": args.steps,
        "tokens_per_batch_mean": statistics.mean(tokens),
        "target_fraction": sum(targets) / sum(tokens),
        **results,
        "ratio": ratio,
    }
    if args.json:
        write_json(args.json, out)


if __name__ == "__main__":
    main()
