"""mempo.losses: the MemPO math, pure tensor functions (imports torch only).

Shape legend
    R   trajectories (rollouts) in the batch; G of them per task (group)
    N   turn samples: one per turn of a trajectory (its prompt + its generated tokens)
    T   padded tokens per turn sample
    M   memory segments (one per turn that wrote a scored memory)

    rewards [R], group_ids [R]            trajectory rewards R^T and their task
    traj_ids [N], turn_ids [N]            which trajectory / turn a sample belongs to
    logp, old_logp, ref_logp, adv [N, T]  per-token log-probs and advantages
    response_mask, mem_mask [N, T]        tokens sampled by the policy / inside the turn's <mem>...</mem>

Departures from the textbook algorithm (each a config switch; defaults follow docs/algorithm.md):
    - advantages are GRPO z-scores (no critic); `scale=False` gives Dr. GRPO's mean-only centring;
    - memory tokens additionally get alpha * A^M (Eq. 9); alpha = 0 is exactly GRPO;
    - the KL term is subtracted from the objective (not folded into the reward), estimator k1/k2/k3;
    - aggregation defaults to a token mean per trajectory, then a mean over trajectories (Eq. 10).
"""

from .advantages import (
    ADVANTAGE_ESTIMATORS,
    MEMORY_BASELINES,
    MEMORY_NORMALIZE,
    MEMORY_SCORING,
    MEMORY_SCORING_CONTEXTS,
    AdvantageConfig,
    AdvantageInputs,
    MemoryConfig,
    answer_probability,
    compute_advantages,
    group_normalize,
    groups_with_signal,
    grpo_advantage,
    memory_advantage,
    memory_advantages,
    memory_rewards,
    per_objective_answer_probability,
    register_advantage,
    scores_memories,
    token_advantages,
    trajectory_advantages,
    uses_memory_rewards,
)
from .aggregate import AGG_MODES, aggregate, loss_weights
from .objective import LossConfig, engine_mismatch, policy_objective, sampled_token_entropy, tis_weights
from .surrogate import KL_KINDS, clipped_surrogate, kl_penalty

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AGG_MODES",
    "KL_KINDS",
    "MEMORY_BASELINES",
    "MEMORY_NORMALIZE",
    "MEMORY_SCORING",
    "MEMORY_SCORING_CONTEXTS",
    "AdvantageConfig",
    "AdvantageInputs",
    "MemoryConfig",
    "LossConfig",
    "aggregate",
    "engine_mismatch",
    "sampled_token_entropy",
    "answer_probability",
    "clipped_surrogate",
    "compute_advantages",
    "group_normalize",
    "groups_with_signal",
    "grpo_advantage",
    "kl_penalty",
    "loss_weights",
    "memory_advantage",
    "memory_advantages",
    "memory_rewards",
    "per_objective_answer_probability",
    "policy_objective",
    "register_advantage",
    "scores_memories",
    "tis_weights",
    "token_advantages",
    "trajectory_advantages",
    "uses_memory_rewards",
]
