"""Advantages: group-normalized trajectory advantage (GRPO), memory advantage (Eq. 4, 5) and their token-level
combination (Eq. 9), plus the registry of advantage estimators.

Shapes: R trajectories, N turn samples (one per turn of a trajectory), T padded tokens per sample.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

MEMORY_BASELINES = ("previous_memory", "question_only", "none")
MEMORY_NORMALIZE = ("pooled", "per_turn")
MEMORY_SCORING = ("joint", "per_objective")
MEMORY_SCORING_CONTEXTS = ("answer_now", "no_instruction")


def _dense_ids(*keys: Tensor) -> Tensor:
    """[M] contiguous ids 0..K-1 of the distinct tuples formed by ``keys`` (each [M])."""
    if len(keys) == 1:
        return torch.unique(keys[0], return_inverse=True)[1]
    stacked = torch.stack([k.to(torch.long) for k in keys], dim=1)  # [M, K]
    return torch.unique(stacked, dim=0, return_inverse=True)[1]


def group_normalize(
    values: Tensor, group_ids: Tensor, *, scale: bool = True, eps: float = 1e-6, std_floor: float = 0.0
) -> Tensor:
    """[M] -> [M]: (v - group mean) / (max(group std, std_floor) + eps), unbiased std as ``torch.std``.

    Without ``scale`` only the group mean is removed (Dr. GRPO). ``std_floor`` > 0 keeps a group whose values
    differ by little from being blown up to unit advantages. Groups of one member or of equal values give 0,
    never NaN.
    """
    if values.shape != group_ids.shape or values.dim() != 1:
        raise ValueError(f"values {tuple(values.shape)} and group_ids {tuple(group_ids.shape)} must be equal 1-D")
    if values.numel() == 0:
        return values.clone()
    ids = _dense_ids(group_ids)  # [M]
    k = int(ids.max()) + 1
    v = values.to(torch.float64)  # float64 sums keep equal-valued groups exactly zero
    count = torch.zeros(k, dtype=v.dtype, device=v.device).index_add_(0, ids, torch.ones_like(v))  # [K]
    mean = torch.zeros_like(count).index_add_(0, ids, v) / count  # [K]
    centered = v - mean[ids]  # [M]
    if not scale:
        return centered.to(values.dtype)
    sq = torch.zeros_like(count).index_add_(0, ids, centered * centered)  # [K]
    std = torch.sqrt(sq / (count - 1).clamp(min=1)).clamp(min=std_floor)  # [K]; a group of one: centered == 0
    return (centered / (std[ids] + eps)).to(values.dtype)


def grpo_advantage(rewards: Tensor, group_ids: Tensor, *, scale: bool = True, eps: float = 1e-6) -> Tensor:
    """[R] trajectory rewards R^T -> [R] trajectory advantages A^T (GRPO; Dr. GRPO without ``scale``)."""
    return group_normalize(rewards, group_ids, scale=scale, eps=eps)


def groups_with_signal(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """[R] rewards, [R] group ids -> [R] bool: the trajectory's group holds rewards that are not all equal."""
    ids = _dense_ids(group_ids)  # [R]
    k = int(ids.max()) + 1 if ids.numel() else 0
    lo = torch.full((k,), float("inf"), dtype=rewards.dtype, device=rewards.device).scatter_reduce(
        0, ids, rewards, "amin"
    )
    hi = torch.full((k,), float("-inf"), dtype=rewards.dtype, device=rewards.device).scatter_reduce(
        0, ids, rewards, "amax"
    )
    return (hi > lo)[ids]


def memory_advantage(
    mem_rewards: Tensor,
    group_ids: Tensor,
    turn_ids: Tensor,
    *,
    normalize: str = "pooled",
    eps: float = 1e-6,
    scale: bool = True,
    std_floor: float = 0.0,
) -> Tensor:
    """[M] memory rewards R^M -> [M] memory advantages A^M (z-scores, docs/algorithm.md §3).

    normalize: "pooled" (all memories of all rollouts of a task together) or "per_turn" (memories written at the
    same turn index of the same task). scale=False only centers; std_floor bounds the divisor from below.
    """
    if normalize == "pooled":
        keys = group_ids
    elif normalize == "per_turn":
        keys = _dense_ids(group_ids, turn_ids)
    else:
        raise ValueError(f"memory.normalize must be one of {MEMORY_NORMALIZE}, got {normalize!r}")
    return group_normalize(mem_rewards, keys, scale=scale, eps=eps, std_floor=std_floor)


def answer_probability(answer_logp: Tensor, answer_mask: Tensor) -> Tensor:
    """[M, L], [M, L] -> [M]: P(ans | q, m) = exp(mean log-prob of the L gold-answer tokens) (Eq. 4)."""
    mask = answer_mask.to(answer_logp.dtype)
    return torch.exp((answer_logp * mask).sum(-1) / mask.sum(-1).clamp(min=1))


def per_objective_answer_probability(answer_logp: Tensor, objective_ids: Tensor) -> Tensor:
    """[M, L] log-probs, [M, L] objective index of each token (-1: not an objective's answer, e.g. "; " or
    padding) -> [M]: the mean over objectives of exp(mean log-prob of that objective's gold tokens).

    A memory holding one of two facts scores about half of one holding both, where the joint geometric mean of
    ``answer_probability`` stays near 0 until every objective's fact is in the memory. Rows without any objective
    token give 0.
    """
    if answer_logp.shape != objective_ids.shape or answer_logp.dim() != 2:
        raise ValueError(f"answer_logp {tuple(answer_logp.shape)} and objective_ids {tuple(objective_ids.shape)}")
    k = int(objective_ids.max()) + 1 if objective_ids.numel() else 0
    if k <= 0:
        return torch.zeros(answer_logp.shape[0], dtype=answer_logp.dtype, device=answer_logp.device)
    onehot = (objective_ids[..., None] == torch.arange(k, device=objective_ids.device)).to(answer_logp.dtype)
    count = onehot.sum(1)  # [M, K] tokens of each objective
    total = (answer_logp[..., None] * onehot).sum(1)  # [M, K]
    present = count > 0
    p = torch.where(present, torch.exp(total / count.clamp(min=1)), torch.zeros_like(total))  # [M, K]
    return p.sum(-1) / present.sum(-1).clamp(min=1)


def memory_rewards(
    p_ans: Tensor, p_empty: Tensor, traj_ids: Tensor, turn_ids: Tensor, *, baseline: str = "previous_memory"
) -> Tensor:
    """R^M_{i,t} = P(ans | q, m_{i,t}) - eps_{i,t} (Eq. 5).

    p_ans:   [M] P(ans | q, m) of each memory.
    p_empty: [M] P(ans | q, empty memory) of the memory's task.
    traj_ids, turn_ids: [M] which rollout and turn wrote the memory.
    baseline: "previous_memory" (eps = P of the same rollout's memory at the previous turn that has one, or of
    the empty memory before its first), "question_only" (eps = P(ans | q, empty)), "none" (eps = 0).
    """
    if baseline == "none":
        return p_ans.clone()
    if baseline == "question_only":
        return p_ans - p_empty
    if baseline != "previous_memory":
        raise ValueError(f"memory.baseline must be one of {MEMORY_BASELINES}, got {baseline!r}")
    if p_ans.numel() == 0:
        return p_ans.clone()
    # Sort by (trajectory, turn); the predecessor of each memory is the previous entry of the same trajectory.
    order = torch.argsort(turn_ids, stable=True)
    order = order[torch.argsort(traj_ids[order], stable=True)]  # [M]
    p_sorted, traj_sorted = p_ans[order], traj_ids[order]
    prev = torch.empty_like(p_sorted)
    prev[0] = p_empty[order[0]]
    first = torch.ones_like(traj_sorted, dtype=torch.bool)
    first[1:] = traj_sorted[1:] != traj_sorted[:-1]
    prev[1:] = p_sorted[:-1]
    prev = torch.where(first, p_empty[order], prev)
    eps = torch.empty_like(prev)
    eps[order] = prev
    return p_ans - eps


def token_advantages(
    traj_adv: Tensor, mem_adv: Tensor, response_mask: Tensor, mem_mask: Tensor, *, alpha: float = 1.0
) -> Tensor:
    """Per-token advantages of N turn samples (Eq. 9).

    traj_adv:      [N] A^T of each sample's trajectory.
    mem_adv:       [N] A^M of the memory written in that turn (0 where the turn wrote none).
    response_mask: [N, T] tokens sampled by the policy.
    mem_mask:      [N, T] tokens of the turn's ``<mem>...</mem>`` span.
    -> adv [N, T] = (A^T + alpha * A^M * mem_mask) * response_mask. alpha = 0 is plain GRPO exactly.
    """
    resp = response_mask.to(traj_adv.dtype)
    mem = (mem_mask & response_mask.bool()).to(traj_adv.dtype)
    adv = traj_adv[:, None] * resp  # [N, T]
    if alpha != 0.0:
        adv = adv + alpha * mem_adv[:, None] * mem
    return adv


# ---------------------------------------------------------------------------------------------------------------
# Registry of advantage estimators: one uniform signature, so a new estimator is a function and a config value.


@dataclass(frozen=True)
class AdvantageInputs:
    """Everything an estimator may use (tensors only).

    rewards:       [R] trajectory rewards R^T.
    group_ids:     [R] task (group) of each trajectory.
    traj_ids:      [N] trajectory of each turn sample (index into ``rewards``).
    turn_ids:      [N] turn index of each sample.
    mem_rewards:   [N] R^M of the memory the turn wrote (ignored where not ``mem_valid``).
    mem_valid:     [N] the turn wrote a memory that was scored.
    response_mask: [N, T]; mem_mask: [N, T].
    """

    rewards: Tensor
    group_ids: Tensor
    traj_ids: Tensor
    turn_ids: Tensor
    mem_rewards: Tensor
    mem_valid: Tensor
    response_mask: Tensor
    mem_mask: Tensor


@dataclass(frozen=True)
class MemoryConfig:
    """Config group ``memory`` (Eq. 4, 5, 9; keys repeat these names).

    alpha: weight of A^M on memory tokens (Eq. 9); 0 = GRPO with the memory format.
    baseline: previous_memory | question_only | none (Eq. 5).
    normalize: pooled | per_turn grouping of R^M before the z-score. per_turn compares a memory only with those
        written at the same turn of the same task: pooled ranks a turn-1 plan ("need X") below any later memory
        that holds a fact, on every rollout, which pays answering early (docs/results.md, section 2).
    scale: divide R^M by its group's std (the paper's z-score); false only centers it, so A^M keeps R^M's units
        (reading 2: a z-score turns differences of 1e-3 into unit advantages).
    std_floor: the z-score divides by max(std, std_floor) (reading 2): groups whose memories all score near 0
        get advantages near 0 instead of +-1.
    scoring: joint (Eq. 4: exp of the mean log-prob over all objectives' gold tokens joined by "; ") |
        per_objective (the mean over objectives of each one's exp mean log-prob, separators unscored; reading 3:
        the joint geometric mean hides a memory that holds one objective's fact of two).
    scoring_context: answer_now (the question, the memory, "Give the final answer now.", then <answer>) |
        no_instruction (the same without the instruction; reading 1: an instruction to answer now pays memories
        shaped like final answers, guessed slots included).
    include_tags: the <mem> and </mem> tag tokens get the memory advantage too.
    log_p_ans: score memories even when the estimator does not use them (memory/p_ans_mean of an ablation).
    require_traj_signal: A^M = 0 in a group whose trajectory rewards are all equal (A^T = 0 there), so the memory
        advantage only reorders memories where the outcome tells rollouts apart. Without it such a group is moved
        by A^M alone, and every probe of that kind shortened trajectories (docs/results.md, section 2).
    """

    alpha: float = 1.0
    baseline: str = "previous_memory"
    normalize: str = "pooled"
    scale: bool = True
    std_floor: float = 0.0
    scoring: str = "joint"
    scoring_context: str = "answer_now"
    include_tags: bool = True
    log_p_ans: bool = False
    require_traj_signal: bool = False

    def __post_init__(self) -> None:
        if self.alpha < 0:
            raise ValueError(f"memory.alpha must be >= 0, got {self.alpha}")
        if self.baseline not in MEMORY_BASELINES:
            raise ValueError(f"memory.baseline must be one of {MEMORY_BASELINES}, got {self.baseline!r}")
        if self.normalize not in MEMORY_NORMALIZE:
            raise ValueError(f"memory.normalize must be one of {MEMORY_NORMALIZE}, got {self.normalize!r}")
        if self.std_floor < 0:
            raise ValueError(f"memory.std_floor must be >= 0, got {self.std_floor}")
        if self.scoring not in MEMORY_SCORING:
            raise ValueError(f"memory.scoring must be one of {MEMORY_SCORING}, got {self.scoring!r}")
        if self.scoring_context not in MEMORY_SCORING_CONTEXTS:
            raise ValueError(
                f"memory.scoring_context must be one of {MEMORY_SCORING_CONTEXTS}, got {self.scoring_context!r}"
            )


@dataclass(frozen=True)
class AdvantageConfig:
    """Config group ``advantage``: estimator, a name in ``ADVANTAGE_ESTIMATORS`` or an import path of an
    ``AdvantageEstimator``; scale: divide by the group std (false = Dr. GRPO); eps: added to the std."""

    estimator: str = "mempo"
    scale: bool = True
    eps: float = 1e-6

    def __post_init__(self) -> None:
        # An import path (module:name, file.py:name) is resolved, checked and registered by mempo.stages.plugins.
        if self.estimator not in ADVANTAGE_ESTIMATORS and ":" not in self.estimator:
            raise ValueError(
                f"advantage.estimator must be one of {sorted(k for k in ADVANTAGE_ESTIMATORS if ':' not in k)} or an "
                f"import path (module:name), got {self.estimator!r}"
            )
        if self.eps <= 0:
            raise ValueError(f"advantage.eps must be > 0, got {self.eps}")

    @property
    def needs_memory_scores(self) -> bool:
        """Whether the estimator reads R^M (then every memory is scored by a forward pass)."""
        return bool(getattr(estimator_of(self), "needs_memory_scores", False))


def uses_memory_rewards(memory: MemoryConfig, advantage: AdvantageConfig) -> bool:
    """Whether the advantage reads R^M: an estimator that uses it (not GRPO) at alpha > 0, the memory advantage's
    weight."""
    return memory.alpha != 0 and advantage.needs_memory_scores


def scores_memories(memory: MemoryConfig, advantage: AdvantageConfig) -> bool:
    """Whether an RL step runs the memory-scoring forward over every memory: for the advantage
    (``uses_memory_rewards``), or only to log P(ans | q, m) (``memory.log_p_ans``)."""
    return uses_memory_rewards(memory, advantage) or memory.log_p_ans


class AdvantageEstimator(Protocol):
    """[N, T] token advantages (float, on the inputs' device; nonzero only where ``response_mask`` is) from the batch's
    tensors and the two config groups it may read. ``needs_memory_scores``: whether it reads ``mem_rewards`` (an
    estimator given by import path without the attribute is taken not to)."""

    needs_memory_scores: bool

    def __call__(self, x: AdvantageInputs, memory: MemoryConfig, advantage: AdvantageConfig) -> Tensor: ...


ADVANTAGE_ESTIMATORS: dict[str, AdvantageEstimator] = {}


def register_advantage(
    name: str, *, needs_memory_scores: bool
) -> Callable[[Callable[..., Tensor]], AdvantageEstimator]:
    """Register an estimator under ``name`` (the value of ``advantage.estimator``); ``needs_memory_scores`` declares
    whether it reads ``mem_rewards`` (when false the module skips the memory-scoring forward)."""

    def deco(fn: Callable[..., Tensor]) -> AdvantageEstimator:
        if name in ADVANTAGE_ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        fn.needs_memory_scores = needs_memory_scores  # type: ignore[attr-defined]
        ADVANTAGE_ESTIMATORS[name] = fn  # type: ignore[assignment]
        return fn  # type: ignore[return-value]

    return deco


def compute_advantages(inputs: AdvantageInputs, memory: MemoryConfig, advantage: AdvantageConfig) -> Tensor:
    """-> adv [N, T] from the estimator named by ``advantage.estimator``."""
    return estimator_of(advantage)(inputs, memory, advantage)


def estimator_of(advantage: AdvantageConfig) -> AdvantageEstimator:
    """The registered estimator ``advantage.estimator`` names; a KeyError saying so for an import path that was never
    registered (``mempo.stages.plugins`` does it when the config is validated)."""
    if advantage.estimator not in ADVANTAGE_ESTIMATORS:
        raise KeyError(
            f"advantage.estimator={advantage.estimator!r} is not registered: an import path is registered when the "
            "config is validated (mempo.stages.config.validate_config)"
        )
    return ADVANTAGE_ESTIMATORS[advantage.estimator]


def trajectory_advantages(x: AdvantageInputs, advantage: AdvantageConfig) -> Tensor:
    """[R] A^T of every trajectory (GRPO z-scores of R^T within each task's group)."""
    return grpo_advantage(x.rewards, x.group_ids, scale=advantage.scale, eps=advantage.eps)


def memory_advantages(x: AdvantageInputs, memory: MemoryConfig, advantage: AdvantageConfig) -> Tensor:
    """[N] A^M of the memory each turn sample wrote (0 where ``mem_valid`` is false), as ``memory`` configures it."""
    mem_adv = torch.zeros_like(x.mem_rewards)  # [N]
    valid = x.mem_valid.bool()
    if valid.any():
        sample_groups = x.group_ids[x.traj_ids]  # [N]
        mem_adv[valid] = memory_advantage(
            x.mem_rewards[valid],
            sample_groups[valid],
            x.turn_ids[valid],
            normalize=memory.normalize,
            eps=advantage.eps,
            scale=memory.scale,
            std_floor=memory.std_floor,
        )
    if memory.require_traj_signal:
        mem_adv = mem_adv * groups_with_signal(x.rewards, x.group_ids)[x.traj_ids]
    return mem_adv


@register_advantage("grpo", needs_memory_scores=False)
def grpo_estimator(x: AdvantageInputs, memory: MemoryConfig, advantage: AdvantageConfig) -> Tensor:
    traj_adv = trajectory_advantages(x, advantage)  # [R]
    return token_advantages(
        traj_adv[x.traj_ids], torch.zeros_like(x.mem_rewards), x.response_mask, x.mem_mask, alpha=0.0
    )


@register_advantage("mempo", needs_memory_scores=True)
def mempo_estimator(x: AdvantageInputs, memory: MemoryConfig, advantage: AdvantageConfig) -> Tensor:
    traj_adv = trajectory_advantages(x, advantage)  # [R]
    mem_adv = memory_advantages(x, memory, advantage)  # [N]
    return token_advantages(traj_adv[x.traj_ids], mem_adv, x.response_mask, x.mem_mask, alpha=memory.alpha)
