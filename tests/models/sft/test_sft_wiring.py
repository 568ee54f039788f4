"""The supervised warm start against the agent loop and a hand-computed loss, and smoke runs of the ``sft`` and
``demo`` stages through ``+debug=default`` (which keeps the experiment's stage).

The agent loop runs with ``ScriptedSampler`` writing the oracle's turns (tests/support/scripted.py): SFT replays a
teacher's turns, so the loop must see exactly those turns for the prompts to be comparable.
"""

from __future__ import annotations

import json

import pytest
import torch
from scripted import CORPUS, TASK, TASK_B, ScriptedSampler, oracle_script
from torch.testing import assert_close

from mempo.core.format import Tags
from mempo.lm.loading import load_policy
from mempo.models.sft import SFTModule, build_sft_examples, collate_sft, pack_turns, sft_dataloader
from mempo.rollout.agent import AgentConfig, collect
from mempo.rollout.env import SearchEnv
from mempo.rollout.prompts import PromptBuilder
from mempo.rollout.retrievers import BM25Retriever
from mempo.rollout.sampler import SamplingConfig
from mempo.stages import run_stage


@pytest.fixture(scope="module")
def tiny(tiny_path):
    return load_policy(tiny_path)


def loop_and_replay(tokenizer, context: str):
    builder = PromptBuilder(tokenizer, Tags())
    env = SearchEnv(BM25Retriever(CORPUS), tokenizer, topk=1, max_passage_tokens=32)
    sampler = ScriptedSampler(tokenizer, oracle_script)
    batch = collect(
        sampler, env, [TASK, TASK_B], 1, builder, AgentConfig(context), sampling=SamplingConfig(max_new_tokens=256)
    )
    assert [t.finish for t in batch.trajectories] == ["answer", "answer"]
    teacher = [(t.task, [s.text for s in t.turns]) for t in batch.trajectories]
    examples = build_sft_examples(teacher, builder, env, context=context)
    return batch, examples


@pytest.mark.parametrize("context", ["memory", "full_history"])
def test_replayed_prompts_equal_the_agent_loops_token_for_token(tiny, context):
    batch, examples = loop_and_replay(tiny[1], context)
    loop = sorted((tuple(s.prompt_ids), tuple(s.response_ids)) for s in batch.samples)
    replay = sorted((tuple(e.prompt_ids), tuple(e.target_ids)) for e in examples)
    assert len(loop) == 5  # 3 turns of TASK, 2 of TASK_B
    assert replay == loop


def test_target_mask_holds_only_the_teachers_turn_tokens(tiny):
    tokenizer = tiny[1]
    _, examples = loop_and_replay(tokenizer, "memory")
    batch = collate_sft(examples, tokenizer.pad_token_id)
    for i, e in enumerate(examples):
        p, n = len(e.prompt_ids), len(e.target_ids)
        target = batch["target_mask"][i]
        assert target.sum() == n and target[p : p + n].all()  # exactly the turn's tokens: no prompt, no padding
        assert batch["input_ids"][i, target].tolist() == e.target_ids
    # Tool output is in the prompts of later turns and never a target.
    later = [e for e in examples if "<information>" in tokenizer.decode(e.prompt_ids)]
    assert later and not any("<information>" in tokenizer.decode(e.target_ids) for e in examples)


def test_sft_loss_is_the_token_mean_nll_of_the_targets(tiny):
    policy, tokenizer = tiny
    _, examples = loop_and_replay(tokenizer, "memory")
    batch = collate_sft(examples, tokenizer.pad_token_id)
    loss = SFTModule(policy).training_step(batch, 0)
    nll, count = 0.0, 0
    with torch.no_grad():
        for e in examples:  # one unpadded forward per example, full log-softmax
            ids = torch.tensor([e.prompt_ids + e.target_ids])
            logp = policy(input_ids=ids).logits[0].float().log_softmax(-1)  # [P + L, V]
            p = len(e.prompt_ids)
            nll -= float(logp[p - 1 : -1].gather(-1, ids[0, p:, None]).sum())
            count += len(e.target_ids)
    assert_close(loss.detach(), torch.tensor(nll / count))


def per_turn_nll(policy, examples) -> tuple[float, int]:
    """Summed NLL of the teacher tokens, one unpadded forward per turn, and their count."""
    nll, count = 0.0, 0
    with torch.no_grad():
        for e in examples:
            ids = torch.tensor([e.prompt_ids + e.target_ids])
            logp = policy(input_ids=ids).logits[0].float().log_softmax(-1)  # [P + L, V]
            p = len(e.prompt_ids)
            nll -= float(logp[p - 1 : -1].gather(-1, ids[0, p:, None]).sum())
            count += len(e.target_ids)
    return nll, count


def test_full_history_turns_pack_into_one_row_per_trajectory(tiny):
    tokenizer = tiny[1]
    _, examples = loop_and_replay(tokenizer, "full_history")
    rows = pack_turns(examples)
    assert [r.turns for r in rows] == [3, 2]  # TASK's 3 turns, TASK_B's 2: every prompt extends the last row
    for row, traj in zip(rows, (0, 1)):
        turns = [e for e in examples if e.trajectory == traj]
        last = turns[-1]
        assert row.input_ids == last.prompt_ids + last.target_ids  # the row is the last turn's own row
        targets = [i for i, t in zip(row.input_ids, row.target_mask) if t]
        assert targets == [t for e in turns for t in e.target_ids]  # every teacher turn, in order, nothing else
        for e in turns:  # each turn's target sits right after its own prompt
            p = len(e.prompt_ids)
            assert row.input_ids[:p] == e.prompt_ids and row.target_mask[p : p + len(e.target_ids)] == [True] * len(
                e.target_ids
            )
    # Memory prompts are rewritten every turn: nothing merges.
    _, mem = loop_and_replay(tokenizer, "memory")
    assert [r.turns for r in pack_turns(mem)] == [1] * len(mem)


def test_packed_loss_equals_the_per_turn_loss(tiny):
    """Packing changes what is computed once, not the loss: the token-mean NLL of the packed rows equals the one
    from a separate forward per turn."""
    policy, tokenizer = tiny
    _, examples = loop_and_replay(tokenizer, "full_history")
    rows = pack_turns(examples)
    assert len(rows) < len(examples)
    loss = SFTModule(policy).training_step(collate_sft(rows, tokenizer.pad_token_id), 0)
    nll, count = per_turn_nll(policy, examples)
    assert_close(loss.detach(), torch.tensor(nll / count))


def test_batches_count_teacher_turns():
    from mempo.models.sft import SFTSequence

    rows = [SFTSequence([1] * (i + 2), [False, True] + [True] * i, turns=t) for i, t in enumerate([1, 3, 1, 4, 2, 1])]
    loader = sft_dataloader(rows, batch_size=4, pad_id=0, seed=0)
    sizes = sorted(sum(rows[i].turns for i in b) for b in loader.batch_sampler)
    assert sum(sizes) == 12 and all(s >= 4 for s in sizes[1:])  # all rows once; only the last batch may be short
    one_turn = [SFTSequence([1, 2], [False, True]) for _ in range(10)]
    assert sorted(len(b) for b in sft_dataloader(one_turn, batch_size=4, pad_id=0).batch_sampler) == [2, 4, 4]


@pytest.mark.parametrize("exp", ["sft", "demo"])
def test_debug_smoke_run_of_the_stage(make_cfg, tmp_path, exp, capsys):
    """The demo's second run reuses its warm start and RL policy, says so, and prints the same table. Regression:
    it trained RL again over the first run's checkpoint and policy without a word; with the training
    stages' folder check it would have been refused."""
    summary = run_stage(make_cfg(f"+exp={exp}", "+debug=default", f"run_dir={tmp_path}"))
    assert summary["stage"] == exp
    if exp == "sft":
        assert summary["steps"] == 2 and summary["final_loss"] > 0
        assert (tmp_path / "hf" / "config.json").is_file()
    else:
        assert summary["sft"]["steps"] == 2 and summary["rl"]["steps"] == 2
        assert [(r["checkpoint"], r["objectives"]) for r in summary["eval"]] == [("warm_start", 1), ("warm_start", 2),
                                                                                 ("rl", 1), ("rl", 2)]  # fmt: skip
        table = (tmp_path / "summary.md").read_text()
        assert "rl - warm_start" in table and "[95% CI]" in table
        assert json.loads((tmp_path / "summary.json").read_text())["stage"] == "demo"
        assert (tmp_path / "rl" / "hf" / "config.json").is_file() and (tmp_path / "summary.md").is_file()
        assert summary["status"] == {"sft": "trained", "rl": "trained", "eval": "trained"}
        policy = (tmp_path / "rl" / "hf" / "model.safetensors").stat().st_mtime_ns
        capsys.readouterr()
        again = run_stage(make_cfg(f"+exp={exp}", "+debug=default", f"run_dir={tmp_path}"))
        said = capsys.readouterr().out
        assert again["status"] == {"sft": "reused", "rl": "reused", "eval": "trained"}
        assert f"1/3 sft: reusing {tmp_path / 'sft'}" in said and f"2/3 rl: reusing {tmp_path / 'rl'}" in said
        assert "replacing the earlier evaluation" in said and "differs" not in said
        assert (tmp_path / "rl" / "hf" / "model.safetensors").stat().st_mtime_ns == policy
        assert again["eval"] == summary["eval"] and (tmp_path / "summary.md").read_text() == table
        assert table.splitlines()[0] in said  # the same table on the console
