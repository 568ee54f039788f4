"""Real batches of turn samples for module-level tests, without a model writing the turns.

The synthetic oracle's well-formed turns are replayed through the same prompt builder, environment and per-turn
processing (``make_turn_sample``, ``next_context``) as the agent loop, so masks, memories and prompts are the real
ones; rewards and turn counts are chosen by the test.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mempo.data.oracle import oracle_dataset
from mempo.rollout.agent import RolloutBatch, Trajectory, make_turn_sample, next_context
from mempo.rollout.prompts import TurnContext
from mempo.rollout.sampler import Generation
from mempo.stages.builders import build_builder, build_env, build_tags, synthetic_world


def replay_batch(
    tokenizer: Any, cfg: Any, trajectories: Sequence[tuple[int, float, int | None]], *, objectives: int = 2
) -> RolloutBatch:
    """trajectories: (task index, reward, turns kept or None for all) per rollout, in order; the rollout's group is
    its task index (several rollouts of one task share a group). Sampler log-probs are 0."""
    tags = build_tags(cfg)
    builder = build_builder(cfg, tokenizer)
    env = build_env(cfg, tokenizer)
    n_tasks = max(t for t, _, _ in trajectories) + 1
    data = oracle_dataset(synthetic_world(cfg), "train", objectives, num_tasks=n_tasks, seed=0, tags=tags)
    trajs = []
    for traj_id, (task_i, reward, keep) in enumerate(trajectories):
        task, turns = data[task_i]
        traj = Trajectory(traj_id, task_i, task, reward=reward, finish="answer")
        ctx = TurnContext(question=task.question)
        for turn_id, text in enumerate(turns[:keep], start=1):
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            gen = Generation(token_ids=ids, logprobs=[0.0] * len(ids), text=text)
            sample = make_turn_sample(traj_id, task_i, turn_id, builder.prompt(ctx, "memory"), gen, tokenizer, tags)
            traj.turns.append(sample)
            if sample.parsed.action == "search":
                ctx = next_context(ctx, sample.text, sample.parsed, env.search([sample.parsed.argument])[0])
        trajs.append(traj)
    return RolloutBatch(trajs)


def oracle_batch(module: Any, cfg: Any, rewards: Sequence[float]) -> RolloutBatch:
    """Rollouts of one task whose turns are the oracle's, one per reward."""
    return replay_batch(module.tokenizer, cfg, [(0, r, None) for r in rewards])
