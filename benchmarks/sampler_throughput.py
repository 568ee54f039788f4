"""Generation throughput: raw vLLM versus VLLMSampler versus HFSampler on the same prompts.

    python -m benchmarks.sampler_throughput                       # SmolLM2-135M-Instruct, 8 prompts, n=1 and n=4
    python -m benchmarks.sampler_throughput --quick               # 64 new tokens, n=4 only
    python -m benchmarks.sampler_throughput --model tiny --max-new-tokens 32

tok/s counts generated tokens (eos included, prompts excluded) over wall time of the generate call, after one
warm-up call per engine; each case is timed ``--repeats`` times (5 by default; the same seed each time, so the same
tokens) and reported as the median with the range (min-max) of its repeats. "raw vLLM" is ``vllm.LLM.generate``
without log-probs, so the gap to VLLMSampler is the price of log-probs and of our conversion. ``vllm_vs_raw`` is
the ratio of the medians; ``vllm_vs_raw_range`` the lowest and highest ratio of any VLLMSampler repeat to any raw
repeat (the engines run one after the other, so drift between them shows here; two runs of 3 repeats read 0.87
and 1.05). Also reports VLLMSampler's weight-push time (median of 5).
Engines run one at a time, in this process. The headline figures (``raw_vllm_tok_per_s`` ...) are the n=4 case,
how the agent loop samples (G rollouts per task).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import torch

from benchmarks.common import machine, write_json
from mempo.lm.loading import load_policy, resolve_model_path
from mempo.rollout.hf_sampler import HFSampler
from mempo.rollout.sampler import Generation, SamplingConfig

QUESTIONS = [
    "What is the capital of France?",
    "Name three primary colors.",
    "Who wrote Romeo and Juliet?",
    "Explain photosynthesis in one paragraph.",
    "What is 17 times 23?",
    "Describe the water cycle.",
    "Why is the sky blue?",
    "List the planets of the solar system.",
]


Row = tuple[str, int, list[float], int]  # sampler, n, seconds of each repeat, generated tokens


def lengths(out: list[list[Generation]]) -> list[int]:
    return [len(g.token_ids) for samples in out for g in samples]


REPEATS = 5


def measure(
    name: str, generate: Callable[[SamplingConfig], list[int]], cases: list[SamplingConfig], repeats: int = REPEATS
) -> list[Row]:
    """One warm-up call, then ``repeats`` timed calls per case; generate returns the generated lengths."""
    generate(SamplingConfig(max_new_tokens=4, seed=0))
    rows = []
    for params in cases:
        times, tokens = [], 0
        for _ in range(repeats):
            start = time.perf_counter()
            tokens = sum(generate(params))
            times.append(time.perf_counter() - start)
        rows.append((name, params.n, times, tokens))
    return rows


def tok_per_s(rows: list[Row], name: str, n: int) -> tuple[float, float, float]:
    """(median, min, max) tokens per second of one sampler at one n over its repeats."""
    seconds, tokens = next((r[2], r[3]) for r in rows if r[0] == name and r[1] == n)
    return tokens / statistics.median(seconds), tokens / max(seconds), tokens / min(seconds)


def raw_vllm(path: Path | str, prompts: list[list[int]], cases: list[SamplingConfig], repeats: int) -> list[Row]:
    import vllm

    llm = vllm.LLM(model=str(path), dtype="float32", enforce_eager=True, max_model_len=2048, seed=0)
    inputs = [vllm.inputs.TokensPrompt(prompt_token_ids=p) for p in prompts]

    def generate(params: SamplingConfig) -> list[int]:
        sp = vllm.SamplingParams(n=params.n, temperature=params.temperature, max_tokens=params.max_new_tokens, seed=0)
        return [len(c.token_ids) for out in llm.generate(inputs, sp, use_tqdm=False) for c in out.outputs]

    try:
        return measure("raw vLLM", generate, cases, repeats)
    finally:
        llm.llm_engine.engine_core.shutdown()


def vllm_sampler(
    path: Path | str,
    prompts: list[list[int]],
    cases: list[SamplingConfig],
    weights: dict[str, torch.Tensor],
    repeats: int,
) -> tuple[list[Row], float, list[float]]:
    """-> (rows, engine start seconds, weight push seconds x5)."""
    from mempo.rollout.vllm_sampler import VLLMSampler

    start = time.perf_counter()
    sampler = VLLMSampler(path, dtype="float32", max_model_len=2048)
    start_s = time.perf_counter() - start
    try:
        rows = measure("VLLMSampler", lambda params: lengths(sampler.generate(prompts, params)), cases, repeats)
        pushes = []
        for _ in range(5):
            sampler.push_weights(weights)
            pushes.append(round(sampler.last_push_s or 0.0, 3))
    finally:
        sampler.shutdown()
    return rows, start_s, pushes


def run(model: str, max_new_tokens: int, ns: list[int], skip_hf: bool, repeats: int = REPEATS) -> dict[str, Any]:
    path = resolve_model_path(model)
    policy, tokenizer = load_policy(path)
    chats = [[{"role": "user", "content": q}] for q in QUESTIONS]
    prompts = [
        tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=True, return_dict=False) for c in chats
    ]
    cases = [SamplingConfig(n=n, max_new_tokens=max_new_tokens, temperature=1.0, seed=0) for n in ns]
    threads = torch.get_num_threads()  # before vLLM pins them

    rows = raw_vllm(path, prompts, cases, repeats)
    sampler_rows, start_s, pushes = vllm_sampler(path, prompts, cases, policy.state_dict(), repeats)
    rows += sampler_rows
    if not skip_hf:
        hf = HFSampler(policy, tokenizer)
        rows += measure("HFSampler", lambda params: lengths(hf.generate(prompts, params)), cases, repeats)
    by_n: dict[str, dict[str, float]] = {}
    for name, n, _, _ in rows:
        by_n.setdefault(str(n), {})[name] = tok_per_s(rows, name, n)[0]
    head_n = max(ns)
    head = by_n[str(head_n)]
    raw, vs = tok_per_s(rows, "raw vLLM", head_n), tok_per_s(rows, "VLLMSampler", head_n)
    return {
        "raw_vllm_tok_per_s": head.get("raw vLLM"),
        "raw_vllm_tok_per_s_range": raw[1:],
        "vllm_tok_per_s": head.get("VLLMSampler"),
        "vllm_tok_per_s_range": vs[1:],
        "hf_tok_per_s": head.get("HFSampler"),
        "vllm_vs_raw": vs[0] / raw[0],
        "vllm_vs_raw_range": (vs[1] / raw[2], vs[2] / raw[1]),
        "headline_n": head_n,
        "by_n": by_n,
        "rows": [
            {"sampler": r[0], "n": r[1], "seconds": statistics.median(r[2]), "seconds_each": r[2], "tokens": r[3]}
            for r in rows
        ],
        "engine_start_s": start_s,
        "push_s": statistics.median(pushes),
        "pushes_s": pushes,
        "prompts": len(prompts),
        "max_new_tokens": max_new_tokens,
        "repeats": repeats,
        "torch_threads": threads,
        "model": str(path),
        "machine": machine(),
    }


def print_table(result: dict[str, Any]) -> None:
    print(
        f"\nmodel {result['model']}: {result['prompts']} prompts, {result['max_new_tokens']} new tokens, fp32, "
        f"{result['torch_threads']} torch threads, median and range of {result['repeats']} repeats"
    )
    print(f"{'sampler':<12} {'n':>3} {'seqs':>5} {'tokens':>7} {'seconds':>8} {'tok/s':>7} {'tok/s range':>14}")
    for r in result["rows"]:
        seqs, each = r["n"] * result["prompts"], r["seconds_each"]
        span = f"{r['tokens'] / max(each):.1f}-{r['tokens'] / min(each):.1f}"
        print(
            f"{r['sampler']:<12} {r['n']:>3} {seqs:>5} {r['tokens']:>7} {r['seconds']:>8.2f} "
            f"{r['tokens'] / r['seconds']:>7.1f} {span:>14}"
        )
    lo, hi = result["vllm_vs_raw_range"]
    print(
        f"VLLMSampler / raw vLLM (n={result['headline_n']}): {result['vllm_vs_raw']:.3f} (any repeat pair "
        f"{lo:.3f}-{hi:.3f}); engine start {result['engine_start_s']:.1f} s; weight push median "
        f"{result['push_s']:.2f} s ({result['pushes_s']})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.sampler_throughput",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", default="smollm2-135m-instruct", help="embedded name or model folder")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--n", type=int, nargs="+", default=[1, 4], help="samples per prompt, one case each")
    parser.add_argument("--skip-hf", action="store_true", help="leave out HFSampler (slowest)")
    parser.add_argument("--repeats", type=int, default=REPEATS, help=f"timed calls per case (default {REPEATS})")
    parser.add_argument("--quick", action="store_true", help="64 new tokens, n=4 only")
    parser.add_argument("--json", help="write the result here")
    args = parser.parse_args()
    if args.quick:
        args.max_new_tokens, args.n = 64, [4]
    result = run(args.model, args.max_new_tokens, args.n, args.skip_hf, args.repeats)
    print_table(result)
    if args.json:
        write_json(args.json, result)


if __name__ == "__main__":
    main()
