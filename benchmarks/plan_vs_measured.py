"""The memory plan (``mempo.capacity.gpu_memory``) against one measured training micro-batch on this CPU.

    python -m benchmarks.plan_vs_measured                     # tiny and SmolLM2-135M, 4 rows x 512 tokens
    python -m benchmarks.plan_vs_measured --models tiny --rows 2 --length 256

For each model, with gradient checkpointing off and on, a fresh process (``MALLOC_MMAP_THRESHOLD_=65536``, so that
the RSS follows live tensors; one torch thread) builds the policy in float32 from its config.json (random weights:
the same tensors as loading them, without the file's pages counting in the RSS), runs a small warm-up step so the
gradients and AdamW's moments exist (gradients kept allocated, as they are from a step's second micro-batch on),
then one training micro-batch as ``MemPOModule._update`` runs it: ``token_logprobs`` over ``--rows`` rows of
``--length`` tokens (the last row one token shorter, so padding materializes the attention mask as in training),
the head on the last ``--scored`` positions of each row, backward, AdamW step.

measured: the peak RSS above the RSS before the model was built (/proc/self/status VmHWM, reset through clear_refs):
params (after the build), + grads + moments (after the warm-up), + activations and logits (the micro-batch's peak).
plan: ``plan_memory`` of the same setting composed as ``experiments/plan.py`` would (``model.name_or_path``,
``optim.micro_batch_size``, ``agent.max_context_tokens``, ``sampler.max_new_tokens``, ``model.gradient_checkpointing``,
``trainer.precision=32-true``, ``sampler=hf``): its trainer-side bytes, params + gradients + moments + activations
+ logits. ratio = plan / measured (above 1: the plan over-estimates, the safe side).
"""

from __future__ import annotations

import argparse
import subprocess
from typing import Any

from benchmarks.common import log, machine, peak_rss_mb, reset_peak_rss, rss_mb, run_child, write_json

MODELS = ("tiny", "smollm2-135m-instruct")
# glibc serves allocations of 64 KiB and more with mmap and unmaps them on free: the RSS follows live tensors.
EXACT_RSS = {"MALLOC_MMAP_THRESHOLD_": "65536"}
MIB = 2**20


def plan_bytes(model: str, rows: int, length: int, scored: int, checkpointing: bool) -> dict[str, int]:
    """The plan's figures for this setting, composed as experiments/plan.py composes a config."""
    from mempo.capacity.gpu_memory import plan_memory
    from mempo.stages.config import compose_config

    cfg = compose_config(
        f"model.name_or_path={model}",
        "sampler=hf",
        "trainer.precision=32-true",
        f"optim.micro_batch_size={rows}",
        f"agent.max_context_tokens={length}",
        f"sampler.max_new_tokens={scored}",
        f"model.gradient_checkpointing={str(checkpointing).lower()}",
    )
    p = plan_memory(cfg)
    return {
        "params": p.params,
        "state": p.grads + p.optimizer,
        "compute": p.activations + p.logits,
        "trainer_side": p.trainer_side,
        "total_params": p.shape.total_params,
    }


def child(model_name: str, checkpointing: bool, rows: int, length: int, scored: int) -> dict[str, Any]:
    import time

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from mempo.lm.loading import resolve_model_path
    from mempo.lm.logprobs import token_logprobs

    torch.set_num_threads(1)
    config = AutoConfig.from_pretrained(resolve_model_path(model_name))
    gen = torch.Generator().manual_seed(0)

    def batch(n: int, t: int, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        ids = torch.randint(0, config.vocab_size, (n, t), generator=gen)
        mask = torch.ones(n, t, dtype=torch.long)
        mask[-1, -1] = 0  # one padded position: the decoder then builds the [n, 1, t, t] mask, as for real batches
        score = torch.zeros(n, t, dtype=torch.bool)
        score[:, t - k - 1 : t - 1] = True  # the response: the last k real tokens of each row
        return ids, mask, score

    def micro_batch(x: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> None:
        ids, mask, score = x
        logp = token_logprobs(model, ids, mask, score_mask=score)  # [N, T]
        loss = -(logp * score).sum() / score.sum()
        loss.backward()

    small, full = batch(1, 16, 4), batch(rows, length, scored)
    reset_peak_rss()
    base = rss_mb()
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.train()
    if checkpointing:
        model.gradient_checkpointing_enable()
    params_mb = rss_mb() - base
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    micro_batch(small)  # warm-up: gradients and moments allocated
    opt.step()
    opt.zero_grad(set_to_none=False)
    state_mb = rss_mb() - base - params_mb
    warm_peak = peak_rss_mb() - base
    before = rss_mb()
    reset_peak_rss()
    start = time.perf_counter()
    micro_batch(full)
    opt.step()
    seconds = time.perf_counter() - start
    compute_mb = peak_rss_mb() - before
    peak = max(warm_peak, peak_rss_mb() - base)
    return {
        "measured_mb": {"params": params_mb, "state": state_mb, "compute": compute_mb, "trainer_side": peak},
        "seconds": seconds,
        "numel": sum(p.numel() for p in model.parameters()),
    }


def lscpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return machine()["cpu"]
    return next((ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Model name")), "")


def run(models: list[str], rows: int, length: int, scored: int) -> dict[str, Any]:
    results = []
    for model in models:
        for checkpointing in (False, True):
            log(f"plan_vs_measured: {model}, checkpointing {'on' if checkpointing else 'off'}, [{rows}, {length}]")
            args = ["--child", model, str(int(checkpointing))]
            args += ["--rows", str(rows), "--length", str(length), "--scored", str(scored)]
            measured = run_child("benchmarks.plan_vs_measured", args, env=EXACT_RSS)
            row: dict[str, Any] = {"model": model, "checkpointing": checkpointing, **measured}
            if "error" not in measured:
                plan = plan_bytes(model, rows, length, scored, checkpointing)
                row["plan_mb"] = {k: plan[k] / MIB for k in ("params", "state", "compute", "trainer_side")}
                row["params_exact"] = plan["total_params"] == measured["numel"]
                row["ratio"] = row["plan_mb"]["trainer_side"] / measured["measured_mb"]["trainer_side"]
            results.append(row)
    return {"rows": rows, "length": length, "scored": scored, "results": results, "cpu": lscpu_model(), **machine()}


def print_table(result: dict[str, Any]) -> None:
    print(
        f"\nplan vs measured, float32 on CPU (lscpu: {result['cpu']}, avx512_bf16 {result['avx512_bf16']}, "
        f"{result['cores']} cores), one micro-batch of {result['rows']} x "
        f"{result['length']} tokens, {result['scored']} scored per row; MiB (plan / measured)"
    )
    head = ("model", "ckpt", "params", "grads+AdamW", "act+logits", "trainer-side", "ratio")
    print(f"{head[0]:>22} {head[1]:>4} {head[2]:>15} {head[3]:>15} {head[4]:>15} {head[5]:>15} {head[6]:>6}")
    for r in result["results"]:
        if "error" in r:
            print(f"{r['model']:>22} error: {r['error']} ({r.get('cause')})")
            continue
        p, m = r["plan_mb"], r["measured_mb"]
        cells = [f"{p[k]:.0f}/{m[k]:.0f}" for k in ("params", "state", "compute", "trainer_side")]
        gc = "on" if r["checkpointing"] else "off"
        print(f"{r['model']:>22} {gc:>4} " + " ".join(f"{c:>15}" for c in cells) + f" {r['ratio']:>6.2f}")
    exact = all(r.get("params_exact") for r in result["results"] if "error" not in r)
    print(f"parameter counts equal sum(p.numel()): {exact}")


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.plan_vs_measured",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--models", nargs="+", default=list(MODELS), help="model.name_or_path values")
    parser.add_argument("--rows", type=int, default=4, help="optim.micro_batch_size")
    parser.add_argument("--length", type=int, default=512, help="tokens per row (agent.max_context_tokens)")
    parser.add_argument("--scored", type=int, default=128, help="response tokens per row (sampler.max_new_tokens)")
    parser.add_argument("--json", help="write the result here")
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "CHECKPOINTING"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        result = child(args.child[0], args.child[1] == "1", args.rows, args.length, args.scored)
    else:
        result = run(args.models, args.rows, args.length, args.scored)
        print_table(result)
    if args.json:
        write_json(args.json, result)


if __name__ == "__main__":
    main()
