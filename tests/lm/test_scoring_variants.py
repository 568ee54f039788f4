"""memory.scoring=per_objective and memory.scoring_context=no_instruction through the real tokenizer and model,
against plain float32 forwards and a token-to-objective assignment made by decoding (not by offsets)."""

from __future__ import annotations

import math

import torch
from replay import replay_batch
from torch.testing import assert_close

from mempo.lm.scoring import memory_answer_probabilities
from mempo.rollout.prompts import SCORING_INSTRUCTION
from mempo.stages.builders import build_module


def objectives_by_decoding(tokenizer, ids: list[int], gold: str) -> list[int]:
    """Each token's objective: where its decoded characters fall in " " + gold, split at "; " (-1: separator)."""
    text = f" {gold}"
    bounds, start = [], 1
    for part in gold.split("; "):
        bounds.append((start, start + len(part)))
        start += len(part) + 2
    out, pos = [], 0
    for k in range(len(ids)):
        end = len(tokenizer.decode(ids[: k + 1]))
        piece = text[pos:end]
        owner = [
            j for j, (a, b) in enumerate(bounds) if pos < b and end > a and text[max(pos, a) : min(end, b)].strip()
        ]
        out.append(owner[0] if owner and piece.strip(" ;") else -1)
        pos = end
    return out


def plain_answer_logps(model, prompt: list[int], answer: list[int]) -> torch.Tensor:
    ids = torch.tensor([prompt + answer])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    return logits[len(prompt) - 1 : -1].log_softmax(-1).gather(-1, torch.tensor(answer)[:, None])[:, 0]


def test_per_objective_and_no_instruction_match_plain_forwards(make_cfg):
    cfg = make_cfg("model=tiny", "trainer.precision=32-true")
    module, _ = build_module(cfg)
    builder, policy, tok = module.builder, module.policy.float(), module.tokenizer
    batch = replay_batch(tok, cfg, [(0, 1.0, None), (1, 0.0, None)])
    items = [(t.task.question, s.parsed.memory, t.task.gold) for t in batch.trajectories for s in t.turns]
    items += [(batch.trajectories[0].task.question, "", batch.trajectories[0].task.gold)]  # the empty memory
    for q, m, gold in items:
        assert builder.answer_objective_ids(gold) == objectives_by_decoding(tok, builder.answer_ids(gold), gold)
        with_instruction = tok.decode(builder.scoring_prompt(q, m))
        without = tok.decode(builder.scoring_prompt(q, m, instruction=False))
        assert SCORING_INSTRUCTION in with_instruction and SCORING_INSTRUCTION not in without
        assert with_instruction.replace(f"\n\n{SCORING_INSTRUCTION}", "") == without
    got = memory_answer_probabilities(
        policy, builder, items, pad_id=module.pad_id, micro_batch_size=3, scoring="per_objective",
        scoring_context="no_instruction",
    )  # fmt: skip
    expected = []
    for q, m, gold in items:
        answer = builder.answer_ids(gold)
        logp = plain_answer_logps(policy, builder.scoring_prompt(q, m, instruction=False), answer)
        owners = objectives_by_decoding(tok, answer, gold)
        per = [math.exp(float(logp[[o == k for o in owners]].mean())) for k in range(len(gold.split("; ")))]
        expected.append(sum(per) / len(per))
    assert_close(got, torch.tensor(expected), rtol=1e-4, atol=1e-6)  # padded vs unpadded float32 forwards
    joint = memory_answer_probabilities(policy, builder, items, pad_id=module.pad_id, micro_batch_size=3)
    assert not torch.allclose(joint, got)  # the switches change the scores
