"""The agent loop: context reset vs full history, batching, exact token ids, masks, format failures, token counts.

Loop-logic tests drive the loop with ``ScriptedSampler`` (tests/support/scripted.py says why); the real SmolLM2 through
vLLM runs the same loop in the slow test at the bottom.
"""

from __future__ import annotations

import math

import pytest
import torch
from scripted import CORPUS, TASK, TASK_B, ScriptedSampler, oracle_script

from mempo.core.format import Tags, format_turn
from mempo.rollout.agent import AgentConfig, collect, rollout_metrics
from mempo.rollout.env import SearchEnv
from mempo.rollout.prompts import PromptBuilder
from mempo.rollout.retrievers import BM25Retriever, Passage
from mempo.rollout.sampler import SamplingConfig

SAMPLING = SamplingConfig(max_new_tokens=256)  # every turn's generation parameters (the scripted samplers ignore them)


@pytest.fixture(scope="module")
def env(smollm2_tokenizer) -> SearchEnv:
    return SearchEnv(BM25Retriever(CORPUS), smollm2_tokenizer, topk=1, max_passage_tokens=32)


@pytest.fixture(scope="module")
def builder(smollm2_tokenizer) -> PromptBuilder:
    return PromptBuilder(smollm2_tokenizer, Tags())


def run(builder, env, script, tasks=(TASK,), group_size=2, **agent_kwargs):
    sampler = ScriptedSampler(builder.tokenizer, script)
    batch = collect(sampler, env, list(tasks), group_size, builder, AgentConfig(**agent_kwargs), sampling=SAMPLING)
    return batch, sampler


def test_memory_context_resets_each_turn(builder, env):
    batch, sampler = run(builder, env, oracle_script, group_size=1)
    traj = batch.trajectories[0]
    assert traj.finish == "answer" and traj.reward == 1.0 and len(traj.turns) == 3
    third = builder.tokenizer.decode(traj.turns[2].prompt_ids)
    assert "Q1: Brask Holdings. Q2: need Ometh Works." in third  # the last memory
    assert "Ometh Works is based in Raitukrum" in third  # the last tool result
    assert "Q1: need Velorin Oskatu." not in third  # an older memory is gone
    assert "works for Brask Holdings" not in third  # an older tool result is gone
    assert "search Q1" not in third  # the previous turns' think/search text is not kept by default


def test_keep_previous_turn_keeps_only_the_last_turn(builder, env):
    batch, _ = run(builder, env, oracle_script, group_size=1, keep_previous_turn=True)
    third = builder.tokenizer.decode(batch.trajectories[0].turns[2].prompt_ids)
    assert "next Q2" in third and "search Q1" not in third


def test_full_history_appends_every_turn(builder, env):
    batch, _ = run(builder, env, oracle_script, group_size=1, context="full_history")
    traj = batch.trajectories[0]
    third = builder.tokenizer.decode(traj.turns[2].prompt_ids)
    for text in ("Q1: need Velorin Oskatu.", "works for Brask Holdings", "Ometh Works is based", "next Q2"):
        assert text in third
    # Full history grows the context: the memory agent's last prompt is shorter on the same trajectory.
    mem_batch, _ = run(builder, env, oracle_script, group_size=1)
    assert traj.turns[2].context_tokens > mem_batch.trajectories[0].turns[2].context_tokens


def test_one_generate_call_per_turn_over_all_live_rollouts(builder, env):
    batch, sampler = run(builder, env, oracle_script, tasks=(TASK, TASK_B), group_size=3)
    # Turn 1: 2 tasks x 3 rollouts; TASK_B's rollouts answer at turn 2, TASK's at turn 3.
    assert sampler.calls == [6, 6, 3]
    assert [t.group_id for t in batch.trajectories] == [0, 0, 0, 1, 1, 1]
    assert all(t.reward == 1.0 for t in batch.trajectories)


def test_samples_carry_exact_ids_logprobs_masks_and_counts(builder, env):
    batch, _ = run(builder, env, oracle_script, group_size=2)
    tok = builder.tokenizer
    for traj in batch.trajectories:
        assert traj.total_tokens == sum(s.context_tokens + s.generated_tokens for s in traj.turns)
        assert traj.peak_tokens == max(s.context_tokens + s.generated_tokens for s in traj.turns)
        for s in traj.turns:
            assert s.traj_id == traj.traj_id and s.group_id == traj.group_id
            assert len(s.response_ids) == len(s.sampler_logp) == len(s.mem_mask)
            assert s.sampler_logp == [-0.5] * len(s.response_ids)
            masked = tok.decode([i for i, m in zip(s.response_ids, s.mem_mask) if m])
            assert masked.strip().startswith("<mem>") and masked.strip().endswith("</mem>")
            assert s.parsed.memory in masked
            assert "<think>" not in masked
    x = batch.to_tensors(tok.pad_token_id)
    n = len(batch.samples)
    assert x.input_ids.shape == x.response_mask.shape == x.mem_mask.shape == x.sampler_logp.shape
    assert x.input_ids.shape[0] == n and x.traj_ids.shape == (n,) and x.rewards.shape == (2,)
    for i, s in enumerate(batch.samples):
        p, r = len(s.prompt_ids), len(s.response_ids)
        assert x.input_ids[i, p : p + r].tolist() == s.response_ids
        assert x.response_mask[i].sum() == r and bool(x.response_mask[i, p]) and not x.response_mask[i, p - 1]
        assert not (x.mem_mask[i] & ~x.response_mask[i]).any()
    assert x.turn_ids.tolist() == [1, 2, 3, 1, 2, 3]


def test_a_malformed_turn_ends_only_its_rollout(builder, env):
    def script(text: str) -> str:
        if "Rollout" in text:  # never: rollouts see the same prompt; use call order instead
            return ""
        return oracle_script(text)

    calls = {"n": 0}

    def flaky(text: str) -> str:
        calls["n"] += 1
        if calls["n"] == 2:  # the second rollout's first turn
            return "<mem>x</mem><think>y</think><search>q</search><search>again</search>"
        return oracle_script(text)

    batch, _ = run(builder, env, flaky, group_size=2)
    good, bad = batch.trajectories
    assert good.finish == "answer" and good.reward == 1.0
    assert bad.finish == "format_error" and bad.reward == 0.0 and len(bad.turns) == 1
    assert bad.error.startswith("turn 1:") and "duplicated" in bad.error
    assert not bad.turns[0].parsed.ok  # kept as a sample: the update pushes it down
    assert rollout_metrics(batch)["rollout/format_ok"] == 0.5


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("no tags at all", "no tags"),
        ("<mem>a</mem><think>b</think><answer>x</answer> trailing", "after the action"),
        ("<MEM>a</MEM><think>b</think><answer>x</answer>", "MEM"),
        ("<mem>a<mem>b</mem></mem><think>c</think><answer>x</answer>", "mem"),
        ("<mem>a</mem><think>b</think><answer>x", "answer"),
    ],
)
def test_bad_model_output_is_a_format_failure_not_an_exception(builder, env, text, fragment):
    batch, _ = run(builder, env, lambda _: text, group_size=1)
    traj = batch.trajectories[0]
    assert traj.finish == "format_error" and traj.reward == 0.0
    assert fragment in traj.error


def test_max_turns_and_context_overflow(builder, env):
    looping = lambda _: format_turn("still looking", "again", "search", "Velorin Oskatu")  # noqa: E731
    batch, sampler = run(builder, env, looping, group_size=1, max_turns=3)
    assert batch.trajectories[0].finish == "max_turns" and len(sampler.calls) == 3
    assert batch.trajectories[0].format_ok and batch.trajectories[0].reward == 0.0
    batch, sampler = run(builder, env, looping, group_size=1, max_context_tokens=100)
    assert batch.trajectories[0].finish == "context_overflow" and sampler.calls == []


def test_a_retriever_that_finds_nothing_is_answered_not_raised(builder, smollm2_tokenizer):
    env = SearchEnv(BM25Retriever(CORPUS), smollm2_tokenizer, topk=1)
    script = lambda t: (  # noqa: E731
        format_turn("need it", "search", "search", "zzzz qqqq")
        if "No results" not in t
        else format_turn("nothing", "give up", "answer", "unknown")
    )
    batch, sampler = run(builder, env, script, group_size=1)
    assert "No results found." in sampler.prompts[1]
    assert batch.trajectories[0].finish == "answer" and batch.trajectories[0].reward == 0.0


@pytest.mark.slow
def test_real_smollm2_through_vllm_on_the_synthetic_world(smollm2_path):
    """The agent loop end to end: 2 tasks x G=4 of the real SmolLM2 through VLLMSampler on the synthetic
    world; every sample passes shape, id and mask checks."""
    from mempo.data.compose import compose_tasks
    from mempo.data.synthetic import SyntheticWorld
    from mempo.lm.loading import load_tokenizer
    from mempo.rollout.vllm_sampler import VLLMSampler

    world = SyntheticWorld.generate(0)
    tasks = compose_tasks([q.question for q in world.questions("val", seed=0)], 2, num_tasks=2, seed=0)
    tok = load_tokenizer(smollm2_path)
    env = SearchEnv(BM25Retriever([Passage(p["id"], p["contents"]) for p in world.passages()]), tok, topk=2)
    builder = PromptBuilder(tok, Tags())
    sampler = VLLMSampler(smollm2_path, dtype="float32", kv_cache_space_gb=1, max_model_len=4096)
    try:
        sampling = SamplingConfig(max_new_tokens=64, temperature=1.0, seed=0)
        batch = collect(sampler, env, tasks, 4, builder, AgentConfig(max_turns=3), sampling=sampling)
    finally:
        sampler.shutdown()
    assert len(batch.trajectories) == 8 and [t.group_id for t in batch.trajectories] == [0] * 4 + [1] * 4
    assert {t.finish for t in batch.trajectories} <= {"answer", "max_turns", "format_error", "context_overflow"}
    for traj in batch.trajectories:
        assert 1 <= len(traj.turns) <= 3
        for k, s in enumerate(traj.turns, start=1):
            assert s.turn_id == k and s.traj_id == traj.traj_id and s.group_id == traj.group_id
            assert 0 < len(s.response_ids) <= 64
            assert len(s.sampler_logp) == len(s.response_ids) == len(s.mem_mask)
            assert all(math.isfinite(v) and v <= 0 for v in s.sampler_logp)
            assert tok.decode(s.response_ids, skip_special_tokens=True) == s.text  # ids exactly as sampled
            if any(s.mem_mask):
                assert s.parsed.mem_span is not None
            assert traj.task.objectives[0].question in tok.decode(s.prompt_ids)
    x = batch.to_tensors(tok.pad_token_id)
    assert x.response_mask.sum() == sum(len(s.response_ids) for s in batch.samples)
    assert torch.isfinite(x.sampler_logp).all()
