"""Cost of the weight canary (``SamplerCallback.check_weights``) per check, i.e. per RL step with the default
``sampler.canary_every=1``: the engine's greedy continuation of the probe plus one trainer forward over it.

    python -m benchmarks.canary_cost                                  # tiny model, HF sampler (seconds)
    python -m benchmarks.canary_cost --model smollm2-135m-instruct --sampler vllm   # the demo's engine

Prints the median and max seconds over ``--repeats`` checks after one warm-up check. Compare with a step's
``perf/step_s`` in metrics.csv (about 60 s for the demo's RL step on this machine).
"""

from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.canary_cost", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--sampler", default="hf", choices=("hf", "vllm"))
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--tokens", type=int, default=8, help="sampler.canary_tokens")
    args = parser.parse_args()

    from mempo.lm.loading import load_policy, resolve_model_path
    from mempo.models.callbacks import SamplerCallback
    from mempo.stages.builders import build_sampler
    from mempo.stages.config import compose_config

    cfg = compose_config(f"model.name_or_path={args.model}", f"sampler={args.sampler}", "sampler.kv_cache_space_gb=1")
    path = resolve_model_path(args.model)
    policy, tokenizer = load_policy(path)
    sampler = build_sampler(cfg, path, policy, tokenizer)
    callback = SamplerCallback(lambda _: sampler, canary_tokens=args.tokens)
    callback.sampler = sampler
    module = SimpleNamespace(policy=policy, tokenizer=tokenizer)
    try:
        callback.check_weights(module, 0)  # warm-up
        times = []
        for step in range(1, args.repeats + 1):
            t0 = time.perf_counter()
            diff = callback.check_weights(module, step)
            times.append(time.perf_counter() - t0)
    finally:
        sampler.shutdown()
    print(
        f"canary ({args.model}, {args.sampler}, {args.tokens} tokens): median {statistics.median(times):.4f} s, "
        f"max {max(times):.4f} s per check over {args.repeats}; last logp diff {diff:.2e}"
    )


if __name__ == "__main__":
    main()
