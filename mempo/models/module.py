"""``MemPOModule``: the policy, its frozen reference, and one MemPO step per ``training_step``.

One step (docs/algorithm.md §3-4, Eq. 4, 5, 9, 10):
    tasks -> collect G rollouts each through ``self.sampler`` (owned by ``SamplerCallback``)
          -> trajectory rewards R^T (set by the agent loop)
          -> memory rewards R^M: one batched no-grad forward over every (q, m, gold) triple and each task's
             empty-memory baseline, under the current policy
          -> token advantages from the registered estimator
          -> old log-probs (the sampler's, exact for fp32 engines, or recomputed) and reference log-probs
          -> ``ppo_epochs`` passes over length-sorted micro-batches, each weighted by the full batch's
             aggregation weights, so accumulation reproduces the full-batch objective
          -> gradient clipping, one optimizer step per pass, metrics.
Departures from the paper's description: a non-finite loss or gradient skips the optimizer step (and stops the run
after ``max_nonfinite`` in a row) instead of corrupting the weights; a step without signal (every token advantage 0
and no KL term: all groups' rewards equal, no memory advantage) makes no update at all (``optim.skip_no_signal``),
because AdamW's moments would otherwise keep moving every weight along the last steps' direction (measured on this
CPU: after the gradient became 0 at step 4, the next steps took a warm start from 3.9 turns per task to 1.0 and
validation EM 0, docs/results.md).
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, replace
from typing import Any

import lightning as L
import numpy as np
import torch
from transformers import PreTrainedModel

from mempo.core.base import one_of, require, timed
from mempo.core.hardware import resident_gb
from mempo.core.tasks import Task
from mempo.eval.memory_credit import credit_metrics, credit_records, unscored_metrics
from mempo.lm.compiled import CompiledLayers
from mempo.lm.logprobs import token_logprobs
from mempo.lm.lora import adapter_disabled, export_states, is_adapter_key, is_lora, same_base
from mempo.lm.scoring import length_sorted_batches, memory_answer_probabilities, sequence_logprobs
from mempo.lm.sharding import idle_forward, is_sharded, lockstep_count, scalar
from mempo.lm.shared_prefix import computed_positions, shared_prefix_attention
from mempo.losses import (
    AdvantageConfig,
    AdvantageInputs,
    LossConfig,
    MemoryConfig,
    compute_advantages,
    engine_mismatch,
    loss_weights,
    memory_advantages,
    memory_rewards,
    policy_objective,
    sampled_token_entropy,
    scores_memories,
    trajectory_advantages,
    uses_memory_rewards,
)
from mempo.models.parallel import full_state_dict, gather_objects, shard_for_strategy
from mempo.models.profiling import PHASE_BACKWARD, PHASE_FORWARD, PHASE_LOGP, PHASE_OPTIMIZER
from mempo.rollout.agent import AgentConfig, Env, RolloutBatch, TurnBatch, collect, rollout_metrics
from mempo.rollout.dynamic import Draw, merge_groups, signal_group_ids
from mempo.rollout.prompts import PromptBuilder
from mempo.rollout.sampler import Sampler, SamplingConfig

OLD_LOGP_SOURCES = ("auto", "sampler", "recompute")
# A turn sample whose mean |engine log-prob - trainer old log-prob| exceeds this (nats a token) is reported in run.log.
ENGINE_GAP_WARN = 1.0
log = logging.getLogger(__name__)
# Sampling seeds: base + STEP_SEED_STRIDE x step + 7919 x turn (agent.collect) + i x n (prompt i, the sampler).
STEP_SEED_STRIDE = 1_000_003
# A data-parallel rank's offset: a band of SEED_BAND_STEPS steps, so rank r at step k < SEED_BAND_STEPS draws from
# seeds no other rank's step below SEED_BAND_STEPS uses (7919 x turns + prompts x n stay below STEP_SEED_STRIDE).
# It is not a multiple of 2^32: torch's CPU generator (vLLM-CPU's per-request generators, HFSampler) keeps only a
# seed's low 32 bits, so an offset of 2^40 would give every rank the same draws there. 8 ranks x 512 steps of seeds
# stay below 2^32; more ranks stay distinct on 64-bit generators (CUDA) and may meet on 32-bit ones.
SEED_BAND_STEPS = 512
RANK_SEED_STRIDE = SEED_BAND_STEPS * STEP_SEED_STRIDE
# Dynamic sampling's redraw round r (1..7, data.redraw_rounds) samples from seed + r x ROUND_SEED_STRIDE inside its
# step's band: distinct from round 0's seeds while 7919 x turns + prompts x n stays below it.
ROUND_SEED_STRIDE = 124_991


def rollout_seed(base: int | None, step: int, rank: int = 0) -> int | None:
    """The sampling seed of RL step ``step`` (0-based) on data-parallel rank ``rank``; rank 0's is the one-process
    seed, so one-process runs sample exactly as before ranks had seeds of their own. None stays None (unseeded)."""
    if base is None:
        return None
    return base + STEP_SEED_STRIDE * step + RANK_SEED_STRIDE * rank


@dataclass(frozen=True)
class OptimConfig:
    """Config group ``optim`` (keys repeat these names).

    old_logp: where the old log-probs come from: sampler (the engine's, exact when it samples in float32),
    recompute (a no-grad trainer forward; bf16 engines), or auto (``builders.resolve_old_logp`` picks one before
    the module is built; the module itself takes sampler or recompute).
    max_nonfinite: non-finite losses or gradients in a row before the run stops.
    skip_no_signal: no AdamW update on a step whose advantages are all 0 and kl_coef = 0 (see ``_has_signal``);
    false: such a step is AdamW's step on a zero gradient (its moments move the weights), in one process as under
    DDP/FSDP and whatever skip_zero_adv_rows.
    skip_zero_adv_rows: with kl_coef = 0, turn samples whose advantage is 0 on every response token (each adds exactly
    nothing to the gradient) are left out of the update and of the recomputed old log-probs (``update_rows``); a
    rank left with no row takes one zero-weighted backward (``_row_batches``).
    fuse_old_logp: with old_logp=recompute and ppo_epochs = 1, the old log-probs are the update's own forward,
    detached, instead of a separate no-grad forward over the same micro-batches: the same numbers (the forward is the
    same computation; tests/models/module/test_engine_mismatch.py holds the weights bit-identical), one forward less.
    compile_update: the policy's decoder layers run compiled (``torch.compile``, ``mempo.lm.compiled``) in the
    update and the old log-probs' recompute, eager everywhere else; needs old_logp=recompute, so that the old
    log-probs come from the same compiled forward (compiled kernels round differently from eager ones); auto: on
    exactly when the old log-probs are recomputed and the policy is not sharded (``builders.build_optim_config``
    resolves it before the module is built), so a recipe that asks for it still runs with a float32 engine.
    shared_prefix: the update's forwards (and the old and reference log-probs' recomputes) compute the leading tokens
    every row of a micro-batch shares (the system prompt, the chat template's) once (``mempo.lm.shared_prefix``): the
    same objective, fewer positions computed (perf/update_positions); an unsharded policy with SDPA attention only.
    auto: on where the update runs on a CPU and the policy is not sharded (``builders.build_optim_config``).
    head_grad_in_forward: the update's forward computes a frozen output head's gradient with respect to the hidden
    states from the logits it has (``mempo.lm.logprobs.head_logprobs``): two vocabulary-wide matmuls a scored token
    instead of three; the same log-probs, the same gradient up to bf16 rounding. Needs a frozen head (SmolLM2's tied
    head under model.train_top_layers or LoRA; refused where the head trains) and an unsharded policy. auto: on where
    shared_prefix's auto would be and the head is frozen (``builders.build_optim_config``).
    """

    lr: float = 1e-6
    weight_decay: float = 0.0
    warmup_steps: int = 0
    grad_clip: float = 1.0
    ppo_epochs: int = 1
    micro_batch_size: int = 8
    old_logp: str = "auto"
    max_nonfinite: int = 3
    skip_no_signal: bool = True
    skip_zero_adv_rows: bool = True
    fuse_old_logp: bool = True
    compile_update: bool | str = False
    shared_prefix: bool | str = False
    head_grad_in_forward: bool | str = False

    def __post_init__(self) -> None:
        checks = [
            ("lr", self.lr > 0, "must be > 0"),
            ("weight_decay", self.weight_decay >= 0, "must be >= 0"),
            ("warmup_steps", self.warmup_steps >= 0, "must be >= 0"),
            ("grad_clip", self.grad_clip > 0, "must be > 0"),
            ("ppo_epochs", self.ppo_epochs >= 1, "must be >= 1"),
            ("micro_batch_size", self.micro_batch_size >= 1, "must be >= 1"),
            ("old_logp", self.old_logp in OLD_LOGP_SOURCES, one_of(OLD_LOGP_SOURCES)),
            ("max_nonfinite", self.max_nonfinite >= 1, "must be >= 1"),
            ("compile_update", self.compile_update in (True, False, "auto"), "must be true, false or auto"),
            ("shared_prefix", self.shared_prefix in (True, False, "auto"), "must be true, false or auto"),
            ("head_grad_in_forward", self.head_grad_in_forward in (True, False, "auto"), "must be true, false or auto"),
            (
                "compile_update",
                self.compile_update is not True or self.old_logp in ("auto", "recompute"),
                "needs optim.old_logp=recompute (old log-probs from the same compiled forward)",
            ),
        ]
        require("optim", self, checks)


class MemPOModule(L.LightningModule):
    def __init__(
        self,
        policy: PreTrainedModel,
        tokenizer: Any,
        env: Env,
        *,
        reference: PreTrainedModel | None,
        builder: PromptBuilder,
        agent: AgentConfig,
        sampling: SamplingConfig,
        loss: LossConfig,
        memory: MemoryConfig,
        advantage: AdvantageConfig,
        optim: OptimConfig,
        group_size: int,
        reward_kind: str = "all_em",
        seed: int = 0,
        chains: Any = None,
        logp_temperature: float = 1.0,
        redraw_rounds: int = 0,
        base_fingerprint: str | None = None,
    ) -> None:
        super().__init__()
        if loss.kl_coef > 0 and reference is None and not is_lora(policy):
            raise ValueError("loss.kl_coef > 0 needs a reference model (or a LoRA policy: its adapter disabled)")
        self.policy = policy
        self.reference = reference
        if reference is not None:
            reference.requires_grad_(False).eval()
        self.tokenizer, self.env, self.builder = tokenizer, env, builder
        if "auto" in (optim.old_logp, optim.compile_update, optim.shared_prefix, optim.head_grad_in_forward):
            raise ValueError(
                "optim.old_logp / compile_update / shared_prefix / head_grad_in_forward=auto must be resolved before "
                "the module (builders.build_optim_config)"
            )
        head = policy.get_output_embeddings()
        if optim.head_grad_in_forward and (head is None or any(p.requires_grad for p in head.parameters())):
            raise ValueError(
                "optim.head_grad_in_forward needs a frozen output head, and this policy's trains (model."
                "train_top_layers=null with tied embeddings trains it): set model.train_top_layers or set it to false"
            )
        self.agent, self.sampling, self.loss_cfg, self.memory_cfg, self.optim_cfg = agent, sampling, loss, memory, optim
        self.advantage_cfg = advantage
        self.group_size, self.reward_kind, self.seed = group_size, reward_kind, seed
        # The logits' divisor for the log-probs of sampled tokens (update, recomputed old, reference): the sampling
        # temperature under sampler.logprobs=tempered, 1 under raw (SamplerConfig.logp_temperature).
        self.logp_temperature = logp_temperature
        # Dynamic sampling (data.dynamic_sampling): up to redraw_rounds rounds of extra tasks from ``redraw``
        # (step, round, rank, n) -> tasks, injected by the RL stage (mempo.data.datamodule.RedrawStream); 0 = off.
        self.redraw_rounds = redraw_rounds
        self.redraw: Callable[[int, int, int, int], list[Task]] | None = None
        self.automatic_optimization = False
        self.strict_loading = False  # checkpoints leave the frozen reference out
        self.sampler: Sampler | None = None  # set by SamplerCallback
        self.batches_done = 0  # RL steps completed (drives data order and sampling seeds on resume)
        self.nonfinite_in_a_row = 0
        self.last_metrics: dict[str, float] = {}
        self.last_task_ids: list[str] = []
        self.last_credit: list[dict[str, Any]] = []  # the step's memory-credit records (MemoryCreditFile writes them)
        self.chains = chains  # qid -> reasoning chain (synthetic data): the early-answer rate needs them
        self.final_state: dict[str, torch.Tensor] | None = None  # a sharded policy's full weights (on_train_end)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        # A LoRA policy's base (``mempo.lm.lora.base_fingerprint``): its checkpoints resume on this base only.
        self.base_fingerprint = base_fingerprint
        self.compiled: CompiledLayers | None = None  # optim.compile_update: built at the first update
        # step -> a context around that step's old log-probs and update (``mempo.models.profiling.UpdateProfiler``)
        self.update_profiler: Callable[[int], AbstractContextManager] | None = None

    def configure_model(self) -> None:
        """Under ``ModelParallelStrategy`` (``trainer=fsdp``): FSDP2 over the data-parallel ranks, the policy (fp32
        master weights, bf16 compute on GPUs) and the frozen reference alike (``mempo.lm.sharding``)."""
        shard_for_strategy(self, [self.policy, self.reference])

    def on_train_end(self) -> None:
        """A sharded policy's full weights for the HF export, gathered by every rank while the process group is
        up: the vLLM engine's shutdown at fit end (``SamplerCallback.on_fit_end``) takes torch.distributed down.
        A sharded LoRA policy's: the merged weights and the adapter (``mempo.lm.lora.export_states``)."""
        if is_lora(self.policy):
            self.final_state = export_states(self.policy) if is_sharded(self.policy) else None
        else:
            self.final_state = full_state_dict(self.policy)

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        return batch  # a list of Task: text, nothing to move

    # ------------------------------------------------------------------------------------------------ rollouts
    def rollout(self, tasks: list[Task], round: int = 0) -> RolloutBatch:
        """G rollouts of each task; ``round`` > 0: a dynamic-sampling redraw round (seeds of its own)."""
        if self.sampler is None:
            raise RuntimeError("no sampler: MemPOModule must be trained with a SamplerCallback")
        seed = rollout_seed(self.sampling.seed, self.batches_done, self.global_rank)  # ranks draw independently
        if seed is not None:
            seed += ROUND_SEED_STRIDE * round
        # training_step runs under the trainer's autocast (bf16-mixed); an in-process engine (vLLM-CPU runs torch
        # ops in this process) must sample in its own dtype, so that its log-probs are the behaviour policy's.
        with torch.autocast(self.device.type, enabled=False):
            return collect(
                self.sampler,
                self.env,
                tasks,
                self.group_size,
                self.builder,
                self.agent,
                sampling=replace(self.sampling, seed=seed),
                include_tags=self.memory_cfg.include_tags,
                reward_kind=self.reward_kind,
            )

    def memory_rewards(self, batch: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """-> (R^M [N], mem_valid [N], P(ans | q, m) [N]) over the batch's turn samples (Eq. 4, 5). Without the
        memory advantage (``uses_memory_rewards`` false) no forward runs and R^M = P = 0, unless ``log_p_ans``
        asks for the scores anyway (an ablation's P(ans | mem) curve; its advantages do not read them)."""
        samples = batch.samples
        valid = torch.tensor([s.parsed.ok and bool(s.parsed.memory) for s in samples], dtype=torch.bool)
        if not self.scores_memories:
            return torch.zeros(len(samples)), valid, torch.zeros(len(samples))
        tasks = {t.group_id: t.task for t in batch.trajectories}
        group_order = sorted(tasks)
        mem_idx = [i for i, s in enumerate(samples) if valid[i]]
        items = [(tasks[g].question, "", tasks[g].gold) for g in group_order]  # each task's empty-memory baseline
        items += [
            (tasks[samples[i].group_id].question, samples[i].parsed.memory, tasks[samples[i].group_id].gold)
            for i in mem_idx
        ]
        p = memory_answer_probabilities(
            self.policy,
            self.builder,
            items,
            pad_id=self.pad_id,
            micro_batch_size=self.optim_cfg.micro_batch_size,
            scoring=self.memory_cfg.scoring,
            scoring_context=self.memory_cfg.scoring_context,
        )
        p_empty_by_group = dict(zip(group_order, p[: len(group_order)].tolist()))
        p_mem = torch.zeros(len(samples))
        p_mem[mem_idx] = p[len(group_order) :]
        p_empty = torch.tensor([p_empty_by_group[s.group_id] for s in samples])
        traj = torch.tensor([s.traj_id for s in samples], dtype=torch.long)
        turn = torch.tensor([s.turn_id for s in samples], dtype=torch.long)
        rewards = torch.zeros(len(samples))
        if mem_idx:
            # The baseline chain runs over the memories a rollout actually wrote (a malformed turn has none).
            rewards[mem_idx] = memory_rewards(
                p_mem[mem_idx], p_empty[mem_idx], traj[mem_idx], turn[mem_idx], baseline=self.memory_cfg.baseline
            )
        return rewards, valid, p_mem

    @property
    def uses_memory_rewards(self) -> bool:
        """False when the estimator cannot use R^M (GRPO, or any estimator with alpha = 0, the weight of the memory
        advantage): the scoring forward over every memory is then skipped."""
        return uses_memory_rewards(self.memory_cfg, self.advantage_cfg)

    @property
    def scores_memories(self) -> bool:
        """Whether a step runs the memory-scoring forward: for the advantage, or only to log P(ans | q, m)."""
        return scores_memories(self.memory_cfg, self.advantage_cfg)

    @staticmethod
    def advantage_inputs(x: TurnBatch, mem_rewards: torch.Tensor, mem_valid: torch.Tensor) -> AdvantageInputs:
        return AdvantageInputs(
            rewards=x.rewards,
            group_ids=x.traj_group_ids,
            traj_ids=x.traj_ids,
            turn_ids=x.turn_ids,
            mem_rewards=mem_rewards,
            mem_valid=mem_valid,
            response_mask=x.response_mask,
            mem_mask=x.mem_mask,
        )

    def advantages(self, x: TurnBatch, mem_rewards: torch.Tensor, mem_valid: torch.Tensor) -> torch.Tensor:
        """[N, T] token advantages of a batch (``RolloutBatch.to_tensors``) from the configured estimator (Eq. 9)."""
        return compute_advantages(self.advantage_inputs(x, mem_rewards, mem_valid), self.memory_cfg, self.advantage_cfg)

    def memory_credit(
        self,
        rollouts: RolloutBatch,
        x: TurnBatch,
        adv: torch.Tensor,
        mem_r: torch.Tensor,
        mem_valid: torch.Tensor,
        p_mem: torch.Tensor,
    ) -> dict[str, float]:
        """Sets ``last_credit`` (one record per scored memory, ``mempo.eval.memory_credit``) and returns the step's
        credit metrics. A^M is computed as ``memory`` configures it even when alpha = 0 leaves it out of ``adv``."""
        inputs = self.advantage_inputs(x, mem_r, mem_valid)
        self.last_credit = credit_records(
            rollouts,
            step=self.batches_done,
            p_ans=p_mem,
            mem_reward=mem_r,
            mem_adv=memory_advantages(inputs, self.memory_cfg, self.advantage_cfg),
            mem_valid=mem_valid,
            traj_adv=trajectory_advantages(inputs, self.advantage_cfg),
        )
        return credit_metrics(self.last_credit, rollouts, adv, x.mem_mask, x.response_mask, self.chains)

    # ---------------------------------------------------------------------------------------------- training
    def training_step(self, batch: list[Task], batch_idx: int) -> None:
        """One MemPO step (the module docstring's flow); ``timings`` feed the perf/*_s metrics."""
        timings: dict[str, float] = {}
        self.last_task_ids = [t.task_id for t in batch]
        prefix_counts = getattr(self.sampler, "prefix_cache_counts", None)  # VLLMSampler's prefix-cache counters
        if prefix_counts is not None:
            prefix_counts()  # restart them: validation and the canary since the last step are not this rollout
        with timed(timings, "generate"):
            self.policy.eval()
            rollouts = self.rollout(batch)  # G rollouts per task, R^T set
        with timed(timings, "score"):
            draw = self._score(rollouts)  # R^M [N] (Eq. 4, 5), token advantages [N, T] (Eq. 9)
        if self.redraw_rounds:
            with timed(timings, "redraw"):
                draw, dynamic = self._fill_groups(draw, len(batch))
            self.last_task_ids = list(dict.fromkeys(t.task.task_id for t in draw.rollouts.trajectories))
        counts = prefix_counts() if prefix_counts is not None else None
        self.sampler.sleep()  # frees the accelerator for the update where the engine supports it (no-op on CPU)
        rollouts, x, adv, mem_r, mem_valid, p_mem = (
            draw.rollouts, draw.x, draw.adv, draw.mem_r, draw.mem_valid, draw.p_mem
        )  # fmt: skip
        profiled = self.update_profiler(self.batches_done + 1) if self.update_profiler else nullcontext()
        with self.update_forward(), profiled:
            with timed(timings, "logp"), torch.profiler.record_function(PHASE_LOGP):
                signal = not self.optim_cfg.skip_no_signal or self._has_signal(adv, x.response_mask)
                groups = self.update_rows(adv, x.response_mask)
                old_logp, ref_logp = self._old_and_ref_logp(x, groups) if signal else (None, None)
            with timed(timings, "update"):
                update = self._update(x, adv, old_logp, ref_logp, groups) if signal else self._no_update()  # Eq. 10
        update["train/rows_updated"] = float(sum(len(g) for g in groups)) if signal else 0.0
        if counts is not None:
            queries, hits = counts
            update["perf/prompt_tokens"] = float(queries)
            update["rollout/prefix_cache_hit_rate"] = hits / queries if queries else 0.0
        self.batches_done += 1
        if self.scores_memories:
            credit = self.memory_credit(rollouts, x, adv, mem_r, mem_valid, p_mem)
        else:
            self.last_credit = []
            credit = unscored_metrics(rollouts, adv, x.mem_mask, x.response_mask, self.chains)
        if self.redraw_rounds:
            credit.update(dynamic)
        self._log_step(rollouts, x, adv, update, timings, mem_r, mem_valid, p_mem, credit)

    @contextmanager
    def update_forward(self) -> Iterator[None]:
        """The policy's forwards of the update and the old log-probs' recompute: compiled decoder layers under
        ``optim.compile_update`` (built at the first step: inductor compiles at the first forward and backward),
        eager otherwise."""
        if not self.optim_cfg.compile_update:
            yield
            return
        if is_sharded(self.policy):
            raise ValueError("optim.compile_update is not supported with a sharded policy (trainer=fsdp)")
        if self.compiled is None:
            self.compiled = CompiledLayers(self.policy)
        with self.compiled.active():
            yield

    def _score(self, rollouts: RolloutBatch) -> Draw:
        mem_r, mem_valid, p_mem = self.memory_rewards(rollouts)
        x = rollouts.to_tensors(self.pad_id)
        return Draw(rollouts, x, self.advantages(x, mem_r, mem_valid), mem_r, mem_valid, p_mem)

    def _fill_groups(self, first: Draw, wanted: int) -> tuple[Draw, dict[str, float]]:
        """Dynamic sampling: keep the groups with signal and roll out more tasks (``redraw``) until ``wanted`` groups
        have it, within ``redraw_rounds`` rounds. Every rank runs every round (the most groups any rank lacks, so
        sharded forwards pair up) and keeps what it lacks. With no group with signal at all, the step trains on its
        own tasks as drawn (advantages all 0: ``skip_no_signal`` then skips the update)."""
        if self.redraw is None:
            raise RuntimeError("data.dynamic_sampling needs a redraw stream: MemPOModule.redraw (the RL stage sets it)")
        kept, draws, drawn, drawn_with_signal = [], [first], 0, 0
        for round in range(self.redraw_rounds + 1):
            draw = draws[-1]
            have = sum(len(g) for _, g in kept)
            gids = signal_group_ids(draw.adv, draw.x.response_mask, draw.x.group_ids)
            drawn_with_signal += len(gids)
            if gids[: wanted - have]:
                kept.append((draw, gids[: wanted - have]))
            missing = self._max_over_ranks(max(wanted - have - len(gids), 0))
            if missing == 0 or round == self.redraw_rounds:
                break
            tasks = self.redraw(self.batches_done, round + 1, self.global_rank, missing)
            drawn += len(tasks)
            draws.append(self._score(self.rollout(tasks, round=round + 1)))
        groups = sum(len(d.rollouts.trajectories) for d in draws) // self.group_size
        metrics = {
            "rollout/redraw_rounds": float(len(draws) - 1),
            "rollout/redrawn_tasks": float(drawn),
            "rollout/signal_groups": float(sum(len(g) for _, g in kept)),
            "rollout/drawn_zero_adv_groups": 1.0 - drawn_with_signal / max(groups, 1),
        }
        return (merge_groups(kept, self.pad_id) if kept else first), metrics

    def _max_over_ranks(self, n: int) -> int:
        """The largest ``n`` over the data-parallel ranks (every rank must call it)."""
        if self._world_size() == 1:
            return n
        t = self.trainer.strategy.reduce(torch.tensor(float(n), device=self.device), reduce_op="max")
        return int(t.item())

    def _log_step(
        self,
        rollouts: RolloutBatch,
        x: TurnBatch,
        adv: torch.Tensor,
        update: dict[str, float],
        timings: dict[str, float],
        mem_r: torch.Tensor,
        mem_valid: torch.Tensor,
        p_mem: torch.Tensor,
        credit: dict[str, float],
    ) -> None:
        gen_tokens = sum(s.generated_tokens for s in rollouts.samples)
        metrics = {
            **rollout_metrics(rollouts),
            **update,
            "memory/adv_std": float(_mem_adv_std(adv, x.mem_mask, x.response_mask)),
            "perf/gen_tok_per_s": gen_tokens / max(timings["generate"], 1e-9),
            "perf/samples": float(len(rollouts.samples)),
            "perf/tokens": float(x.attention_mask.sum()),
            "perf/response_tokens": float(x.response_mask.sum()),
            "perf/rss_gb": resident_gb(),  # the process's memory (the engine's included where it runs in-process)
            # The sampling policy's per-token entropy from the engine's log-probs, at no cost (sampler.logprobs=
            # tempered: the distribution the tokens were drawn from; raw: the untempered policy's cross-entropy)
            "rollout/token_entropy": float(sampled_token_entropy(x.sampler_logp, x.response_mask)),
            **{f"perf/{k}_s": v for k, v in timings.items()},
        }
        if self.scores_memories:
            metrics["memory/p_ans_mean"] = float(p_mem[mem_valid].mean()) if mem_valid.any() else 0.0
            metrics["memory/reward_mean"] = float(mem_r[mem_valid].mean()) if mem_valid.any() else 0.0
        metrics.update(credit)
        self.last_metrics = metrics
        n_tasks = len(rollouts.trajectories) // self.group_size
        self.log_dict(metrics, on_step=True, prog_bar=False, batch_size=n_tasks)
        self.log("train/reward", metrics["rollout/reward_mean"], prog_bar=True, batch_size=n_tasks)

    def engine_mismatch_metrics(
        self, x: TurnBatch, old_logp: torch.Tensor, groups: list[list[int]]
    ) -> dict[str, float]:
        """``rollout/engine_logp_gap``: the mean |old log-prob - the engine's log-prob| of the sampled tokens of the
        rows the update computes; ``train/tis_clip_frac``: the share of those tokens whose truncated importance
        weight pi_old / pi_engine is cut at ``loss.tis_cap``. Both 0 exactly when the old log-probs are the
        engine's (``optim.old_logp=sampler``, a float32 engine); with a bf16 engine they say how far it samples from
        the policy the update corrects towards."""
        rows = [i for g in groups for i in g]
        mask = torch.zeros_like(x.response_mask)
        mask[rows] = x.response_mask[rows]
        m = engine_mismatch(old_logp, x.sampler_logp, mask, self.loss_cfg.tis_cap)
        gaps = m["row_gap"]
        worst = int(gaps.argmax())
        if float(gaps[worst]) > ENGINE_GAP_WARN:
            self._warn_engine_gap(x, old_logp, gaps, worst)
        return {
            "rollout/engine_logp_gap": float(m["logp_gap"]),
            "rollout/engine_logp_gap_row_max": float(gaps[worst]),
            "train/tis_clip_frac": float(m["tis_clip_frac"]),
        }

    def _warn_engine_gap(self, x: TurnBatch, old_logp: torch.Tensor, gaps: torch.Tensor, row: int) -> None:
        """A turn sample whose sampled tokens the trainer scores far from the engine: its place and worst tokens in
        run.log (a bf16 engine differs from the trainer by about 1e-3 nats a token; whole nats mean that the engine
        sampled from another context or other weights than the trainer scores)."""
        pos = x.response_mask[row].nonzero().flatten()
        diff = (old_logp[row, pos].float() - x.sampler_logp[row, pos].float()).abs()
        top = pos[diff.argsort(descending=True)[:5]].tolist()
        tokens = ", ".join(
            f"{t}:{self.tokenizer.decode([int(x.input_ids[row, t])])!r} engine {float(x.sampler_logp[row, t]):.3f} "
            f"trainer {float(old_logp[row, t]):.3f}"
            for t in top
        )
        log.warning(
            "step %d: turn sample %d (trajectory %d, turn %d, %d sampled tokens) has a mean engine/trainer log-prob "
            "gap of %.3f nats (%d rows above %.1f); worst tokens: %s",
            self.batches_done + 1, row, int(x.traj_ids[row]), int(x.turn_ids[row]), len(pos), float(gaps[row]),
            int((gaps > ENGINE_GAP_WARN).sum()), ENGINE_GAP_WARN, tokens,
        )  # fmt: skip

    def update_rows(self, adv: torch.Tensor, response_mask: torch.Tensor) -> list[list[int]]:
        """The turn samples the update computes, in groups micro-batched apart: with a KL term every row (one group,
        every row has a gradient); without, the rows with a nonzero advantage on some response token, then (unless
        ``optim.skip_zero_adv_rows``) the rows without, which add exactly 0 to the gradient. Batching the two apart
        keeps the first group's computation identical whether the second runs or not."""
        if self.loss_cfg.kl_coef > 0:
            return [list(range(adv.shape[0]))]
        has = (adv.ne(0) & response_mask).any(-1).tolist()
        groups = [[i for i, h in enumerate(has) if h]]
        if not self.optim_cfg.skip_zero_adv_rows:
            groups.append([i for i, h in enumerate(has) if not h])
        return groups

    def _row_batches(self, lengths: list[int], groups: list[list[int]]) -> tuple[list[list[int]], int]:
        """Length-sorted micro-batches within each group of rows, and the idle ones this rank adds to match the
        busiest rank (sharded policy), or the one zero-weighted backward a rank with no rows takes: under DDP to
        take part in the gradient all-reduce, and in one process alike, so that an update without rows (a step
        without signal under ``optim.skip_no_signal=false``) is AdamW's step on a zero gradient in both, as when
        ``skip_zero_adv_rows`` is off (with every gradient None AdamW would move nothing)."""
        mbs = self.optim_cfg.micro_batch_size
        batches = [
            [rows[j] for j in b] for rows in groups for b in length_sorted_batches([lengths[i] for i in rows], mbs)
        ]
        idle = lockstep_count(len(batches), self.policy) - len(batches)
        if not batches and not idle:
            idle = 1
        return batches, idle

    def _world_size(self) -> int:
        return int(getattr(self.trainer.strategy, "world_size", 1)) if self._trainer is not None else 1

    @property
    def fuses_old_logp(self) -> bool:
        """Whether the update's own first forward gives the old log-probs (``OptimConfig.fuse_old_logp``): not for a
        policy that trains with dropout (a LoRA adapter's), whose training forward is not the no-grad one."""
        o = self.optim_cfg
        return o.old_logp == "recompute" and o.ppo_epochs == 1 and o.fuse_old_logp and not _has_dropout(self.policy)

    def _old_and_ref_logp(
        self, x: TurnBatch, groups: list[list[int]]
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Old log-probs (the sampler's, a no-grad recompute over the rows the update computes, group by group, or
        None when the update computes them itself, ``fuses_old_logp``) and reference log-probs (only with a KL term,
        which computes every row)."""

        # Only response tokens are scored: the loss and the KL never read a prompt position's log-prob.
        def score(model: torch.nn.Module) -> torch.Tensor:
            out = torch.zeros(x.input_ids.shape, dtype=torch.float32)
            for rows in _padded_groups(groups, model):
                out[rows] = sequence_logprobs(
                    model,
                    x.input_ids[rows],
                    x.attention_mask[rows],
                    micro_batch_size=self.optim_cfg.micro_batch_size,
                    score_mask=x.response_mask[rows],
                    temperature=self.logp_temperature,
                    shared_prefix=self.optim_cfg.shared_prefix,
                )
            return out

        old_logp = x.sampler_logp
        if self.fuses_old_logp:
            old_logp = None
        elif self.optim_cfg.old_logp == "recompute":
            old_logp = score(self.policy)
        ref_logp = None
        if self.loss_cfg.kl_coef > 0:
            with self.reference_policy() as reference:
                ref_logp = score(reference)
        return old_logp, ref_logp

    @contextmanager
    def reference_policy(self) -> Iterator[torch.nn.Module]:
        """The KL term's reference: the frozen second model, or a LoRA policy with its adapter disabled (the base's
        forward exactly; every rank of a sharded policy takes the same branch)."""
        if self.reference is not None or not is_lora(self.policy):
            yield self.reference
            return
        with adapter_disabled(self.policy):
            yield self.policy

    def _has_signal(self, adv: torch.Tensor, response_mask: torch.Tensor) -> bool:
        """Whether the loss has a gradient: a nonzero advantage on a response token, or a KL term. Data-parallel
        ranks agree (any rank's signal counts), so they all update or all skip together."""
        local = bool(self.loss_cfg.kl_coef > 0 or adv[response_mask].ne(0).any())
        return self._max_over_ranks(int(local)) > 0

    def _no_update(self) -> dict[str, float]:
        """A step without signal: no forward, no backward, and no AdamW update. ``opt.step()`` still runs with
        every gradient unset (AdamW then leaves each parameter and its moments as they are) so that Lightning counts
        the step and ``trainer.max_steps`` stays a number of RL steps; the lr schedule advances as on any step."""
        opt, sched = self.optimizers(), self.lr_schedulers()
        for _ in range(self.optim_cfg.ppo_epochs):
            opt.zero_grad(set_to_none=True)
            opt.step()
            if sched is not None:
                sched.step()
        return {
            "train/loss": 0.0,
            "train/clip_frac": 0.0,
            "train/ratio_mean": 1.0,
            "train/kl": 0.0,
            "train/grad_norm": 0.0,
            "train/lr": float(opt.param_groups[0]["lr"]),
            "train/skipped_steps": 0.0,
            "train/no_signal": 1.0,
            "train/first_epoch_ratio_dev": 0.0,
            "perf/update_tokens": 0.0,
            "perf/update_pad_frac": 0.0,
            "perf/update_positions": 0.0,
        }

    def _update(
        self,
        x: TurnBatch,
        adv: torch.Tensor,
        old_logp: torch.Tensor | None,
        ref_logp: torch.Tensor | None,
        groups: list[list[int]],
    ) -> dict[str, float]:
        """``ppo_epochs`` passes over the rows of ``groups`` (Eq. 10) -> the step's train/* and perf/update_* metrics,
        with the engine's mismatch to the old log-probs (``engine_mismatch_metrics``). ``old_logp`` None: the first
        (only) pass's forward, detached, is the old log-probs (``fuses_old_logp``)."""
        opt = self.optimizers()
        sched = self.lr_schedulers()
        self.policy.train()
        weights = loss_weights(x.response_mask, self.loss_cfg.agg, traj_ids=x.traj_ids)  # [N, T]
        lengths = x.attention_mask.sum(-1).tolist()
        rows = [i for g in groups for i in g]
        computed_tokens = max(float(x.response_mask[rows].sum()), 1.0)  # clip_frac, ratio_mean: over computed rows
        sums: dict[str, float] = {}
        skipped = 0
        grad_norm = 0.0
        ratio_dev = 0.0  # the first epoch's largest |new / old - 1|: 0 when the old log-probs are this forward's
        # The first epoch's real tokens, its micro-batches' [rows x longest row] and the positions its forwards compute
        # (fewer than the padded ones with optim.shared_prefix).
        tokens, padded, positions = 0, 0, 0
        fused = old_logp is None
        if fused:
            old_logp = torch.zeros(x.input_ids.shape, dtype=torch.float32)  # filled by the pass below
        # Held across every backward too: with gradient checkpointing the layers run their forward again there.
        repacked = shared_prefix_attention(self.policy) if self.optim_cfg.shared_prefix else nullcontext()
        with repacked:
            for epoch in range(self.optim_cfg.ppo_epochs):
                loss_total = 0.0
                # The loss weights stay the full batch's: rows left out (advantage 0 everywhere) would add exactly 0.
                micro_batches, idle = self._row_batches(lengths, groups)
                # Sharded: every rank runs as many forward/backward pairs as the busiest one (idle ones add 0); a DDP
                # rank with no rows takes part in the all-reduce with one such backward.
                for _ in range(idle):
                    self.manual_backward(0.0 * idle_forward(self.policy))
                for j, idx in enumerate(micro_batches):
                    t_len = int(max(lengths[i] for i in idx))
                    sl = (idx, slice(0, t_len))

                    def mb(t: torch.Tensor, sl: tuple = sl) -> torch.Tensor:
                        return t[sl].to(self.device)

                    with torch.profiler.record_function(PHASE_FORWARD):
                        logp = token_logprobs(
                            self.policy,
                            mb(x.input_ids),
                            mb(x.attention_mask),
                            score_mask=mb(x.response_mask),
                            temperature=self.logp_temperature,
                            shared_prefix=self.optim_cfg.shared_prefix,
                            head_grad_in_forward=self.optim_cfg.head_grad_in_forward,
                        )
                        if fused:  # the no-grad recompute's very numbers: the same forward over the same micro-batch
                            old_logp[sl] = logp.detach().float().cpu()
                        loss, m = policy_objective(
                            logp,
                            mb(old_logp),
                            mb(adv),
                            mb(x.response_mask),
                            self.loss_cfg,
                            ref_logp=None if ref_logp is None else mb(ref_logp),
                            weights=mb(weights),
                            sampler_logp=mb(x.sampler_logp),
                        )
                    # DDP: ranks hold different numbers of micro-batches, so gradients are synchronized only by each
                    # rank's last backward (one per rank per pass); earlier ones accumulate locally. FSDP2 reduces
                    # (reduce-scatters) every backward: no block, the padded counts above keep ranks in step.
                    sync = nullcontext() if j == len(micro_batches) - 1 else self._no_grad_sync()
                    with sync, torch.profiler.record_function(PHASE_BACKWARD):
                        self.manual_backward(loss)
                    loss_total += float(loss.detach())
                    if epoch == 0:
                        ratio_dev = max(ratio_dev, float(m["ratio_dev_max"]))
                        tokens += int(sum(lengths[i] for i in idx))
                        padded += len(idx) * t_len
                        positions += computed_positions(
                            x.input_ids[sl], x.attention_mask[sl], self.optim_cfg.shared_prefix
                        )
                    share = float(mb(x.response_mask).sum()) / computed_tokens
                    for k in ("clip_frac", "ratio_mean"):
                        sums[k] = sums.get(k, 0.0) + float(m[k]) * share
                    sums["kl"] = sums.get("kl", 0.0) + float(m["kl"])  # weighted parts of the full-batch KL add up
                # A DTensor under FSDP2: ``scalar`` makes it the float every rank agrees on.
                with torch.profiler.record_function(PHASE_OPTIMIZER):
                    grad_norm = scalar(
                        torch.nn.utils.clip_grad_norm_(self.policy.parameters(), self.optim_cfg.grad_clip)
                    )
                # The norm of the synchronized gradient is the same on every rank, so every rank skips together.
                if not math.isfinite(grad_norm):
                    self.nonfinite_in_a_row += 1
                    skipped += 1
                    opt.zero_grad(set_to_none=True)
                    if self.nonfinite_in_a_row >= self.optim_cfg.max_nonfinite:
                        raise FloatingPointError(
                            f"non-finite loss or gradient in {self.nonfinite_in_a_row} steps in a row (step "
                            f"{self.batches_done + 1}): stopping; lower optim.lr or check the data"
                        )
                    continue
                self.nonfinite_in_a_row = 0
                with torch.profiler.record_function(PHASE_OPTIMIZER):
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                if sched is not None:
                    sched.step()
        self.policy.eval()
        epochs = self.optim_cfg.ppo_epochs
        return {
            "train/loss": loss_total,
            "train/clip_frac": sums.get("clip_frac", 0.0) / epochs,
            "train/ratio_mean": sums.get("ratio_mean", 0.0) / epochs,
            "train/kl": sums.get("kl", 0.0) / epochs,
            "train/grad_norm": grad_norm,
            "train/lr": float(opt.param_groups[0]["lr"]),
            "train/skipped_steps": float(skipped),
            "train/no_signal": 0.0,
            "train/first_epoch_ratio_dev": ratio_dev,
            "perf/update_tokens": float(tokens),
            "perf/update_pad_frac": 1.0 - tokens / padded if padded else 0.0,
            "perf/update_positions": float(positions),
            **self.engine_mismatch_metrics(x, old_logp, groups),
        }

    def _no_grad_sync(self) -> Any:
        block = getattr(self.trainer.strategy, "block_backward_sync", None)
        return block() if block is not None else nullcontext()

    def configure_optimizers(self) -> Any:
        params = [p for p in self.policy.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=self.optim_cfg.lr, weight_decay=self.optim_cfg.weight_decay)
        warmup = self.optim_cfg.warmup_steps
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup) if warmup > 0 else 1.0)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    # -------------------------------------------------------------------------------------------- checkpoints
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Leaves the frozen reference out (a sharded checkpoint keeps it: its loader restores every key) and adds
        the step count and every rank's RNG states (``rng_by_rank``; a collective under DDP and FSDP). A LoRA policy's
        unsharded checkpoint holds the adapter only (its optimizer state is the adapter's anyway) and the base's
        fingerprint; a sharded one holds the frozen base's shards too (FSDP2's loader restores every key)."""
        lora = is_lora(self.policy)
        if not is_sharded(self.policy):
            checkpoint["state_dict"] = {
                k: v for k, v in checkpoint["state_dict"].items() if not k.startswith("reference.")
            }
            if lora:
                checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if is_adapter_key(k)}
        rng = {
            "torch": torch.get_rng_state(),
            "python": random.getstate(),
            "numpy": _numpy_state_to_plain(np.random.get_state()),
        }
        checkpoint["mempo"] = {"batches_done": self.batches_done, "rng_by_rank": gather_objects(rng)}
        if lora:
            checkpoint["mempo"]["lora_base"] = self.base_fingerprint

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get("mempo", {})
        saved, mine = state.get("lora_base"), self.base_fingerprint if is_lora(self.policy) else None
        # An adapter on another base, or adapter and full weights mixed: never resumed silently.
        if not same_base(saved, mine):
            raise ValueError(
                f"resume refused: the checkpoint's LoRA base is {saved or 'none (full weights)'}, this run's is "
                f"{mine or 'none (full weights)'} (model.name_or_path={getattr(self.policy, 'name_or_path', None)!r})"
            )
        self.batches_done = int(state.get("batches_done", 0))
        by_rank = state.get("rng_by_rank") or [state.get("rng")]  # "rng": checkpoints of one rank's state
        # The same world size resumes each rank's own stream; another one resumes rank 0's everywhere.
        rng = by_rank[self.global_rank] if len(by_rank) > self.global_rank else by_rank[0]
        if rng:
            torch.set_rng_state(rng["torch"])
            random.setstate(rng["python"])
            np.random.set_state(_numpy_state_from_plain(rng["numpy"]))


def _padded_groups(groups: list[list[int]], model: torch.nn.Module) -> list[list[int]]:
    """``groups`` without the empty ones, except under a sharded ``model``, where every group is scored (an empty one
    by idle forwards only) so that the ranks' collectives pair up."""
    return groups if is_sharded(model) else [g for g in groups if g]


DROPOUT_CONFIG_KEYS = ("attention_dropout", "hidden_dropout", "dropout", "resid_pdrop", "attn_pdrop", "embd_pdrop")


def _has_dropout(model: torch.nn.Module) -> bool:
    """Whether ``model`` drops anything in training mode: a dropout module with p > 0, or a dropout rate in its
    config (attention kernels read those directly)."""
    if any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules()):
        return True
    config = getattr(model, "config", None)
    return any(float(getattr(config, key, 0) or 0) > 0 for key in DROPOUT_CONFIG_KEYS)


def _mem_adv_std(adv: torch.Tensor, mem_mask: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    sel = adv[mem_mask & response_mask]
    return sel.std() if sel.numel() > 1 else torch.tensor(0.0)


def _numpy_state_to_plain(state: tuple) -> dict[str, Any]:
    """numpy's RNG state as tensors and ints, so checkpoints load with ``torch.load(weights_only=True)``."""
    kind, keys, pos, has_gauss, cached = state
    return {
        "kind": kind,
        "keys": torch.from_numpy(keys.astype(np.int64)),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached": float(cached),
    }


def _numpy_state_from_plain(d: dict[str, Any]) -> tuple:
    return (d["kind"], d["keys"].numpy().astype(np.uint32), d["pos"], d["has_gauss"], d["cached"])
