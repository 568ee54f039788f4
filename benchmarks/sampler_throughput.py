"""Generation throughput: raw vLLM versus VLLMSampler versus HFSampler on the same prompts.

    python benchmarks/sampler_throughput.py                       # SmolLM2-135M-Instruct, 8 prompts, n=1 and n=4
    python benchmarks/sampler_throughput.py --model tiny --max-new-tokens 32

tok/s counts generated tokens (eos included, prompts excluded) over wall time of the generate call, after one
warm-up call per engine. "raw vLLM" is ``vllm.LLM.generate`` without log-probs, so the gap to VLLMSampler is
the price of log-probs and of our conversion. Also reports VLLMSampler's weight-push time (median of 5).
Engines run one at a time, in this process.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import torch  # noqa: E402

from mempo.models.loading import load_policy, resolve_model_path  # noqa: E402
from mempo.rollout.hf_sampler import HFSampler  # noqa: E402
from mempo.rollout.sampler import Generation, SamplingConfig  # noqa: E402

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


def measure(name: str, generate: Callable[[SamplingConfig], list[int]], cases: list[SamplingConfig]) -> list[Row]:
    """One warm-up call, then one timed call per case; generate returns the generated lengths."""
    generate(SamplingConfig(max_new_tokens=4, seed=0))
    rows = []
    for params in cases:
        start = time.perf_counter()
        tokens = sum(generate(params))
        rows.append((name, params.n, time.perf_counter() - start, tokens))
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct", help="embedded name or model folder")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--n", type=int, nargs="+", default=[1, 4], help="samples per prompt, one case each")
    parser.add_argument("--skip-hf", action="store_true", help="leave out HFSampler (slowest)")
    args = parser.parse_args()

    path = resolve_model_path(args.model)
    model, tokenizer = load_policy(path)
    chats = [[{"role": "user", "content": q}] for q in QUESTIONS]
    prompts = [
        tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=True, return_dict=False) for c in chats
    ]
    cases = [SamplingConfig(n=n, max_new_tokens=args.max_new_tokens, temperature=1.0, seed=0) for n in args.n]
    threads = torch.get_num_threads()  # before vLLM pins them

    rows = raw_vllm(path, prompts, cases)
    sampler_rows, start_s, pushes = vllm_sampler(path, prompts, cases, model.state_dict())
    rows += sampler_rows
    if not args.skip_hf:
        hf = HFSampler(model, tokenizer)
        rows += measure("HFSampler", lambda params: lengths(hf.generate(prompts, params)), cases)

    print(f"\nmodel {path}: {len(prompts)} prompts, {args.max_new_tokens} new tokens, fp32, {threads} torch threads")
    print(f"{'sampler':<12} {'n':>3} {'seqs':>5} {'tokens':>7} {'seconds':>8} {'tok/s':>7}")
    for name, n, seconds, tokens in rows:
        print(f"{name:<12} {n:>3} {n * len(prompts):>5} {tokens:>7} {seconds:>8.2f} {tokens / seconds:>7.1f}")
    print(f"VLLMSampler engine start {start_s:.1f} s; weight push median {statistics.median(pushes):.2f} s ({pushes})")


if __name__ == "__main__":
    main()
