"""Batched no-grad forwards over token sequences: answer scoring for the memory reward (Eq. 4) and the
reference / old log-probs of turn samples. Sequences are sorted by length and cut into micro-batches, so padding
stays small and no forward sees more than ``micro_batch_size`` rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
from torch import Tensor

from mempo.core.padding import right_pad
from mempo.lm.logprobs import token_logprobs
from mempo.lm.sharding import idle_forwards, lockstep_count
from mempo.losses import (
    MEMORY_SCORING,
    MEMORY_SCORING_CONTEXTS,
    answer_probability,
    per_objective_answer_probability,
)


def length_sorted_batches(lengths: Sequence[int], micro_batch_size: int) -> list[list[int]]:
    """Indices grouped into micro-batches of similar length (longest first)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return [order[i : i + micro_batch_size] for i in range(0, len(order), micro_batch_size)]


def lockstep_batches(
    lengths: Sequence[int], micro_batch_size: int, model: torch.nn.Module
) -> tuple[list[list[int]], int]:
    """``length_sorted_batches``, and how many idle micro-batches this rank adds to match the busiest rank when
    ``model`` is sharded (0 otherwise). Agreed before the first forward: collectives come in the same order on
    every rank."""
    batches = length_sorted_batches(lengths, micro_batch_size)
    return batches, lockstep_count(len(batches), model) - len(batches)


@torch.no_grad()
def answer_probabilities(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    answers: Sequence[Sequence[int]],
    *,
    pad_id: int,
    micro_batch_size: int = 16,
    objective_ids: Sequence[Sequence[int]] | None = None,
) -> Tensor:
    """[M] P(answer | prompt) = exp(mean token log-prob of the teacher-forced answer) (Eq. 4), float32. With
    ``objective_ids`` (per answer token, its objective or -1) the mean over objectives of each one's P instead."""
    if len(prompts) != len(answers):
        raise ValueError(f"{len(prompts)} prompts but {len(answers)} answers")
    if objective_ids is not None and [len(o) for o in objective_ids] != [len(a) for a in answers]:
        raise ValueError("objective_ids must give one objective index per answer token")
    out = torch.zeros(len(prompts), dtype=torch.float32)
    device = next(model.parameters()).device
    lengths = [len(p) + len(a) for p, a in zip(prompts, answers)]
    batches, idle = lockstep_batches(lengths, micro_batch_size, model)
    for idx in batches:
        ids, mask = right_pad([list(prompts[i]) + list(answers[i]) for i in idx], pad_id)
        ans_mask = torch.zeros_like(mask)
        for row, i in enumerate(idx):
            ans_mask[row, len(prompts[i]) : lengths[i]] = True
        logp = token_logprobs(model, ids.to(device), mask.to(device), score_mask=ans_mask.to(device))  # [B, T]
        if objective_ids is None:
            out[idx] = answer_probability(logp.float().cpu(), ans_mask).float()
            continue
        obj = torch.full(ids.shape, -1, dtype=torch.long)
        for row, i in enumerate(idx):
            obj[row, len(prompts[i]) : lengths[i]] = torch.tensor(objective_ids[i], dtype=torch.long)
        out[idx] = per_objective_answer_probability(logp.float().cpu(), obj).float()
    idle_forwards(idle, model)
    return out


class ScoringPrompts(Protocol):
    """What memory scoring needs of the prompt builder (``mempo.rollout.prompts.PromptBuilder``)."""

    def scoring_prompt(self, question: str, memory: str, *, instruction: bool = True) -> list[int]: ...

    def answer_ids(self, gold: str) -> list[int]: ...

    def answer_objective_ids(self, gold: str) -> list[int]: ...


def memory_answer_probabilities(
    model: torch.nn.Module,
    builder: ScoringPrompts,
    items: Sequence[tuple[str, str, str]],
    *,
    pad_id: int,
    micro_batch_size: int = 16,
    scoring: str = "joint",
    scoring_context: str = "answer_now",
) -> Tensor:
    """[M] P(gold | q, m) (Eq. 4) of each (question, memory, gold) under ``model``: the scoring context holds only
    the question and the memory ("" for the empty-memory baseline of Eq. 5). RL's memory rewards and the
    evaluation's memory analysis both score through here. ``scoring`` and ``scoring_context`` are
    ``memory.scoring`` (joint | per_objective) and ``memory.scoring_context`` (answer_now | no_instruction)."""
    if scoring not in MEMORY_SCORING:
        raise ValueError(f"memory.scoring must be one of {MEMORY_SCORING}, got {scoring!r}")
    if scoring_context not in MEMORY_SCORING_CONTEXTS:
        raise ValueError(f"memory.scoring_context must be one of {MEMORY_SCORING_CONTEXTS}, got {scoring_context!r}")
    instruction = scoring_context == "answer_now"
    prompts = [builder.scoring_prompt(question, memory, instruction=instruction) for question, memory, _ in items]
    answers = [builder.answer_ids(gold) for _, _, gold in items]
    objective_ids = [builder.answer_objective_ids(gold) for _, _, gold in items] if scoring == "per_objective" else None
    return answer_probabilities(
        model, prompts, answers, pad_id=pad_id, micro_batch_size=micro_batch_size, objective_ids=objective_ids
    )


@torch.no_grad()
def sequence_logprobs(
    model: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    *,
    micro_batch_size: int = 16,
    score_mask: Tensor | None = None,
    temperature: float = 1.0,
    shared_prefix: bool = False,
) -> Tensor:
    """[N, T] -> [N, T] token log-probs under ``model`` (at ``temperature``: log softmax(logits / temperature)), in
    length-sorted micro-batches trimmed to their longest row (right padding); with ``score_mask`` (e.g. the response
    mask) only those positions are scored, the rest are 0 (see ``token_logprobs``, also for ``shared_prefix``)."""
    out = torch.zeros(input_ids.shape, dtype=torch.float32)
    device = next(model.parameters()).device
    lengths = attention_mask.sum(-1).tolist()
    batches, idle = lockstep_batches(lengths, micro_batch_size, model)
    for idx in batches:
        t_len = int(max(lengths[i] for i in idx))
        ids = input_ids[idx, :t_len].to(device)
        mask = attention_mask[idx, :t_len].to(device)
        score = None if score_mask is None else score_mask[idx, :t_len].to(device)
        logp = token_logprobs(model, ids, mask, score_mask=score, temperature=temperature, shared_prefix=shared_prefix)
        out[idx, :t_len] = logp.float().cpu()
    idle_forwards(idle, model)
    return out
