"""KL of a checkpoint to a reference (``eval.kl_reference``) on the tokens of its rollouts, against a hand computation.

The turns are scripted (``ScriptedSampler``): what is under test is the estimate over a batch's sampled tokens, which
is defined for any tokens. The expected values come from one plain HF forward per turn sample, log softmax of the
logits over the temperature, and the k1 / k3 formulas written out here.
"""

from __future__ import annotations

import copy
import csv
import math

import pytest
import torch
from scripted import CORPUS, TASK, TASK_B, ScriptedSampler
from torch.testing import assert_close

from mempo.core.format import Tags
from mempo.eval.compare import EvalConfig, evaluate_grid, kl_to_reference
from mempo.eval.evaluate import evaluate_agent
from mempo.eval.report import write_report
from mempo.rollout.agent import AgentConfig, RolloutBatch
from mempo.rollout.env import SearchEnv
from mempo.rollout.prompts import PromptBuilder
from mempo.rollout.retrievers import BM25Retriever
from mempo.rollout.sampler import SamplingConfig

TEMPERATURE = 0.7


@pytest.fixture(scope="module")
def setting(tiny_path):
    from mempo.lm.loading import load_policy

    policy, tok = load_policy(tiny_path)
    reference = copy.deepcopy(policy)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    builder = PromptBuilder(tok, Tags())
    env = SearchEnv(BM25Retriever(CORPUS), tok, topk=1, max_passage_tokens=32)
    sampling = SamplingConfig(max_new_tokens=64, temperature=TEMPERATURE)
    _, batch = evaluate_agent(
        ScriptedSampler(tok), env, [TASK, TASK_B], builder, AgentConfig(max_turns=4), sampling=sampling, greedy=False
    )
    return policy, reference, tok, builder, env, sampling, batch


def by_hand(policy, reference, batch: RolloutBatch) -> tuple[float, float, int]:
    """Mean k1 and k3 over every response token, one unpadded forward per turn sample."""
    k1, k3 = [], []
    for s in batch.samples:
        ids = torch.tensor([s.prompt_ids + s.response_ids])
        start = len(s.prompt_ids)
        with torch.no_grad():
            logits = [m(ids).logits[0, :-1].double() / TEMPERATURE for m in (policy, reference)]
        targets = ids[0, 1:, None]
        lp = [torch.log_softmax(z, -1).gather(-1, targets)[start - 1 :, 0] for z in logits]
        for a, b in zip(lp[0].tolist(), lp[1].tolist()):
            k1.append(a - b)
            k3.append(math.exp(b - a) - (b - a) - 1.0)
    return sum(k1) / len(k1), sum(k3) / len(k3), len(k1)


def test_kl_to_a_perturbed_reference_matches_a_hand_computation(setting):
    policy, reference, tok, _, _, _, batch = setting
    got = kl_to_reference(policy, reference, batch, pad_id=tok.pad_token_id, temperature=TEMPERATURE)
    k1, k3, n = by_hand(policy, reference, batch)
    assert got["kl_tokens"] == n == sum(len(s.response_ids) for s in batch.samples) > 50
    assert got["kl_k3"] > 0.01  # the perturbation moves the model: the comparison below is not of two zeros
    # float32 forwards (batched, padded) against float64 log-softmax of one unpadded forward per sample
    assert_close(got["kl_k1"], k1, rtol=1e-4, atol=1e-5)
    assert_close(got["kl_k3"], k3, rtol=1e-4, atol=1e-5)


def test_kl_of_a_checkpoint_to_itself_is_zero(setting):
    policy, _, tok, _, _, _, batch = setting
    got = kl_to_reference(policy, copy.deepcopy(policy), batch, pad_id=tok.pad_token_id, temperature=TEMPERATURE)
    assert (got["kl_k1"], got["kl_k3"]) == (0.0, 0.0)


def test_grid_rows_and_the_report_carry_the_kl(setting, tmp_path):
    policy, reference, tok, builder, env, sampling, _ = setting
    evaluation = EvalConfig(objectives=[2], agents=["memory"], turn_slack=None, greedy=False, kl_reference="ref")
    grid = evaluate_grid(
        ScriptedSampler(tok), env, builder, {2: [TASK]}, AgentConfig(max_turns=4), sampling, evaluation,
        checkpoint="c", policy=policy, reference=reference, pad_id=tok.pad_token_id,
    )  # fmt: skip
    _, batch = evaluate_agent(
        ScriptedSampler(tok), env, [TASK], builder, AgentConfig(max_turns=4), sampling=sampling, greedy=False
    )
    k1, k3, n = by_hand(policy, reference, batch)
    row = grid.rows[0]
    assert row["kl_tokens"] == n
    assert_close((row["kl_k1"], row["kl_k3"]), (k1, k3), rtol=1e-4, atol=1e-5)
    write_report(tmp_path, grid, num_tasks=1)
    with (tmp_path / "table.csv").open() as f:
        (written,) = list(csv.DictReader(f))
    assert_close(float(written["kl_k3"]), k3, rtol=1e-4, atol=1e-5)


def test_a_kl_reference_with_greedy_evaluation_is_refused():
    with pytest.raises(ValueError, match="kl_reference.*eval.greedy=false"):
        EvalConfig(greedy=True, kl_reference="runs/demo/sft/hf")
