"""Generation throughput: raw vLLM versus VLLMSampler versus HFSampler on the same prompts.

    python -m benchmarks.sampler_throughput                       # SmolLM2-135M-Instruct, 8 prompts, n=1 and n=4
    python -m benchmarks.sampler_throughput --quick               # 64 new tokens, n=4 only
    python -m benchmarks.sampler_throughput --model tiny --max-new-tokens 32

tok/s counts generated tokens (eos included, prompts excluded) over wall time of the generate call, after one
warm-up call per engine; each case is timed ``--repeats`` times and the median is reported (the same seed each
time, so the same tokens). "raw vLLM" is ``vllm.LLM.generate`` without log-probs, so the gap to VLLMSampler is
the price of log-probs and of our conversion. Also reports VLLMSampler's weight-push time (median of 5).
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


Row = tuple[str, int, float, int]  # sampler, n, seconds, generated tokens


def lengths(out: list[list[Generation]]) -> list[int]:
    return [len(g.token_ids) for samples in out for g in samples]


REPEATS = 3


def measure(name: str, generate: Callable[[SamplingConfig], list[int]], cases: list[SamplingConfig]) -> list[Row]:
    """One warm-up call, then ``REPEATS`` timed calls per case (median seconds); generate returns the generated
    lengths."""
    generate(SamplingConfig(max_new_tokens=4, seed=0))
    rows = []
    for params in cases:
        times, tokens = [], 0
        for _ in range(REPEATS):
            start = time.perf_counter()
            tokens = sum(generate(params))
            times.append(time.perf_counter() - start)
        rows.append((name, params.n, statistics.median(times), tokens))
    return rows


def raw_vllm(path: Path | str, prompts: list[list[int]], cases: list[SamplingConfig]) -> list[Row]:
    import vllm

    llm = vllm.LLM(model=str(path), dtype="float32", enforce_eager=True, max_model_len=2048, seed=0)
    inputs = [vllm.inputs.TokensPrompt(prompt_token_ids=p) for p in prompts]

    def generate(params: SamplingConfig) -> list[int]:
        sp = vllm.SamplingParams(n=params.n, temperature=params.temperature, max_tokens=params.max_new_tokens, seed=0)
        return [len(c.token_ids) for out in llm.generate(inputs, sp, use_tqdm=False) for c in out.outputs]

    try:
        return measure("raw vLLM", generate, cases)
    finally:
        llm.llm_engine.engine_core.shutdown()


def vllm_sampler(
    path: Path | str, prompts: list[list[int]], cases: list[SamplingConfig], weights: dict[str, torch.Tensor]
) -> tuple[list[Row], float, list[float]]:
    """-> (rows, engine start seconds, weight push seconds x5)."""
    from mempo.rollout.vllm_sampler import VLLMSampler

    start = time.perf_counter()
    sampler = VLLMSampler(path, dtype="float32", max_model_len=2048)
    start_s = time.perf_counter() - start
    try:
        rows = measure("VLLMSampler", lambda params: lengths(sampler.generate(prompts, params)), cases)
        pushes = []
        for _ in range(5):
            sampler.push_weights(weights)
            pushes.append(round(sampler.last_push_s or 0.0, 3))
    finally:
        sampler.shutdown()
    return rows, start_s, pushes


def run(model: str, max_new_tokens: int, ns: list[int], skip_hf: bool) -> dict[str, Any]:
    path = resolve_model_path(model)
    policy, tokenizer = load_policy(path)
    chats = [[{"role": "user", "content": q}] for q in QUESTIONS]
    prompts = [
        tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=True, return_dict=False) for c in chats
    ]
    cases = [SamplingConfig(n=n, max_new_tokens=max_new_tokens, temperature=1.0, seed=0) for n in ns]
    threads = torch.get_num_threads()  # before vLLM pins them

    rows = raw_vllm(path, prompts, cases)
    sampler_rows, start_s, pushes = vllm_sampler(path, prompts, cases, policy.state_dict())
    rows += sampler_rows
    if not skip_hf:
        hf = HFSampler(policy, tokenizer)
        rows += measure("HFSampler", lambda params: lengths(hf.generate(prompts, params)), cases)
    by_n: dict[str, dict[str, float]] = {}
    for name, n, seconds, tokens in rows:
        by_n.setdefault(str(n), {})[name] = tokens / seconds
    head = by_n[str(max(ns))]
    return {
        "raw_vllm_tok_per_s": head.get("raw vLLM"),
        "vllm_tok_per_s": head.get("VLLMSampler"),
        "hf_tok_per_s": head.get("HFSampler"),
        "vllm_vs_raw": head["VLLMSampler"] / head["raw vLLM"],
        "headline_n": max(ns),
        "by_n": by_n,
        "rows": [{"sampler": r[0], "n": r[1], "seconds": r[2], "tokens": r[3]} for r in rows],
        "engine_start_s": start_s,
        "push_s": statistics.median(pushes),
        "pushes_s": pushes,
        "prompts": len(prompts),
        "max_new_tokens": max_new_tokens,
        "repeats": REPEATS,
        "torch_threads": threads,
        "model": str(path),
        "machine": machine(),
    }


def print_table(result: dict[str, Any]) -> None:
    print(
        f"\nmodel {result['model']}: {result['prompts']} prompts, {result['max_new_tokens']} new tokens, fp32, "
        f"{result['torch_threads']} torch threads, median of {result['repeats']}"
    )
    print(f"{'sampler':<12} {'n':>3} {'seqs':>5} {'tokens':>7} {'seconds':>8} {'tok/s':>7}")
    for r in result["rows"]:
        seqs = r["n"] * result["prompts"]
        print(
            f"{r['sampler']:<12} {r['n']:>3} {seqs:>5} {r['tokens']:>7} {r['seconds']:>8.2f} "
            f"{r['tokens'] / r['seconds']:>7.1f}"
        )
    print(
        f"VLLMSampler / raw vLLM (n={result['headline_n']}): {result['vllm_vs_raw']:.3f}; engine start "
        f"{result['engine_start_s']:.1f} s; weight push median {result['push_s']:.2f} s ({result['pushes_s']})"
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
    parser.add_argument("--quick", action="store_true", help="64 new tokens, n=4 only")
    parser.add_argument("--json", help="write the result here")
    args = parser.parse_args()
    if args.quick:
        args.max_new_tokens, args.n = 64, [4]
    result = run(args.model, args.max_new_tokens, args.n, args.skip_hf)
    print_table(result)
    if args.json:
        write_json(args.json, result)


if __name__ == "__main__":
    main()
