"""How the agent loop ends a rollout on the edges of a generation: a stop string that ends inside the last sampled
token (the characters after it are clipped before parsing), the max_new_tokens guard (a turn cut by the length
limit is a format failure even when its text parses), and G rollouts of one task that really differ."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch
from scripted import CORPUS, TASK_B

from mempo.core.format import Tags, format_turn
from mempo.rollout.agent import AgentConfig, collect
from mempo.rollout.env import SearchEnv
from mempo.rollout.hf_sampler import HFSampler
from mempo.rollout.prompts import PromptBuilder
from mempo.rollout.retrievers import BM25Retriever
from mempo.rollout.sampler import Generation, SamplingConfig

SAMPLING = SamplingConfig(max_new_tokens=256)  # every turn's generation parameters (the scripted samplers ignore them)

ANSWER_TURN = format_turn("Q1: 1931.", "done", "answer", "1931")  # ends with "</answer>"


class FixedTokens:
    """Returns the same token ids, with a chosen finish reason, for every prompt."""

    def __init__(self, ids: list[int], finish_reason: str) -> None:
        self.ids, self.finish_reason = ids, finish_reason

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingConfig) -> list[list[Generation]]:
        gen = Generation(list(self.ids), [-1.0] * len(self.ids), "", finish_reason=self.finish_reason)
        return [[gen] for _ in prompts]


@pytest.fixture(scope="module")
def parts(smollm2_tokenizer):
    return PromptBuilder(smollm2_tokenizer, Tags()), SearchEnv(BM25Retriever(CORPUS), smollm2_tokenizer, topk=1)


def fused_stop_tokens(tokenizer) -> list[int]:
    """Token ids of ANSWER_TURN plus a suffix, cut at the first token whose text completes "</answer>", chosen so
    that this token also carries characters after the stop string (what an engine returns at a stop)."""
    for suffix in ("\n", "\n\n", ".", ">.", " x", "\n<"):
        ids = tokenizer(ANSWER_TURN + suffix, add_special_tokens=False)["input_ids"]
        k = next(k for k in range(1, len(ids) + 1) if "</answer>" in tokenizer.decode(ids[:k]))
        if not tokenizer.decode(ids[:k]).endswith("</answer>"):
            return ids[:k]
    pytest.fail("no suffix fuses with the stop string in this tokenizer")


def test_a_stop_string_inside_the_last_token_is_clipped_and_answers(parts):
    builder, env = parts
    ids = fused_stop_tokens(builder.tokenizer)
    batch = collect(FixedTokens(ids, "stop"), env, [TASK_B], 1, builder, AgentConfig(max_turns=2), sampling=SAMPLING)
    traj = batch.trajectories[0]
    assert traj.finish == "answer" and traj.answer == "1931" and traj.reward == 1.0
    assert traj.turns[0].response_ids == ids  # the sampled tokens stay exactly as sampled


def test_a_turn_cut_at_max_new_tokens_is_a_format_failure_even_if_it_parses(parts):
    builder, env = parts
    ids = builder.tokenizer(ANSWER_TURN, add_special_tokens=False)["input_ids"]
    agent, sampling = AgentConfig(max_turns=2), SamplingConfig(max_new_tokens=len(ids))
    batch = collect(FixedTokens(ids, "length"), env, [TASK_B], 1, builder, agent, sampling=sampling)
    traj = batch.trajectories[0]
    assert traj.finish == "format_error" and traj.answer is None and traj.reward == 0.0
    assert traj.error == (f"turn 1: no action closing tag within {len(ids)} new tokens (generation hit max_new_tokens)")
    assert not traj.turns[0].parsed.ok and len(traj.turns) == 1
    same = collect(FixedTokens(ids, "stop"), env, [TASK_B], 1, builder, agent, sampling=sampling).trajectories[0]
    assert same.finish == "answer"  # the same tokens ended by a stop string answer


def test_the_g_rollouts_of_one_task_differ(parts, tiny_policy):
    builder, env = parts
    policy, tokenizer = tiny_policy
    sampling = SamplingConfig(max_new_tokens=8, temperature=1.0, seed=3)
    batch = collect(
        HFSampler(policy, tokenizer), env, [TASK_B], 4, builder, AgentConfig(max_turns=1), sampling=sampling
    )
    firsts = [tuple(t.turns[0].response_ids) for t in batch.trajectories]
    assert len(set(firsts)) == 4
    assert len({tuple(t.turns[0].prompt_ids) for t in batch.trajectories}) == 1  # same prompt, different samples
    assert torch.tensor([t.group_id for t in batch.trajectories]).eq(0).all()
