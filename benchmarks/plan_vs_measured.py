"""The memory plan (``mempo.capacity.gpu_memory``) against one measured training micro-batch, on the CPU or on a GPU.

    python -m benchmarks.plan_vs_measured                     # CPU: tiny and SmolLM2-135M, 4 rows x 512 tokens
    python -m benchmarks.plan_vs_measured --models tiny --rows 2 --length 256
    python -m benchmarks.plan_vs_measured --device cuda       # GPU: the 1-GPU recipes at full size, random weights
    python -m benchmarks.plan_vs_measured --device cuda --recipes +exp=mempo_1gpu --set optim.micro_batch_size=2

CPU mode (the default). For each model, with gradient checkpointing off and on, a fresh process
(``MALLOC_MMAP_THRESHOLD_=65536``, so that the RSS follows live tensors; one torch thread) builds the policy in float32
from its config.json (random weights: the same tensors as loading them, without the file's pages counting in the RSS),
runs a small warm-up step so the gradients and AdamW's moments exist (gradients kept allocated, as they are from a
step's second micro-batch on), then one training micro-batch as ``MemPOModule._update`` runs it: ``token_logprobs``
over ``--rows`` rows of ``--length`` tokens (the last row one token shorter, so padding materializes the attention
mask as in training), the head on the last ``--scored`` positions of each row, backward, AdamW step.
measured: the peak RSS above the RSS before the model was built (/proc/self/status VmHWM, reset through clear_refs):
params (after the build), + grads + moments (after the warm-up), + activations and logits (the micro-batch's peak).
plan: ``plan_memory`` of the same setting composed as ``experiments/plan.py`` would (``model.name_or_path``,
``optim.micro_batch_size``, ``agent.max_context_tokens``, ``sampler.max_new_tokens``, ``model.gradient_checkpointing``,
``trainer.precision=32-true``, ``sampler=hf``): its trainer-side bytes, params + gradients + moments + activations
+ logits. ratio = plan / measured (above 1: the plan over-estimates, the safe side).

Recipe mode (``--device cuda``, or ``--recipes`` on the CPU). For each recipe (``+exp=mempo_1gpu`` and
``+exp=mempo_1gpu_lora`` by default; ``--set`` adds overrides to each), a fresh process composes the config as
``experiments/run.py`` does, plans it, builds the policy from its config (a folder's config.json or the published
config in ``KNOWN_CONFIGS``: nothing is downloaded) with random weights directly on the device in ``model.dtype``,
makes it trainable as training does (``trainable_policy``: gradient checkpointing, LoRA) and runs the plan's own
micro-batch (``optim.micro_batch_size`` rows of the plan's sequence bound, ``sampler.max_new_tokens`` scored per row,
the last row one token shorter) as ``MemPOModule._update`` runs it, inside the trainer's precision region (Lightning's
``MixedPrecision`` plugin for ``*-mixed``: autocast without a weight cache): ``token_logprobs``, ``policy_objective``
(the recipe's loss, KL included), backward, gradient clipping, AdamW; one warm-up micro-batch (gradients kept
allocated), then the measured one. Bytes come from torch's CUDA allocator (``memory_allocated`` and
``max_memory_allocated``, reset per phase), on the CPU from the RSS as above. Per term, plan against measured:
params (after the build); grads + AdamW moments (after the warm-up); the autocast cache (allocated inside the region
after the measured backward, above before it: 0 planned, Lightning keeps none); weight casts + activations + logits
(the forward and backward's peak above the state before it); the optimizer step's buffer (the step's peak above
before it); the trainer side of the update phase (the micro-batch's peak above the empty device). Then the
micro-batch's tokens per second (forward and backward), and, for contrast, one more micro-batch under torch's
default ``torch.autocast`` (its weight cache on): what that region holds after backward, and the state read inside it
after the step.
"""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path
from typing import Any

from benchmarks.common import log, machine, peak_rss_mb, reset_peak_rss, rss_mb, run_child, write_json

MODELS = ("tiny", "smollm2-135m-instruct")
RECIPES = ("+exp=mempo_1gpu", "+exp=mempo_1gpu_lora")
# glibc serves allocations of 64 KiB and more with mmap and unmaps them on free: the RSS follows live tensors.
EXACT_RSS = {"MALLOC_MMAP_THRESHOLD_": "65536"}
MIB = 2**20
GIB = 2**30
# A GPU recipe run on the CPU (CI, a quick look): the plan then models the CPU (AdamW's per-tensor loop), which has no
# vLLM sleep mode.
CPU_RECIPE = ("trainer.accelerator=cpu", "sampler.enable_sleep_mode=false")
# Recipe mode's terms: (key, label); the plan's and the measured bytes of each.
TERMS = (
    ("params", "params"),
    ("state", "grads + AdamW moments"),
    ("cache", "autocast cache (Lightning: none)"),
    ("compute", "weight casts + activations + logits"),
    ("step", "optimizer step buffer"),
    ("trainer_side", "trainer side, update phase"),
)


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


class Meter:
    """Allocated bytes on ``device``: torch's CUDA allocator, or the resident set on the CPU (with ``EXACT_RSS``)."""

    def __init__(self, device: str) -> None:
        import torch

        self.torch, self.cuda = torch, device == "cuda"

    def now(self) -> int:
        if self.cuda:
            self.torch.cuda.synchronize()
            return self.torch.cuda.memory_allocated()
        return int(rss_mb() * MIB)

    def reset_peak(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()
            self.torch.cuda.reset_peak_memory_stats()
        else:
            reset_peak_rss()

    def peak(self) -> int:
        if self.cuda:
            self.torch.cuda.synchronize()
            return self.torch.cuda.max_memory_allocated()
        return int(peak_rss_mb() * MIB)


def recipe_overrides(recipe: str, extra: list[str], device: str) -> list[str]:
    return [recipe, *(CPU_RECIPE if device == "cpu" else ()), *extra]


def hf_config(name: str, cache_dir: str | None) -> Any:
    """The transformers config of ``model.name_or_path`` as the plan reads its shape: a folder's (an embedded name's
    built folder included) config.json, else the published one in ``KNOWN_CONFIGS``, else ``tiny``'s own."""
    from transformers import AutoConfig

    from mempo.capacity.gpu_memory import KNOWN_CONFIGS, SMOLLM2_VOCAB
    from mempo.lm.loading import SMOLLM2, TINY, cache_root, tiny_config

    folder = cache_root(cache_dir) / name if name in (SMOLLM2, TINY) else Path(name).expanduser()
    if (folder / "config.json").is_file():
        return AutoConfig.from_pretrained(folder)
    if name in KNOWN_CONFIGS:
        return AutoConfig.for_model(**KNOWN_CONFIGS[name])
    if name == TINY:
        return tiny_config(SMOLLM2_VOCAB)
    raise ValueError(f"config key model.name_or_path={name!r}: no config.json there and not a known config")


def recipe_child(recipe: str, extra: list[str], device: str) -> dict[str, Any]:
    """One recipe's micro-batch, measured per phase (module docstring)."""
    import contextlib
    import time

    import torch
    from transformers import AutoModelForCausalLM

    from mempo.capacity.gpu_memory import plan_memory
    from mempo.lm.logprobs import token_logprobs
    from mempo.losses import loss_weights, policy_objective
    from mempo.stages.builders import group, trainable_policy
    from mempo.stages.config import compose_config

    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device here")
    if device == "cpu":
        torch.set_num_threads(1)
    cfg = compose_config(*recipe_overrides(recipe, extra, device))
    plan = plan_memory(cfg)
    x = plan.inputs
    m, optim, loss_cfg = group(cfg, "model"), group(cfg, "optim"), group(cfg, "loss")
    if x.precision.endswith("-true") and x.precision not in ("32-true", "32"):
        raise SystemExit(f"config key trainer.precision={x.precision}: recipe mode measures 32-true and *-mixed")
    meter = Meter(device)

    def region() -> Any:
        """The trainer's precision region around a training step (Lightning's MixedPrecision plugin)."""
        if not x.precision.endswith("-mixed"):
            return contextlib.nullcontext()
        from lightning.pytorch.plugins.precision import MixedPrecision

        return MixedPrecision(x.precision, device).forward_context()

    config = hf_config(str(cfg.model.name_or_path), cfg.model.cache_dir)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[m.dtype]
    gen = torch.Generator().manual_seed(0)
    rows, length, scored = x.micro_batch_size, x.seq_len, x.scored_per_row
    ids = torch.randint(0, config.vocab_size, (rows, length), generator=gen).to(device)
    mask = torch.ones(rows, length, dtype=torch.long, device=device)
    mask[-1, -1] = 0  # one padded position: the decoder then builds the [b, 1, s, s] mask, as for real batches
    response = torch.zeros(rows, length, dtype=torch.bool, device=device)
    response[:, length - scored - 1 : length - 1] = True  # the last `scored` real tokens of each row
    sign = 1.0 - 2.0 * (torch.arange(rows, device=device) % 2).float()
    adv = sign[:, None] * response.float()
    weights = loss_weights(response, loss_cfg.agg, traj_ids=torch.arange(rows, device=device))  # a row a trajectory

    base = meter.now()
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    policy = trainable_policy(model, m)
    policy.train()
    params = meter.now() - base
    trainable = [p for p in policy.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=optim.lr, weight_decay=optim.weight_decay)

    def forward_backward() -> None:
        logp = token_logprobs(policy, ids, mask, score_mask=response)
        old = logp.detach()
        ref = old - 0.01 if loss_cfg.kl_coef > 0 else None
        loss, _ = policy_objective(logp, old, adv, response, loss_cfg, ref_logp=ref, weights=weights, sampler_logp=old)
        loss.backward()

    def step() -> None:
        torch.nn.utils.clip_grad_norm_(policy.parameters(), optim.grad_clip)
        opt.step()

    with region():  # warm-up: gradients and moments allocated, kernels chosen
        forward_backward()
        step()
    opt.zero_grad(set_to_none=False)  # kept, as from a step's second micro-batch on
    state = meter.now() - base - params

    before = meter.now()
    meter.reset_peak()
    with region():
        start = time.perf_counter()
        forward_backward()
        compute_peak = meter.peak()  # synchronizes
        fwd_bwd_s = time.perf_counter() - start
        cache = meter.now() - before
        torch.nn.utils.clip_grad_norm_(policy.parameters(), optim.grad_clip)
        before_step = meter.now()
        meter.reset_peak()
        start = time.perf_counter()
        opt.step()
        step_peak = meter.peak()
        step_s = time.perf_counter() - start
    opt.zero_grad(set_to_none=False)
    measured = {
        "params": params,
        "state": state,
        "cache": max(cache, 0),  # RSS on the CPU can shrink a little between two reads
        "compute": compute_peak - before,
        "step": max(step_peak - before_step, 0),
        "trainer_side": compute_peak - base,
    }
    default_cache: dict[str, int] = {}
    if x.precision.endswith("-mixed"):  # torch's own default region, for contrast: its weight cache on
        low = torch.bfloat16 if x.precision.startswith("bf16") else torch.float16
        before = meter.now()
        with torch.autocast(device, dtype=low):
            forward_backward()
            default_cache["held_after_backward"] = max(meter.now() - before, 0)
            step()
            default_cache["state_in_region"] = meter.now() - base - params
        opt.zero_grad(set_to_none=False)
    p = plan
    planned = {
        "params": p.params,
        "state": p.grads + p.optimizer,
        "cache": 0,
        "compute": p.weight_casts + p.activations + p.logits,
        "step": p.optimizer_step,
        "trainer_side": p.trainer_side,
    }
    total = sum(q.numel() for q in policy.parameters())
    return {
        "recipe": recipe,
        "overrides": extra,
        "device": device,
        "device_name": torch.cuda.get_device_name() if device == "cuda" else lscpu_model(),
        "torch": torch.__version__,
        "model": str(cfg.model.name_or_path),
        "precision": x.precision,
        "checkpointing": x.gradient_checkpointing,
        "lora_rank": x.lora_rank,
        "rows": rows,
        "length": length,
        "scored": scored,
        "tokens": int(mask.sum()),
        "plan": planned,
        "measured": measured,
        "default_cache": default_cache,
        "params_built": total,
        "params_planned": p.shape.total_params + (p.trainable if x.lora_rank else 0),
        "trainable_built": sum(q.numel() for q in trainable),
        "trainable_planned": p.trainable,
        "fwd_bwd_s": fwd_bwd_s,
        "step_s": step_s,
    }


def run_recipes(recipes: list[str], extra: list[str], device: str) -> dict[str, Any]:
    results = []
    for recipe in recipes:
        log(f"plan_vs_measured: {recipe} on {device}")
        args = ["--child-recipe", recipe, "--device", device, *(["--set", *extra] if extra else [])]
        results.append(run_child("benchmarks.plan_vs_measured", args, env=EXACT_RSS))
    return {"mode": "recipes", "device": device, "results": results, **machine()}


def _ratio(plan: int, measured: int) -> str:
    return f"{plan / measured:.2f}" if measured > 2**20 else "-"


def print_recipes(result: dict[str, Any]) -> None:
    for r in result["results"]:
        if "error" in r:
            print(f"\n{r['error']} ({r.get('cause')})")
            continue
        what = f"LoRA rank {r['lora_rank']}" if r["lora_rank"] else "full"
        print(
            f"\nplan vs measured, {r['recipe']}{' ' + ' '.join(r['overrides']) if r['overrides'] else ''} on "
            f"{r['device']} ({r['device_name']}, torch {r['torch']}): {r['model']}, {what}, {r['precision']}, "
            f"gradient checkpointing {'on' if r['checkpointing'] else 'off'}; one micro-batch of {r['rows']} x "
            f"{r['length']} tokens, {r['scored']} scored per row; GiB"
        )
        print(f"  {'term':<38} {'plan':>8} {'measured':>9} {'ratio':>6}")
        for key, label in TERMS:
            p, m = r["plan"][key], r["measured"][key]
            print(f"  {label:<38} {p / GIB:>8.3f} {m / GIB:>9.3f} {_ratio(p, m):>6}")
        same = r["params_built"] == r["params_planned"] and r["trainable_built"] == r["trainable_planned"]
        print(
            f"  parameters built {r['params_built']:,} ({r['trainable_built']:,} trainable), planned "
            f"{r['params_planned']:,} ({r['trainable_planned']:,}): {'equal' if same else 'DIFFERENT'}"
        )
        rate = r["tokens"] / r["fwd_bwd_s"]
        print(
            f"  micro-batch {r['tokens']:,} tokens: forward + backward {r['fwd_bwd_s']:.2f} s ({rate / 1e3:.1f}k "
            f"tokens/s), AdamW step {r['step_s']:.3f} s"
        )
        d = r["default_cache"]
        if d:
            print(
                f"  torch's default autocast (weight cache on; not mempo's region): held after backward "
                f"{d['held_after_backward'] / GIB:.3f}; grads + moments read inside it after the step "
                f"{d['state_in_region'] / GIB:.3f}"
            )


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
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cuda: recipe mode on a GPU")
    parser.add_argument("--models", nargs="+", help=f"CPU mode: model.name_or_path values (default {MODELS})")
    parser.add_argument("--rows", type=int, help="CPU mode: optim.micro_batch_size (default 4)")
    parser.add_argument("--length", type=int, help="CPU mode: tokens per row, agent.max_context_tokens (default 512)")
    parser.add_argument("--scored", type=int, help="CPU mode: response tokens per row, sampler.max_new_tokens (128)")
    parser.add_argument("--recipes", nargs="+", help=f"recipe mode: +exp=NAME values (default with cuda: {RECIPES})")
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE", help="recipe mode: config overrides")
    parser.add_argument("--json", help="write the result here")
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "CHECKPOINTING"), help=argparse.SUPPRESS)
    parser.add_argument("--child-recipe", help=argparse.SUPPRESS)
    args = parser.parse_args()
    recipe_mode = args.device == "cuda" or args.recipes is not None or args.child_recipe is not None
    cpu_flags = [f"--{k}" for k in ("models", "rows", "length", "scored") if getattr(args, k) is not None]
    if recipe_mode and cpu_flags:
        parser.error(f"{', '.join(cpu_flags)}: CPU mode only; recipe mode takes the micro-batch from the recipe "
                     "(change it with --set optim.micro_batch_size=N agent.max_context_tokens=T ...)")  # fmt: skip
    if not recipe_mode and args.set:
        parser.error("--set: recipe mode only (--device cuda or --recipes)")
    bad = [a for a in args.set if "=" not in a]
    if bad:
        parser.error(f"--set takes KEY=VALUE overrides, got {bad}")
    if args.child_recipe:
        result = recipe_child(args.child_recipe, args.set, args.device)
    elif recipe_mode:
        result = run_recipes(args.recipes or list(RECIPES), args.set, args.device)
        print_recipes(result)
        if any("error" in r for r in result["results"]):
            if args.json:
                write_json(args.json, result)
            raise SystemExit(1)
    elif args.child:
        result = child(args.child[0], args.child[1] == "1", args.rows or 4, args.length or 512, args.scored or 128)
    else:
        rows, length, scored = args.rows or 4, args.length or 512, args.scored or 128
        result = run(args.models or list(MODELS), rows, length, scored)
        print_table(result)
    if args.json:
        write_json(args.json, result)


if __name__ == "__main__":
    main()
