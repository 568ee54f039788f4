"""Supervised warm start (docs/algorithm.md §5.1): teacher trajectories replayed through the same prompt builder and
environment as RL, one example per turn, loss on the teacher's turn tokens only.

The output head and log-softmax run only on the teacher's tokens (``score_mask``): a turn's prompt (system text,
question, memory, passages) is 4-6x longer than its target, and the 49k-vocabulary head is about a third of the
model's work per scored token. The learning rate warms up linearly, then decays by a cosine to
``min_lr_ratio * lr`` over the run (``lr_schedule=cosine``) or stays constant.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from mempo.core.base import one_of, require
from mempo.core.format import Tags, parse_turn
from mempo.core.padding import place, right_pad
from mempo.core.tasks import Task
from mempo.lm.logprobs import token_logprobs
from mempo.models.parallel import shard_for_strategy
from mempo.rollout.agent import Env, next_context
from mempo.rollout.prompts import PromptBuilder, TurnContext


@dataclass(frozen=True)
class SFTExample:
    """One teacher turn: the prompt the agent loop would build and the teacher's turn tokens."""

    prompt_ids: list[int]
    target_ids: list[int]
    trajectory: int = 0  # index of the teacher trajectory it comes from


@dataclass(frozen=True)
class SFTSequence:
    """One training row: token ids, which of them carry loss, and how many teacher turns they hold."""

    input_ids: list[int]
    target_mask: list[bool]
    turns: int = 1

    @classmethod
    def of(cls, example: SFTExample) -> SFTSequence:
        ids = example.prompt_ids + example.target_ids
        return cls(ids, [False] * len(example.prompt_ids) + [True] * len(example.target_ids))


def build_sft_examples(
    trajectories: Sequence[tuple[Task, Sequence[str]]],
    builder: PromptBuilder,
    env: Env,
    *,
    context: str = "memory",
    keep_previous_turn: bool = False,
    tags: Tags = Tags(),
) -> list[SFTExample]:
    """Replay each teacher trajectory turn by turn: the prompt of turn t is what the agent loop would build from
    the teacher's turns before it and the environment's real answers to its searches.

    A teacher turn that does not parse is an error naming the task and turn (teacher data must be well formed).
    """
    examples: list[SFTExample] = []
    pending = [(i, TurnContext(question=task.question)) for i, (task, _) in enumerate(trajectories)]
    # Advance all trajectories one turn at a time so every turn's searches go to the retriever in one call.
    while pending:
        searches: list[tuple[int, str, Any]] = []
        for traj_i, ctx in pending:
            task, turns = trajectories[traj_i]
            turn_i = sum(1 for _ in ctx.history)  # turns already replayed
            text = turns[turn_i]
            parsed = parse_turn(text, tags)
            if not parsed.ok:
                raise ValueError(f"teacher trajectory {task.task_id!r} turn {turn_i + 1}: {parsed.error}")
            ids = builder.tokenizer(text, add_special_tokens=False)["input_ids"]
            prompt = builder.prompt(ctx, context, keep_previous_turn=keep_previous_turn)
            examples.append(SFTExample(prompt, list(ids), traj_i))
            if parsed.action == "search":
                if turn_i + 1 >= len(turns):
                    raise ValueError(f"teacher trajectory {task.task_id!r} ends with a search (turn {turn_i + 1})")
                searches.append((traj_i, text, parsed))
        infos = env.search([p.argument for _, _, p in searches]) if searches else []
        ctxs = dict(pending)
        pending = [(i, next_context(ctxs[i], text, p, info)) for (i, text, p), info in zip(searches, infos)]
    return examples


def pack_turns(examples: Sequence[SFTExample], *, pack: bool = True) -> list[SFTSequence]:
    """One row per teacher turn, or (``pack``) each trajectory's consecutive turns merged into one row wherever a
    turn's prompt starts with the previous row's tokens, as full-history prompts do (each appends the last turn and
    its tool result). A causal model then reads, before every target token, exactly the tokens it reads in the
    turn's own row, so the loss per target token is unchanged while the shared prefix is read once, not once per
    turn. Memory prompts are rewritten every turn and are never merged. Rows keep the first-seen trajectory order.
    """
    if not pack:
        return [SFTSequence.of(e) for e in examples]
    by_traj: dict[int, list[SFTExample]] = {}
    for e in examples:
        by_traj.setdefault(e.trajectory, []).append(e)
    rows: list[SFTSequence] = []
    for turns in by_traj.values():
        ids, mask, n = [], [], 0
        for e in turns:
            if e.prompt_ids[: len(ids)] != ids:  # not an extension of the row: close it, start a new one
                rows.append(SFTSequence(ids, mask, n))
                ids, mask, n = [], [], 0
            new_prompt = e.prompt_ids[len(ids) :]
            ids += new_prompt + e.target_ids
            mask += [False] * len(new_prompt) + [True] * len(e.target_ids)
            n += 1
        rows.append(SFTSequence(ids, mask, n))
    return rows


def _as_rows(items: Sequence[SFTSequence | SFTExample]) -> list[SFTSequence]:
    """Rows as they are; a bare teacher turn as its own one-turn row."""
    return [r if isinstance(r, SFTSequence) else SFTSequence.of(r) for r in items]


class SFTDataset(Dataset):
    def __init__(self, rows: Sequence[SFTSequence]) -> None:
        if not rows:
            raise ValueError("SFT dataset is empty")
        self.rows = list(rows)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> SFTSequence:
        return self.rows[i]


def collate_sft(batch: Sequence[SFTSequence | SFTExample], pad_id: int) -> dict[str, torch.Tensor]:
    """-> input_ids, attention_mask, target_mask [B, T] (right padding; target = the teacher's turn tokens)."""
    rows = _as_rows(batch)
    ids, attn = right_pad([r.input_ids for r in rows], pad_id)
    target = place([r.target_mask for r in rows], [0] * len(rows), ids.shape[1], dtype=torch.bool)
    return {"input_ids": ids, "attention_mask": attn, "target_mask": target}


class _Collate:
    def __init__(self, pad_id: int) -> None:
        self.pad_id = pad_id

    def __call__(self, batch: list[SFTSequence]) -> dict[str, torch.Tensor]:
        return collate_sft(batch, self.pad_id)


def sft_dataloader(
    rows: Sequence[SFTSequence | SFTExample], *, batch_size: int, pad_id: int, seed: int = 0
) -> DataLoader:
    """Batches of ``batch_size`` teacher turns (a packed row counts its turns; a batch closes once it holds at least
    that many), length-bucketed (sorted within shuffled chunks) to keep padding small. With one turn per row this
    is ``batch_size`` rows per batch, so packing keeps the optimizer steps and the turns per step."""
    rows = _as_rows(rows)
    order = list(range(len(rows)))
    gen = torch.Generator().manual_seed(seed)
    order = [order[i] for i in torch.randperm(len(order), generator=gen).tolist()]
    chunk = batch_size * 8
    bucketed: list[int] = []
    for s in range(0, len(order), chunk):
        bucketed += sorted(order[s : s + chunk], key=lambda i: len(rows[i].input_ids))
    batches: list[list[int]] = [[]]
    held = 0
    for i in bucketed:
        if held >= batch_size:
            batches.append([])
            held = 0
        batches[-1].append(i)
        held += rows[i].turns
    perm = torch.randperm(len(batches), generator=gen).tolist()
    return DataLoader(SFTDataset(rows), batch_sampler=[batches[i] for i in perm], collate_fn=_Collate(pad_id))


LR_SCHEDULES = ("constant", "cosine")


@dataclass(frozen=True)
class SFTConfig:
    """Config group ``sft``: the supervised warm start.

    trajectories: JSONL of teacher trajectories (``mempo.data.oracle``); null = the synthetic oracle's.
    num_tasks: teacher tasks per entry of ``objectives`` (questions per task, one task set each; null =
    [data.objectives]). lr_schedule: constant | cosine (linear warmup, then down to min_lr_ratio * lr).
    max_steps: -1 = epochs over the examples. batch_size counts teacher turns. pack_turns: merge a trajectory's
    turns into one row where each prompt extends the last (full-history prompts; ``pack_turns``).
    """

    trajectories: str | None = None
    num_tasks: int = 256
    objectives: list[int] | None = None
    batch_size: int = 8
    lr: float = 1e-4
    weight_decay: float = 0.0
    warmup_steps: int = 4
    lr_schedule: str = "cosine"
    min_lr_ratio: float = 0.1
    epochs: int = 1
    max_steps: int = -1
    pack_turns: bool = True

    def __post_init__(self) -> None:
        objectives_ok = self.objectives is None or (len(self.objectives) > 0 and min(self.objectives) >= 1)
        require(
            "sft",
            self,
            [
                ("num_tasks", self.num_tasks >= 1, "must be >= 1"),
                ("objectives", objectives_ok, "must be null or a non-empty list of numbers >= 1"),
                ("batch_size", self.batch_size >= 1, "must be >= 1"),
                ("lr", self.lr > 0, "must be > 0"),
                ("warmup_steps", self.warmup_steps >= 0, "must be >= 0"),
                ("lr_schedule", self.lr_schedule in LR_SCHEDULES, one_of(LR_SCHEDULES)),
                ("min_lr_ratio", 0 <= self.min_lr_ratio <= 1, "must be in [0, 1]"),
                ("epochs", self.epochs >= 1, "must be >= 1"),
            ],
        )


def lr_factor(step: int, *, warmup_steps: int, total_steps: int, schedule: str, min_lr_ratio: float) -> float:
    """Multiplier of the base learning rate at optimizer step ``step`` (0-based): linear warmup over
    ``warmup_steps``, then 1 (constant) or a cosine from 1 down to ``min_lr_ratio`` at ``total_steps``."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant" or total_steps <= warmup_steps:
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(total_steps - warmup_steps, 1))
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


class SFTModule(L.LightningModule):
    """Token-mean negative log-likelihood of the teacher's turn tokens (prompts carry no loss)."""

    def __init__(
        self,
        policy: torch.nn.Module,
        *,
        lr: float = 1e-4,
        weight_decay: float = 0.0,
        warmup_steps: int = 0,
        total_steps: int = 0,
        lr_schedule: str = "constant",
        min_lr_ratio: float = 0.1,
    ):
        super().__init__()
        if lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"sft.lr_schedule must be one of {LR_SCHEDULES}, got {lr_schedule!r}")
        self.policy = policy
        self.lr, self.weight_decay, self.warmup_steps = lr, weight_decay, warmup_steps
        self.total_steps, self.lr_schedule, self.min_lr_ratio = total_steps, lr_schedule, min_lr_ratio
        self.tokens_seen = 0  # every token the model read (prompt + target), for throughput
        self.target_tokens_seen = 0
        self.train_s = 0.0
        self.losses: list[float] = []  # each step's loss on this rank (the run summary's ``losses``)
        self._t0 = 0.0

    def configure_model(self) -> None:
        """Under ``trainer=fsdp``: FSDP2 over the data-parallel ranks, as the RL stage (``shard_for_strategy``)."""
        shard_for_strategy(self, [self.policy])

    def on_train_start(self) -> None:
        self.policy.train()  # loaded in eval mode; Lightning keeps modules in the mode it finds them

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self._t0 = time.perf_counter()

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.train_s += time.perf_counter() - self._t0

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        target = batch["target_mask"]
        logp = token_logprobs(self.policy, batch["input_ids"], batch["attention_mask"], score_mask=target)  # [B, T]
        mask = target.to(logp.dtype)
        loss = -(logp * mask).sum() / mask.sum().clamp(min=1)
        self.losses.append(float(loss.detach()))
        self.tokens_seen += int(batch["attention_mask"].sum())
        self.target_tokens_seen += int(target.sum())
        n = batch["input_ids"].shape[0]
        self.log("sft/loss", loss, prog_bar=True, batch_size=n)
        self.log("sft/tokens", mask.sum(), batch_size=n)
        if self._trainer is not None:  # a module stepped by hand (tests) has no optimizer attached
            self.log("sft/lr", self.optimizers().param_groups[0]["lr"], batch_size=n)
        return loss

    def configure_optimizers(self) -> Any:
        params = [p for p in self.policy.parameters() if p.requires_grad]  # all of them, or a LoRA policy's adapters
        opt = torch.optim.AdamW(params, lr=self.lr, weight_decay=self.weight_decay)

        def factor(step: int) -> float:
            return lr_factor(
                step,
                warmup_steps=self.warmup_steps,
                total_steps=self.total_steps,
                schedule=self.lr_schedule,
                min_lr_ratio=self.min_lr_ratio,
            )

        sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
