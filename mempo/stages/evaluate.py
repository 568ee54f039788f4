"""The ``eval`` stage (``stage=eval``, ``experiments/eval.py``): every checkpoint of ``eval.checkpoints`` (or
``model.name_or_path``) x ``eval.agents`` x ``eval.objectives`` on the same ``eval.split`` tasks, then the report in
``<run_dir>/eval/`` (``mempo.eval.report.write_report``: tables with intervals, results.jsonl, failures, figures).
Unlike the training stages it may run in a folder that holds a run: it writes only into ``eval/``, and replaces an
earlier evaluation there, saying so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from mempo.core.console import progress, say
from mempo.eval.compare import GRID_FIELDS, EvalConfig, GridResult, evaluate_grid
from mempo.eval.report import log_to_wandb, write_report
from mempo.lm.loading import load_policy, resolve_model_path
from mempo.stages.builders import (
    build_builder,
    build_env,
    build_sampler,
    build_tasks,
    group,
    run_path,
    synthetic_chains,
)
from mempo.stages.config import native_bf16
from mempo.stages.steps import stage


@stage("eval")
def evaluate(cfg: DictConfig) -> dict[str, Any]:
    """``run_eval`` and its interval table on the console."""
    result = run_eval(cfg)
    failures = Path(result["out"], "failures.md")
    if failures.is_file():
        say("\nFailure verdicts per objective (mempo.eval.failures):\n\n" + failures.read_text().rstrip("\n"))
    say("\n" + Path(result["out"], "intervals.md").read_text().rstrip("\n") + "\n")  # the table, last
    say(f"[mempo] eval outputs: {result['out']} (table.md, failures.md, results.jsonl, figures)")
    return result


def checkpoint_folders(cfg: DictConfig) -> dict[str, str]:
    """``eval.checkpoints`` (label -> folder), or {basename of model.name_or_path: model.name_or_path}."""
    if cfg.eval.checkpoints:
        return {str(k): str(v) for k, v in cfg.eval.checkpoints.items()}
    name = str(cfg.model.name_or_path)
    return {Path(name).name or name: name}


def engine_dtype(evaluation: EvalConfig, bf16: bool) -> str | None:
    """The evaluation engine's dtype: eval.engine_dtype, ``auto`` resolved by whether this machine has native bf16
    kernels (``bf16``, ``native_bf16``), as ``sampler.dtype=auto``; None = sampler.dtype."""
    if evaluation.engine_dtype == "auto":
        return "bfloat16" if bf16 else "float32"
    return evaluation.engine_dtype


def run_eval(
    cfg: DictConfig,
    *,
    agents: Mapping[str, Sequence[str]] | None = None,
    out: Path | None = None,
    done: GridResult | None = None,
) -> dict[str, Any]:
    """The grid for every checkpoint, then ``<run_dir>/eval/`` (see ``write_report``).

    agents: checkpoint label -> the agents (contexts) that checkpoint is evaluated with (the headline evaluates a
    ReAct-trained checkpoint only as a full-history agent); a label not in it gets ``eval.agents``.
    out: the output folder instead of ``<run_dir>/eval``.
    done: results an earlier evaluation under this config already holds for some of the checkpoints (the study's,
    when arms are added to it): those checkpoints are not evaluated again, their results go into the report as they
    are, and every row follows the order of ``eval.checkpoints``. The caller vouches that they are comparable.
    -> {"rows", "out", "files"}.
    """
    out = run_path(cfg, "eval") if out is None else Path(out)
    if (out / "results.jsonl").is_file() or (out / "table.csv").is_file():
        say(f"[mempo] eval: replacing the earlier evaluation in {out} (results.jsonl, tables, figures)")
    evaluation: EvalConfig = group(cfg, "eval")
    per_label = {label: replace(evaluation, agents=list(contexts)) for label, contexts in (agents or {}).items()}
    split = evaluation.split  # val: held-out tasks; train: the training world's, RL's task distribution
    tasks_by_n = {
        n: build_tasks(cfg, split, num_tasks=evaluation.num_tasks, objectives=n) for n in evaluation.objectives
    }
    chains = synthetic_chains(cfg)  # qid -> chain of every split's questions (failure verdicts look up by qid)
    agent = group(cfg, "agent")
    sampling = group(cfg, "sampler").sampling(seed=cfg.seed, greedy=evaluation.greedy)  # per-label copies keep greedy
    bf16 = native_bf16(cfg.trainer.accelerator)
    if evaluation.engine_dtype and cfg.sampler.backend == "vllm":
        say(f"[mempo] eval: the engine runs in {engine_dtype(evaluation, bf16)} (eval.engine_dtype)")
    order = list(checkpoint_folders(cfg))
    held = {r["checkpoint"] for r in done.rows} if done else set()
    kept = [label for label in order if label in held]
    total = done.only(kept) if done else GridResult([], [], [])
    if kept:
        say(f"[mempo] eval: keeping the earlier results of {', '.join(kept)} (not evaluated again)")
    folders = {label: f for label, f in checkpoint_folders(cfg).items() if label not in kept}
    reference = None
    if evaluation.kl_reference:  # one frozen copy for every checkpoint's KL (a second model in memory)
        say(f"[mempo] eval: KL of each checkpoint to {evaluation.kl_reference} (eval.kl_reference)")
        ref_folder = resolve_model_path(evaluation.kl_reference, cache_dir=cfg.model.cache_dir)
        reference, _ = load_policy(ref_folder, dtype=cfg.model.dtype, trust_remote_code=cfg.model.trust_remote_code)
        reference.requires_grad_(False).eval()
    rows = sum(len(per_label.get(label, evaluation).agents) for label in folders) * len(evaluation.objectives)
    bar = progress("eval", rows, unit="row")  # a row: one checkpoint x agent x N on its task set

    def on_row(row: dict[str, Any]) -> None:
        bar.set_postfix_str(f"{row['checkpoint']} {row['agent']} N={row['objectives']}: EM {row['em']:.3f}")
        bar.update(1)

    for label, name in folders.items():
        folder = resolve_model_path(name, cache_dir=cfg.model.cache_dir)
        ev = per_label.get(label, evaluation)
        say(f"[mempo] eval: {label} ({folder}) on N = {list(ev.objectives)}, agents {list(ev.agents)}")
        policy, tokenizer = load_policy(folder, dtype=cfg.model.dtype, trust_remote_code=cfg.model.trust_remote_code)
        sampler = build_sampler(cfg, folder, policy, tokenizer, dtype=engine_dtype(evaluation, bf16), logprobs="raw")
        pad_id = tokenizer.pad_token_id  # load_tokenizer sets one (eos when the model has none)
        try:
            res = evaluate_grid(
                sampler,
                build_env(cfg, tokenizer),
                build_builder(cfg, tokenizer),
                tasks_by_n,
                agent,
                sampling,
                ev,
                checkpoint=label,
                reward_kind=cfg.reward.kind,
                include_tags=cfg.memory.include_tags,
                policy=policy if ev.score_memories or reference is not None else None,
                reference=reference,
                pad_id=pad_id,
                bf16=bf16,
                chains=chains,
                on_row=on_row,
            )
        finally:
            sampler.shutdown()
        for f in GRID_FIELDS:
            getattr(total, f).extend(getattr(res, f))
        del policy
    bar.close()
    for f in GRID_FIELDS:  # stable: each checkpoint's rows keep their order
        getattr(total, f).sort(key=lambda x: order.index(x["checkpoint"]))
    scored = any(ev.score_memories for ev in (evaluation, *per_label.values()))
    num_tasks = max(len(tasks) for tasks in tasks_by_n.values())  # eval.num_tasks, or the split's size when null
    files = write_report(out, total, num_tasks=num_tasks, memories_scored=scored)
    if cfg.logger.kind == "wandb":
        log_to_wandb(cfg, total, files)
    result = {"rows": total.rows, "out": str(out), "files": {k: str(v) for k, v in files.items()}}
    if total.failures:  # verdict tallies per checkpoint x agent x N (synthetic data), for composed stages (study)
        result["failures"] = total.failures
    if total.source_rows:  # tasks of several data_sources (a single-source run's summary is as before)
        result["source_rows"] = total.source_rows
    return result
