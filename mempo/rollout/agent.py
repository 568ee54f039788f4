"""The agent loop: G rollouts per task, turn by turn, all live rollouts batched into one generate call per turn.

Each model turn becomes one training sample (its prompt + its generated tokens, exactly as sampled). A malformed
turn ends its rollout as a format failure (docs/algorithm.md §1); it is kept as a sample so the update can push
it down.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import torch

from mempo.core.format import ParsedTurn, Tags, parse_turn
from mempo.core.padding import place, right_pad
from mempo.core.tasks import Task
from mempo.rollout.masks import decode_with_offsets, mem_token_mask
from mempo.rollout.prompts import PromptBuilder, TurnContext
from mempo.rollout.rewards import objective_scores, trajectory_reward
from mempo.rollout.sampler import Generation, Sampler, SamplingConfig


class Env(Protocol):
    def search(self, queries: Sequence[str]) -> list[str]:
        """Queries -> tool results, each wrapped in <information>."""
        ...


CONTEXT_MODES = ("memory", "full_history")


@dataclass(frozen=True)
class AgentConfig:
    """Config group ``agent`` (keys repeat these names).

    context: memory (MemPO: the context resets each turn) | full_history (ReAct-style baseline).
    max_turns: turns before a rollout ends unanswered (the paper trains with 16).
    keep_previous_turn: a memory prompt also keeps the previous turn's <think>/<search> text.
    max_context_tokens: a prompt that leaves no room for max_new_tokens below this ends the rollout (format
    failure: runaway context).
    """

    context: str = "memory"
    max_turns: int = 16
    keep_previous_turn: bool = False
    max_context_tokens: int = 3072

    def __post_init__(self) -> None:
        if self.context not in CONTEXT_MODES:
            raise ValueError(f"agent.context must be 'memory' or 'full_history', got {self.context!r}")
        if self.max_turns < 1:
            raise ValueError(f"agent.max_turns must be >= 1, got {self.max_turns}")
        if self.max_context_tokens < 1:
            raise ValueError(f"agent.max_context_tokens must be >= 1, got {self.max_context_tokens}")


@dataclass
class TurnSample:
    """One turn of one rollout. response_ids / sampler_logp / mem_mask: [L] aligned."""

    traj_id: int
    group_id: int
    turn_id: int  # 1-based
    prompt_ids: list[int]
    response_ids: list[int]
    sampler_logp: list[float]
    mem_mask: list[bool]
    text: str
    parsed: ParsedTurn

    @property
    def context_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def generated_tokens(self) -> int:
        return len(self.response_ids)


@dataclass
class Trajectory:
    traj_id: int
    group_id: int
    task: Task
    turns: list[TurnSample] = field(default_factory=list)
    answer: str | None = None
    finish: str = "running"  # answer | max_turns | format_error | context_overflow
    error: str | None = None
    reward: float = 0.0
    scores: list[tuple[float, float]] = field(default_factory=list)  # (EM, F1) per objective

    @property
    def format_ok(self) -> bool:
        return self.finish in ("answer", "max_turns")

    @property
    def em(self) -> float:
        """Exact match, the mean over the task's objectives (0 before scoring)."""
        return sum(e for e, _ in self.scores) / max(len(self.scores), 1)

    @property
    def f1(self) -> float:
        """Token F1, the mean over the task's objectives (0 before scoring)."""
        return sum(f for _, f in self.scores) / max(len(self.scores), 1)

    @property
    def memories(self) -> list[str]:
        return [t.parsed.memory for t in self.turns if t.parsed.memory]

    @property
    def total_tokens(self) -> int:
        """TT: every prompt plus every generation over the task."""
        return sum(t.context_tokens + t.generated_tokens for t in self.turns)

    @property
    def peak_tokens(self) -> int:
        """PT: the largest single turn (its context plus its generation)."""
        return max((t.context_tokens + t.generated_tokens for t in self.turns), default=0)


@dataclass
class RolloutBatch:
    trajectories: list[Trajectory]

    @property
    def samples(self) -> list[TurnSample]:
        return [s for t in self.trajectories for s in t.turns]

    def to_tensors(self, pad_id: int) -> TurnBatch:
        """The right-padded training tensors of all turn samples."""
        samples = self.samples
        ids, attention = right_pad([s.prompt_ids + s.response_ids for s in samples], pad_id)
        starts, t_len = [len(s.prompt_ids) for s in samples], ids.shape[1]
        return TurnBatch(
            input_ids=ids,
            attention_mask=attention,
            response_mask=place([[True] * len(s.response_ids) for s in samples], starts, t_len, dtype=torch.bool),
            mem_mask=place([s.mem_mask for s in samples], starts, t_len, dtype=torch.bool),
            sampler_logp=place([s.sampler_logp for s in samples], starts, t_len, dtype=torch.float32),
            traj_ids=torch.tensor([s.traj_id for s in samples], dtype=torch.long),
            group_ids=torch.tensor([s.group_id for s in samples], dtype=torch.long),
            turn_ids=torch.tensor([s.turn_id for s in samples], dtype=torch.long),
            rewards=torch.tensor([t.reward for t in self.trajectories], dtype=torch.float32),
            traj_group_ids=torch.tensor([t.group_id for t in self.trajectories], dtype=torch.long),
        )


@dataclass(frozen=True)
class TurnBatch:
    """A batch of turn samples as training tensors (``RolloutBatch.to_tensors``); N samples, R trajectories.

    input_ids, attention_mask: [N, T] each sample's prompt then its sampled tokens, right-padded.
    response_mask: [N, T] the sampled tokens (they get gradient); mem_mask: [N, T] those inside <mem>...</mem>.
    sampler_logp: [N, T] the engine's log-prob of each sampled token, at that token's position.
    traj_ids, group_ids, turn_ids: [N]; rewards, traj_group_ids: [R] (R^T and the task of each trajectory).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    mem_mask: torch.Tensor
    sampler_logp: torch.Tensor
    traj_ids: torch.Tensor
    group_ids: torch.Tensor
    turn_ids: torch.Tensor
    rewards: torch.Tensor
    traj_group_ids: torch.Tensor


def _clip_to_stop(text: str, stops: Sequence[str], last_token_start: int) -> str:
    """A stop string can end inside the last sampled token (e.g. "</answer>\\n"); the characters after it that the
    same token carried are a tokenization artifact, not model output, so they are cut before parsing."""
    for stop in stops:
        end = text.find(stop)
        if end >= 0 and end + len(stop) > last_token_start:
            return text[: end + len(stop)]
    return text


def make_turn_sample(
    traj_id: int,
    group_id: int,
    turn_id: int,
    prompt_ids: Sequence[int],
    gen: Generation,
    tokenizer: Any,
    tags: Tags,
    include_tags: bool = True,
) -> TurnSample:
    """Decode, parse and mask one generated turn. The text parsed and the token offsets come from one decode, so
    the memory mask always agrees with the parsed memory span."""
    text, offsets = decode_with_offsets(gen.token_ids, tokenizer)
    last_start = offsets[-1][0] if offsets else 0
    parsed = parse_turn(_clip_to_stop(text, tags.stop_strings(), last_start), tags)
    if parsed.ok and gen.finish_reason == "length":  # a stop string ends every well-formed turn; a guard only
        parsed = replace(parsed, ok=False, error="generation hit max_new_tokens")
    mask = mem_token_mask(offsets, parsed, include_tags=include_tags)
    return TurnSample(
        traj_id=traj_id,
        group_id=group_id,
        turn_id=turn_id,
        prompt_ids=list(prompt_ids),
        response_ids=list(gen.token_ids),
        sampler_logp=list(gen.logprobs),
        mem_mask=[bool(x) for x in mask.tolist()],
        text=text,
        parsed=parsed,
    )


def next_context(ctx: TurnContext, turn_text: str, parsed: ParsedTurn, information: str) -> TurnContext:
    """The context of the next turn after a search turn (both context modes keep what they need)."""
    return TurnContext(
        question=ctx.question,
        memory=parsed.memory,
        information=information,
        previous_turn=turn_text,
        history=ctx.history + ((turn_text, information),),
    )


def collect(
    sampler: Sampler,
    env: Env,
    tasks: Sequence[Task],
    group_size: int,
    builder: PromptBuilder,
    config: AgentConfig,
    *,
    sampling: SamplingConfig,
    include_tags: bool = True,
    reward_kind: str = "all_em",
) -> RolloutBatch:
    """Run ``group_size`` rollouts of every task to the end; return trajectories with rewards set.

    ``sampling``: each turn's generation parameters (its ``stop`` is replaced by the turn format's closing tags);
    ``include_tags``: the memory mask covers the <mem> tags themselves (``MemoryConfig.include_tags``).

    Trajectory i belongs to group (task) i // group_size. One ``sampler.generate`` call per turn carries every
    live rollout; one ``env.search`` call per turn carries every search.
    """
    trajs = [Trajectory(i, i // group_size, tasks[i // group_size]) for i in range(len(tasks) * group_size)]
    ctxs = [TurnContext(question=t.task.question) for t in trajs]
    stops = builder.tags.stop_strings()
    sampling = replace(sampling, n=1, stop=stops)
    # A sampler over a sharded policy (HFSampler under FSDP2) has ``any_rank``: every rank keeps turning, with no
    # prompts of its own if need be, until no rank has a live rollout (each generate is a collective there).
    keep_turning = getattr(sampler, "any_rank", lambda live: live)
    for turn in range(1, config.max_turns + 1):
        live = [t for t in trajs if t.finish == "running"]
        prompts: dict[int, list[int]] = {}
        for t in live:
            ids = builder.prompt(ctxs[t.traj_id], config.context, keep_previous_turn=config.keep_previous_turn)
            if len(ids) + sampling.max_new_tokens > config.max_context_tokens:
                t.finish, t.error = "context_overflow", f"turn {turn}: prompt of {len(ids)} tokens leaves no room"
                continue
            prompts[t.traj_id] = ids
        if not keep_turning(bool(prompts)):
            break
        # A distinct seed per turn; the sampler derives a distinct one per prompt from it.
        turn_sampling = sampling if sampling.seed is None else replace(sampling, seed=sampling.seed + 7919 * turn)
        generations = sampler.generate(list(prompts.values()), turn_sampling)
        searches: list[tuple[Trajectory, str, str]] = []
        for (traj_id, prompt_ids), gens in zip(prompts.items(), generations):
            t, gen = trajs[traj_id], gens[0]
            sample = make_turn_sample(
                traj_id, t.group_id, turn, prompt_ids, gen, builder.tokenizer, builder.tags, include_tags
            )
            t.turns.append(sample)
            parsed, text = sample.parsed, sample.text
            if not parsed.ok:
                reason = parsed.error or "malformed turn"
                if gen.finish_reason == "length":
                    reason = f"no action closing tag within {sampling.max_new_tokens} new tokens ({reason})"
                t.finish, t.error = "format_error", f"turn {turn}: {reason}"
            elif parsed.action == "answer":
                t.finish, t.answer = "answer", parsed.argument
            else:
                searches.append((t, text, parsed.argument or ""))
        if searches:
            infos = env.search([q for _, _, q in searches])
            for (t, text, _), info in zip(searches, infos):
                ctxs[t.traj_id] = next_context(ctxs[t.traj_id], text, t.turns[-1].parsed, info)
    for t in trajs:
        if t.finish == "running":
            t.finish = "max_turns"
        t.scores = objective_scores(t.answer, t.task.gold_answers)
        t.reward = trajectory_reward(t.answer, t.task.gold_answers, format_ok=t.format_ok, kind=reward_kind)
    return RolloutBatch(trajs)


def rollout_metrics(batch: RolloutBatch) -> dict[str, float]:
    """rollout/* metrics of a batch. ``rollout/zero_adv_groups``: the fraction of groups (tasks) whose rollouts all
    got the same reward, so their trajectory advantage is 0 for every token: the first thing to look at when
    learning stalls (all 0: the task is too hard for the policy; all 1: too easy)."""
    trajs = batch.trajectories
    n = max(len(trajs), 1)
    samples = batch.samples
    group_rewards: dict[int, set[float]] = {}
    for t in trajs:
        group_rewards.setdefault(t.group_id, set()).add(t.reward)
    return {
        "rollout/zero_adv_groups": sum(len(r) == 1 for r in group_rewards.values()) / max(len(group_rewards), 1),
        "rollout/reward_mean": sum(t.reward for t in trajs) / n,
        "rollout/format_ok": sum(t.format_ok for t in trajs) / n,
        "rollout/answered": sum(t.finish == "answer" for t in trajs) / n,
        "rollout/turns_mean": sum(len(t.turns) for t in trajs) / n,
        "rollout/em_mean": sum(t.em for t in trajs) / n,
        "rollout/f1_mean": sum(t.f1 for t in trajs) / n,
        "rollout/tt_mean": sum(t.total_tokens for t in trajs) / n,
        "rollout/pt_mean": sum(t.peak_tokens for t in trajs) / n,
        "memory/tokens_mean": sum(sum(s.mem_mask) for s in samples) / max(len(samples), 1),
    }
