"""Packed full-history warm start: one row per trajectory (``sft.pack_turns``) against one row per teacher turn.

    python -m benchmarks.sft_packing [--objectives 4] [--tasks 4] [--json out.json]

Both sides train a fresh SmolLM2 on the same full-history teacher turns (the oracle's trajectories of
``--objectives`` questions, ``--tasks`` of them), in batches of 8 teacher turns (``sft_dataloader``), at the
trainer's precision (bf16 autocast on CPUs with native bf16). Each side: one warm-up step on its first batch, then
one timed pass over all its batches. Figures: seconds for the pass, teacher tokens per second (the same teacher
tokens on both sides; packed rows read the shared prefixes once), tokens read, peak RSS, and the ratio of the
passes' seconds (unpacked / packed).
"""

from __future__ import annotations

import argparse

from benchmarks.common import log, machine, peak_rss_mb, reset_peak_rss, write_json
from benchmarks.sft_throughput import sft_step


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.sft_packing", description=__doc__.split("\n")[0])
    ap.add_argument("--objectives", type=int, default=4)
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import torch

    from mempo.core.hardware import cpu_has_bf16
    from mempo.data.oracle import oracle_dataset
    from mempo.lm.loading import load_policy, resolve_model_path
    from mempo.models.sft import build_sft_examples, pack_turns, sft_dataloader
    from mempo.stages.builders import build_builder, build_env, synthetic_world
    from mempo.stages.config import compose_config

    cfg = compose_config("agent.context=full_history")
    path = resolve_model_path(cfg.model.name_or_path, cache_dir=cfg.model.cache_dir)
    _, tokenizer = load_policy(path, dtype="float32")
    trajectories = oracle_dataset(synthetic_world(cfg), "train", args.objectives, num_tasks=args.tasks, seed=0)
    examples = build_sft_examples(
        trajectories, build_builder(cfg, tokenizer), build_env(cfg, tokenizer), context="full_history"
    )
    bf16 = cpu_has_bf16()
    log(f"{len(trajectories)} trajectories of N={args.objectives}, {len(examples)} teacher turns; bf16 {bf16}")
    results = {}
    for side, pack in (("unpacked", False), ("packed", True)):
        rows = pack_turns(examples, pack=pack)
        batches = list(sft_dataloader(rows, batch_size=8, pad_id=tokenizer.pad_token_id, seed=0))
        policy, _ = load_policy(path, dtype="float32")  # a fresh copy: both sides start from the same weights
        policy.train()
        opt = torch.optim.AdamW(policy.parameters(), lr=1e-5)
        reset_peak_rss()
        sft_step(policy, opt, batches[0], bf16=bf16)  # warm-up: allocators and kernels
        seconds = sum(sft_step(policy, opt, b, bf16=bf16)[0] for b in batches)
        read = sum(int(b["attention_mask"].sum()) for b in batches)
        target = sum(int(b["target_mask"].sum()) for b in batches)
        results[side] = {
            "rows": len(rows),
            "batches": len(batches),
            "tokens_read": read,
            "target_tokens": target,
            "seconds": seconds,
            "target_tok_per_s": target / seconds,
            "peak_rss_mb": peak_rss_mb(),
        }
        log(f"{side}: {len(rows)} rows in {len(batches)} batches, {read} tokens read, {seconds:.1f} s, "
            f"{target / seconds:.1f} teacher tok/s, peak RSS {peak_rss_mb():.0f} MiB")  # fmt: skip
        del policy, opt
    ratio = results["unpacked"]["seconds"] / results["packed"]["seconds"]
    read_ratio = results["unpacked"]["tokens_read"] / results["packed"]["tokens_read"]
    log(f"unpacked / packed: {ratio:.2f}x the time, {read_ratio:.2f}x the tokens read")
    if args.json:
        write_json(
            args.json,
            {"machine": machine(), "objectives": args.objectives, "tasks": args.tasks, "bf16": bf16, **results,
             "time_ratio": ratio, "read_ratio": read_ratio},
        )  # fmt: skip


if __name__ == "__main__":
    main()
