"""Checkpoints x agents x objectives on the same tasks: the grid behind the ``eval`` stage
(``mempo.stages.evaluate``).

For every N in ``eval.objectives`` the ``eval.split`` tasks are built once and shared by every checkpoint and agent, so
rows of the table differ only in the policy and in the context mode (memory = MemPO's context reset, full_history = the
ReAct baseline). Each rollout's memories are scored with the checkpoint's own policy, P(ans | q, m) of Eq. 4,
which is the memory analysis of docs/algorithm.md §2 (MemPO's memory advantage should shift it upward).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from mempo.core.base import one_of, require
from mempo.core.tasks import Task
from mempo.data.synthetic import SPLITS, SyntheticQuestion
from mempo.eval.evaluate import evaluate_agent
from mempo.eval.failures import failure_tally
from mempo.eval.mem1 import mem1_scores
from mempo.eval.stats import bootstrap_ci
from mempo.lm.scoring import memory_answer_probabilities, sequence_logprobs
from mempo.losses import kl_penalty
from mempo.rollout.agent import CONTEXT_MODES, AgentConfig, Env, RolloutBatch, Trajectory
from mempo.rollout.prompts import PromptBuilder
from mempo.rollout.sampler import Sampler, SamplingConfig

METRICS = ("em", "f1", "reward", "format_fail", "turns", "tt", "pt")


ENGINE_DTYPES = (None, "auto", "float32", "bfloat16", "float16")


@dataclass(frozen=True)
class EvalConfig:
    """Config group ``eval``: the final evaluation, ``experiments/eval.py`` and in-training validation.

    num_tasks: tasks per N (tables carry 95% bootstrap intervals over them); null = the whole split, each question
    once (a pre-composed task file: every task with N objectives), per N; more than the split holds is an error;
    objectives: the N's; agents: memory
    (MemPO) and/or full_history (ReAct baseline), each on the same tasks; checkpoints: label -> HF folder (null =
    model.name_or_path); every_n_steps: in-training validation on data.num_val_tasks tasks every k RL steps (0 =
    off); turn_slack: tasks of N objectives get 2N + 1 + turn_slack turns (the oracle needs 2N + 1: two hops per
    objective and the answer), null = agent.max_turns for every N; score_memories: P(ans | q, m) of every
    evaluated memory (a forward per memory); max_trajectories: sample trajectories per checkpoint x agent x N in
    the W&B table; split: val (the held-out world) | train (the training world: RL's task distribution) | test;
    engine_dtype: the evaluation engine's dtype (vLLM): null = sampler.dtype; auto = bfloat16 where
    the machine has native bf16 (a GPU, a CPU with AVX512-BF16 or AMX), else float32 (greedy evaluation needs no
    exact log-probs; in-training validation keeps the RL engine's dtype); mem1_scores: also score every task by
    MEM1's rules (``mempo.eval.mem1``: sum over objectives, its normalisation, 0 when the answer count is wrong),
    reported beside mempo's (mean over objectives); kl_reference: an HF folder (the warm start, say): each row also
    gets kl_k1 and kl_k3, the mean over its sampled response tokens of Schulman's k1 and k3 estimates of
    KL(checkpoint || reference) at the sampling temperature (``kl_to_reference``); needs greedy=false, since a KL is
    estimated on tokens the checkpoint sampled.
    """

    num_tasks: int | None = 16
    objectives: list[int] = field(default_factory=lambda: [1, 2, 4, 6, 8, 10])
    agents: list[str] = field(default_factory=lambda: list(CONTEXT_MODES))
    greedy: bool = True
    # Any: a typed Optional[Dict] node that is null cannot take a {label: folder} override (OmegaConf merges into it)
    checkpoints: Any = None
    every_n_steps: int = 0
    turn_slack: int | None = 1
    score_memories: bool = True
    max_trajectories: int = 8
    split: str = "val"
    engine_dtype: str | None = None
    mem1_scores: bool = False
    kl_reference: str | None = None

    def __post_init__(self) -> None:
        require(
            "eval",
            self,
            [
                ("num_tasks", self.num_tasks is None or self.num_tasks >= 1, "must be null (the whole split) or >= 1"),
                ("checkpoints", self.checkpoints is None or isinstance(self.checkpoints, Mapping), "must be a mapping"),
                ("objectives", len(self.objectives) > 0 and min(self.objectives) >= 1, "must be >= 1 each"),
                (
                    "agents",
                    len(self.agents) > 0 and set(self.agents) <= set(CONTEXT_MODES),
                    f"must be a non-empty subset of {list(CONTEXT_MODES)}",
                ),
                ("every_n_steps", self.every_n_steps >= 0, "must be >= 0"),
                ("turn_slack", self.turn_slack is None or self.turn_slack >= 0, "must be null or >= 0"),
                ("max_trajectories", self.max_trajectories >= 0, "must be >= 0"),
                ("split", self.split in SPLITS, one_of(SPLITS)),
                ("engine_dtype", self.engine_dtype in ENGINE_DTYPES, one_of(ENGINE_DTYPES)),
                (
                    "kl_reference",
                    self.kl_reference is None or not self.greedy,
                    "needs eval.greedy=false: the KL to the reference is estimated on tokens the checkpoint sampled",
                ),
            ],
        )


def source_rows(records: Sequence[dict[str, Any]], keys: dict[str, Any], metrics: Sequence[str]) -> list[dict]:
    """One row per data_source of ``records`` (means over its tasks), or none when they share one source (a
    single-source evaluation, such as the main job's, reports exactly what it reported before)."""
    by: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by.setdefault(r["data_source"], []).append(r)
    if len(by) < 2:
        return []
    return [
        {**keys, "source": src, "tasks": len(rs), **{m: sum(r[m] for r in rs) / len(rs) for m in metrics}}
        for src, rs in by.items()
    ]


@dataclass
class GridResult:
    """rows: one per agent x N (checkpoint, agent, objectives, tasks, METRICS); records: one per rollout
    (``trajectory_record``); p_ans: one per scored memory (checkpoint, agent, objectives, task_id, turn, p_ans)."""

    rows: list[dict[str, Any]]
    records: list[dict[str, Any]]
    p_ans: list[dict[str, Any]]
    failures: list[dict[str, Any]] = field(default_factory=list)  # checkpoint, agent, objectives, VERDICTS counts
    # checkpoint, agent, objectives, source, tasks, em, f1 (and em_mem1, f1_mem1): only where tasks of more than one
    # data_source were scored together
    source_rows: list[dict[str, Any]] = field(default_factory=list)

    def only(self, checkpoints: Collection[str]) -> GridResult:
        """The same lists with only the entries of ``checkpoints`` (labels)."""
        return GridResult(*([x for x in getattr(self, f) if x["checkpoint"] in checkpoints] for f in GRID_FIELDS))


GRID_FIELDS = ("rows", "records", "p_ans", "failures", "source_rows")  # GridResult's lists, in its field order


def trajectory_record(traj: Trajectory, **keys: Any) -> dict[str, Any]:
    """One rollout as a JSON-able dict: ``keys`` (checkpoint, agent, objectives), the task, the outcome, TT/PT and
    every turn's memory, action and argument."""
    return {
        **keys,
        "task_id": traj.task.task_id,
        "data_source": traj.task.source,
        "question": traj.task.question,
        "gold": traj.task.gold,
        "gold_answers": [list(a) for a in traj.task.gold_answers],
        "answer": traj.answer,
        "em": traj.em,
        "f1": traj.f1,
        "reward": traj.reward,
        "finish": traj.finish,
        "error": traj.error,
        "format_fail": float(not traj.format_ok),
        "turns": len(traj.turns),
        "tt": traj.total_tokens,
        "pt": traj.peak_tokens,
        "trace": [
            {
                "turn": t.turn_id,
                "ok": t.parsed.ok,
                "memory": t.parsed.memory,
                "action": t.parsed.action,
                "argument": t.parsed.argument,
                "context_tokens": t.context_tokens,
                "generated_tokens": t.generated_tokens,
            }
            for t in traj.turns
        ],
    }


def memory_p_ans(
    policy: torch.nn.Module,
    builder: PromptBuilder,
    batch: RolloutBatch,
    *,
    pad_id: int,
    micro_batch_size: int = 8,
    bf16: bool = False,
) -> list[dict[str, Any]]:
    """P(ans | q, m) (Eq. 4) of every memory a well-formed turn wrote, scored by ``policy``.

    bf16: score under bf16 autocast, as training does with trainer.precision=bf16-mixed (several times faster on
    CPUs with AVX512-BF16). Only this forward is autocast: the vLLM engine runs in-process and must not be.

    -> [{"traj_id", "task_id", "turn", "p_ans"}], in rollout then turn order.
    """
    found = [(traj, s) for traj in batch.trajectories for s in traj.turns if s.parsed.ok and bool(s.parsed.memory)]
    items = [(traj.task.question, s.parsed.memory, traj.task.gold) for traj, s in found]
    device = next(policy.parameters()).device.type
    with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
        p = memory_answer_probabilities(policy, builder, items, pad_id=pad_id, micro_batch_size=micro_batch_size)
    return [
        {"traj_id": traj.traj_id, "task_id": traj.task.task_id, "turn": s.turn_id, "p_ans": float(v)}
        for (traj, s), v in zip(found, p.tolist())
    ]


def kl_to_reference(
    policy: torch.nn.Module,
    reference: torch.nn.Module,
    batch: RolloutBatch,
    *,
    pad_id: int,
    temperature: float,
    micro_batch_size: int = 8,
    bf16: bool = False,
) -> dict[str, float]:
    """KL(policy || reference) per sampled token of ``batch`` (rollouts ``policy`` sampled at ``temperature``): the
    means over every response token of Schulman's k1 (log-ratio; unbiased, can read below 0 on few tokens) and k3
    (never below 0) estimates, both models scoring the tokens at ``temperature`` (``mempo.losses.kl_penalty``).

    -> {"kl_k1", "kl_k3", "kl_tokens"}; NaN estimates for a batch without sampled tokens.
    """
    x = batch.to_tensors(pad_id)
    tokens = int(x.response_mask.sum())
    if tokens == 0:
        return {"kl_k1": float("nan"), "kl_k3": float("nan"), "kl_tokens": 0.0}
    device = next(policy.parameters()).device.type
    with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
        logp, ref_logp = (
            sequence_logprobs(
                model,
                x.input_ids,
                x.attention_mask,
                micro_batch_size=micro_batch_size,
                score_mask=x.response_mask,
                temperature=temperature,
            )
            for model in (policy, reference)
        )
    mask = x.response_mask
    return {
        "kl_k1": float(kl_penalty(logp, ref_logp, "k1")[mask].mean()),
        "kl_k3": float(kl_penalty(logp, ref_logp, "k3")[mask].mean()),
        "kl_tokens": float(tokens),
    }


def evaluate_grid(
    sampler: Sampler,
    env: Env,
    builder: PromptBuilder,
    tasks_by_n: Mapping[int, Sequence[Task]],
    agent: AgentConfig,
    sampling: SamplingConfig,
    evaluation: EvalConfig,
    *,
    checkpoint: str,
    reward_kind: str = "all_em",
    include_tags: bool = True,
    policy: torch.nn.Module | None = None,
    reference: torch.nn.Module | None = None,
    pad_id: int = 0,
    bf16: bool = False,
    chains: Mapping[str, SyntheticQuestion] | None = None,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> GridResult:
    """Every agent in ``evaluation.agents`` on every task set of ``tasks_by_n`` (one rollout each), with ``sampler``.

    ``policy`` (the sampler's weights as a HF model) scores each memory when ``evaluation.score_memories``; with
    ``reference`` (``evaluation.kl_reference`` loaded) each row also gets ``kl_to_reference`` of its rollouts.
    Rows carry 95% bootstrap intervals of EM and F1 over tasks (``em_lo``, ``em_hi``, ``f1_lo``, ``f1_hi``).
    ``chains`` (qid -> reasoning chain, synthetic data) adds a failure tally per row (``mempo.eval.failures``).
    ``on_row`` is called with each row as soon as it is complete (progress display).
    """
    out = GridResult([], [], [])
    for n, tasks in tasks_by_n.items():
        for context in evaluation.agents:
            keys = {"checkpoint": checkpoint, "agent": context, "objectives": n}
            slack = evaluation.turn_slack
            turns = agent.max_turns if slack is None else 2 * n + 1 + slack
            metrics, batch = evaluate_agent(
                sampler,
                env,
                tasks,
                builder,
                replace(agent, context=context, max_turns=turns),
                sampling=sampling,
                include_tags=include_tags,
                reward_kind=reward_kind,
                greedy=evaluation.greedy,
            )
            row = {**keys, "tasks": len(tasks), **{k.split("/", 1)[1]: v for k, v in metrics.items()}}
            records = [trajectory_record(t, **keys) for t in batch.trajectories]
            for m in ("em", "f1"):
                _, row[f"{m}_lo"], row[f"{m}_hi"] = bootstrap_ci([r[m] for r in records])
            metrics_of = ("em", "f1")
            if evaluation.mem1_scores:
                for r in records:
                    r["em_mem1"], r["f1_mem1"] = mem1_scores(r["answer"], r["gold_answers"])
                metrics_of += ("em_mem1", "f1_mem1")
                row.update({m: sum(r[m] for r in records) / max(len(records), 1) for m in metrics_of[2:]})
            out.rows.append(row)
            out.source_rows += source_rows(records, keys, metrics_of)
            if chains is not None:
                out.failures.append({**keys, **failure_tally(batch.trajectories, chains)})
            if reference is not None:
                if policy is None:
                    raise ValueError("evaluate_grid: a KL to the reference needs the checkpoint's policy")
                temperature = sampling.temperature
                row.update(kl_to_reference(policy, reference, batch, pad_id=pad_id, temperature=temperature, bf16=bf16))
            if policy is not None and evaluation.score_memories:
                scored = memory_p_ans(policy, builder, batch, pad_id=pad_id, bf16=bf16)
                by_turn = {(r["traj_id"], r["turn"]): r["p_ans"] for r in scored}
                for traj, rec in zip(batch.trajectories, records):
                    for step in rec["trace"]:
                        step["p_ans"] = by_turn.get((traj.traj_id, step["turn"]))
                out.p_ans.extend({**keys, **{k: r[k] for k in ("task_id", "turn", "p_ans")}} for r in scored)
            out.records.extend(records)
            if on_row is not None:
                on_row(row)
    return out
