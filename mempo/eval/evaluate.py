"""Agent evaluation: EM, F1, format failures, turns, TT and PT (docs/algorithm.md §2) over a fixed task set."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from mempo.core.tasks import Task
from mempo.rollout.agent import AgentConfig, Env, RolloutBatch, collect
from mempo.rollout.prompts import PromptBuilder
from mempo.rollout.sampler import Sampler, SamplingConfig


def summarize(batch: RolloutBatch, prefix: str = "val") -> dict[str, float]:
    """{prefix}/em, f1 (mean over tasks of the mean over objectives), format_fail, turns, tt, pt, reward."""
    trajs = batch.trajectories
    n = max(len(trajs), 1)
    return {
        f"{prefix}/em": sum(t.em for t in trajs) / n,
        f"{prefix}/f1": sum(t.f1 for t in trajs) / n,
        f"{prefix}/reward": sum(t.reward for t in trajs) / n,
        f"{prefix}/format_fail": sum(not t.format_ok for t in trajs) / n,
        f"{prefix}/turns": sum(len(t.turns) for t in trajs) / n,
        f"{prefix}/tt": sum(t.total_tokens for t in trajs) / n,
        f"{prefix}/pt": sum(t.peak_tokens for t in trajs) / n,
    }


def evaluate_agent(
    sampler: Sampler,
    env: Env,
    tasks: Sequence[Task],
    builder: PromptBuilder,
    agent: AgentConfig,
    *,
    sampling: SamplingConfig,
    include_tags: bool = True,
    reward_kind: str = "all_em",
    greedy: bool = True,
) -> tuple[dict[str, float], RolloutBatch]:
    """One rollout per task (greedy by default) -> (metrics, the rollouts)."""
    if greedy:
        sampling = replace(sampling, temperature=0.0, top_p=1.0)
    batch = collect(
        sampler, env, tasks, 1, builder, agent, sampling=sampling, include_tags=include_tags, reward_kind=reward_kind
    )
    return summarize(batch), batch
