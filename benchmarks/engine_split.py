"""Where the vLLM engine's generation time goes at an RL step's batch: prefill against decode, beside the matmul
ceiling.

    python -m benchmarks.engine_split                          # the fast path's engine: bf16, compiled
    python -m benchmarks.engine_split --dtype float32 --eager  # the main config's engine
    python -m benchmarks.engine_split --batches 8 32 --prompt-tokens 200 --decode-tokens 64

The engine is the RL run's own (``VLLMSampler``: prefix caching on, whole prompts, this CPU's KV cache), over the
embedded SmolLM2-135M unless ``--model`` names another folder. For each batch size B: B distinct prompts of
``--prompt-tokens`` random token ids (no shared prefix; the prefix cache is emptied before each call), generated
twice after a warm-up: one token (the prefill and its first sample) and ``--decode-tokens`` + 1 tokens with the end
of text ignored (the same prefill, then that many decode steps of all B rows). The difference over the decode steps
is one decode step's time. Each time is the median of ``--repeats``.

Printed per B: prefill tokens a second and its matmul GFLOP/s (2 x the decoder's linear weights per prompt token, the
head for the last one only), one decode step's milliseconds, decode tokens a second and its GFLOP/s (decoder and head
for each of the B rows), and the decoder's bf16 or float32 weights read a second (each decode step reads them once).
Against ``benchmarks.matmul_peak`` (the same CPU's plain matmuls at these layers' shapes): a prefill near the ceiling
is compute-bound; a decode step whose time hardly grows with B is bound by something other than its matmuls (the
engine's own per-step work, the weights' reads). Run it with nothing else on the machine; it names the machine kind.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

from benchmarks.common import RESULTS, log, write_json

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def linear_params(config: dict[str, Any]) -> tuple[int, int]:
    """(the decoder's linear weights summed over layers, the output head's) of a Llama-style config."""
    h, inter, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    head_dim = config.get("head_dim") or h // config["num_attention_heads"]
    kv = config.get("num_key_value_heads", config["num_attention_heads"]) * head_dim
    per_layer = h * h * 2 + h * kv * 2 + h * inter * 3  # q, o; k, v; gate, up, down
    return per_layer * layers, h * config["vocab_size"]


def split(prefill_s: float, full_s: float, decode_tokens: int) -> float:
    """One decode step's seconds: the longer call's extra time over its extra steps."""
    if decode_tokens < 1:
        raise ValueError(f"decode_tokens must be >= 1, got {decode_tokens}")
    return (full_s - prefill_s) / decode_tokens


def figures(
    batch: int, prompt_tokens: int, prefill_s: float, step_s: float, decoder: int, head: int, bytes_per_weight: int
) -> dict[str, float]:
    """A batch's prefill and decode rates from its two timings and the model's linear weights."""
    prefill_flops = 2 * decoder * batch * prompt_tokens + 2 * head * batch
    step_flops = 2 * (decoder + head) * batch
    return {
        "prefill_s": prefill_s,
        "prefill_tok_per_s": batch * prompt_tokens / prefill_s,
        "prefill_gflops": prefill_flops / prefill_s / 1e9,
        "decode_step_ms": step_s * 1e3,
        "decode_tok_per_s": batch / step_s,
        "decode_gflops": step_flops / step_s / 1e9,
        "decode_weight_gb_per_s": (decoder + head) * bytes_per_weight / step_s / 1e9,
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import json

    import torch
    import vllm

    from mempo.lm.loading import resolve_model_path
    from mempo.rollout.vllm_sampler import VLLMSampler

    path = resolve_model_path(args.model)
    config = json.loads((path / "config.json").read_text())
    decoder, head = linear_params(config)
    max_len = args.prompt_tokens + args.decode_tokens + 8
    sampler = VLLMSampler(path, dtype=args.dtype, enforce_eager=args.eager, max_model_len=max_len)
    llm = sampler.llm
    gen = torch.Generator().manual_seed(0)
    out: dict[str, Any] = {}
    try:
        for batch in args.batches:
            ids = torch.randint(1000, 20_000, (batch, args.prompt_tokens), generator=gen).tolist()
            prompts = [vllm.inputs.TokensPrompt(prompt_token_ids=p) for p in ids]

            def timed(max_tokens: int, prompts: list = prompts) -> float:
                llm.reset_prefix_cache()
                params = vllm.SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=1.0, seed=0)
                start = time.perf_counter()
                outs = llm.generate(prompts, params, use_tqdm=False)
                seconds = time.perf_counter() - start
                assert all(len(o.outputs[0].token_ids) == max_tokens for o in outs)
                return seconds

            timed(1), timed(args.decode_tokens + 1)  # warm-up (compiled engines compile their shapes here)
            prefill = statistics.median(timed(1) for _ in range(args.repeats))
            full = statistics.median(timed(args.decode_tokens + 1) for _ in range(args.repeats))
            step = split(prefill, full, args.decode_tokens)
            out[str(batch)] = figures(batch, args.prompt_tokens, prefill, step, decoder, head, args.bytes_per_weight)
            log(f"B={batch}: prefill {prefill:.2f} s, with {args.decode_tokens} decode steps {full:.2f} s")
    finally:
        sampler.shutdown()
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.engine_split",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--model", default="smollm2-135m-instruct", help="embedded name or model folder")
    add("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    add("--eager", action="store_true", help="the engine uncompiled (sampler.enforce_eager=true)")
    add("--batches", type=int, nargs="+", default=[8, 32], help="rows generated together (an RL step: 4 x G=8)")
    add("--prompt-tokens", type=int, default=200, help="each prompt's tokens (a memory-agent turn: about 200)")
    add("--decode-tokens", type=int, default=64, help="decode steps timed (a turn's response: about 60 tokens)")
    add("--repeats", type=int, default=3)
    add("--json", default=str(RESULTS / "engine_split.json"))
    args = parser.parse_args(argv)
    if min(args.batches) < 1 or args.prompt_tokens < 1 or args.decode_tokens < 1 or args.repeats < 1:
        parser.error("--batches, --prompt-tokens, --decode-tokens and --repeats: at least 1")
    args.bytes_per_weight = 2 if args.dtype == "bfloat16" else 4
    from benchmarks.rl_throughput import machine_kind

    kind = machine_kind()
    results = measure(args)
    write_json(args.json, {"kind": kind, "dtype": args.dtype, "eager": args.eager, "model": args.model,
                           "prompt_tokens": args.prompt_tokens, "decode_tokens": args.decode_tokens,
                           "repeats": args.repeats, "results": results})  # fmt: skip
    print(f"\nvLLM engine {args.dtype}, {'eager' if args.eager else 'compiled'}, {args.model}, prompts of "
          f"{args.prompt_tokens} tokens, {args.decode_tokens} decode steps, median of {args.repeats}; "
          f"{kind['label']} ({kind['cpu']}), {kind['cores']} cores\n")  # fmt: skip
    print("| B | prefill s | prefill tok/s | prefill GFLOP/s | decode step ms | decode tok/s | decode GFLOP/s | "
          "weights GB/s |\n| --- | --- | --- | --- | --- | --- | --- | --- |")  # fmt: skip
    for batch, r in results.items():
        print(f"| {batch} | {r['prefill_s']:.2f} | {r['prefill_tok_per_s']:.0f} | {r['prefill_gflops']:.0f} | "
              f"{r['decode_step_ms']:.1f} | {r['decode_tok_per_s']:.0f} | {r['decode_gflops']:.0f} | "
              f"{r['decode_weight_gb_per_s']:.1f} |")  # fmt: skip
    print(f"\nwritten: {args.json}")


if __name__ == "__main__":
    main()
