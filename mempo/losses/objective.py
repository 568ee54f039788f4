"""The composed MemPO policy objective (Eq. 10): PPO-clip surrogate minus beta * KL, aggregated."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .aggregate import AGG_MODES, loss_weights
from .surrogate import KL_KINDS, clipped_surrogate, kl_penalty


@dataclass(frozen=True)
class LossConfig:
    """Parameters of Eq. 10 (config group ``loss``; keys repeat these names).

    eps_low / eps_high: PPO clip range (1 - eps_low, 1 + eps_high); eps_high > eps_low is DAPO's clip-higher.
    kl_coef: beta; 0 disables the KL term (and the reference model is never loaded).
    kl_kind: k1 | k2 | k3 estimator of KL(pi_theta || pi_ref).
    agg: aggregation mode (see ``mempo.losses.aggregate``).
    tis_cap: truncated importance sampling cap for a sampler/trainer mismatch (weights min(pi_old/pi_sampler, cap));
             None disables it. With old log-probs taken from the sampler (fp32 engines) every weight is 1.
    """

    eps_low: float = 0.2
    eps_high: float = 0.2
    kl_coef: float = 1e-3
    kl_kind: str = "k3"
    agg: str = "traj_mean_token_mean"
    tis_cap: float | None = 2.0

    def __post_init__(self) -> None:
        if not 0.0 < self.eps_low < 1.0:
            raise ValueError(f"loss.eps_low must be in (0, 1), got {self.eps_low}")
        if not self.eps_high > 0.0:
            raise ValueError(f"loss.eps_high must be > 0, got {self.eps_high}")
        if self.kl_coef < 0.0:
            raise ValueError(f"loss.kl_coef must be >= 0, got {self.kl_coef}")
        if self.kl_kind not in KL_KINDS:
            raise ValueError(f"loss.kl_kind must be one of {KL_KINDS}, got {self.kl_kind!r}")
        if self.agg not in AGG_MODES:
            raise ValueError(f"loss.agg must be one of {AGG_MODES}, got {self.agg!r}")
        if self.tis_cap is not None and self.tis_cap < 1.0:
            raise ValueError(f"loss.tis_cap must be >= 1 or null, got {self.tis_cap}")


def policy_objective(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    response_mask: Tensor,
    config: LossConfig,
    *,
    ref_logp: Tensor | None = None,
    traj_ids: Tensor | None = None,
    weights: Tensor | None = None,
    sampler_logp: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Loss to minimize (-J of Eq. 10) and detached metrics.

    logp: [N, T] current policy (gets gradient); old_logp, adv, response_mask: [N, T]; ref_logp: [N, T] needed
    when ``config.kl_coef > 0``; traj_ids: [N] for ``traj_mean_token_mean``.
    weights: [N, T] precomputed ``loss_weights`` (pass the full batch's weights, sliced, when this call sees a
    micro-batch; default: computed on this batch).
    sampler_logp: [N, T] log-probs of the engine that sampled the tokens; with ``config.tis_cap`` the loss is
    reweighted by min(exp(old_logp - sampler_logp), tis_cap) (truncated importance sampling).
    -> (scalar loss, {"pg_loss", "kl", "clip_frac", "clip_frac_low", "clip_frac_high", "ratio_mean",
    "ratio_dev_max", "adv_mean", "adv_std"}).
    """
    if weights is None:
        weights = loss_weights(response_mask, config.agg, traj_ids=traj_ids)
    weights = weights.to(logp.dtype)  # [N, T]
    is_weights = None
    if config.tis_cap is not None and sampler_logp is not None:
        is_weights = tis_weights(old_logp, sampler_logp, config.tis_cap).detach()
    pg_tok, stats = clipped_surrogate(
        logp, old_logp, adv, response_mask, eps_low=config.eps_low, eps_high=config.eps_high, is_weights=is_weights
    )
    pg_loss = (pg_tok * weights).sum()
    loss = pg_loss
    m = response_mask.to(logp.dtype)
    n = m.sum().clamp(min=1)
    if config.kl_coef > 0.0:
        if ref_logp is None:
            raise ValueError("loss.kl_coef > 0 needs ref_logp")
        kl_tok = kl_penalty(logp, ref_logp, config.kl_kind) * m  # [N, T]
        kl = (kl_tok * weights).sum()
        loss = loss + config.kl_coef * kl
        kl_metric = kl.detach()
    else:
        kl_metric = torch.zeros((), dtype=logp.dtype, device=logp.device)
    with torch.no_grad():
        adv_mean = (adv * m).sum() / n
        adv_var = (((adv - adv_mean) * m) ** 2).sum() / n
    metrics = {"pg_loss": pg_loss.detach(), "kl": kl_metric, **stats, "adv_mean": adv_mean, "adv_std": adv_var.sqrt()}
    return loss, metrics


def tis_weights(old_logp: Tensor, sampler_logp: Tensor, cap: float) -> Tensor:
    """[N, T] truncated importance weights min(pi_old / pi_sampler, cap) = min(exp(old_logp - sampler_logp), cap)."""
    return torch.exp(old_logp - sampler_logp).clamp(max=cap)


def engine_mismatch(old_logp: Tensor, sampler_logp: Tensor, mask: Tensor, tis_cap: float | None) -> dict[str, Tensor]:
    """How far the engine that sampled the tokens is from the trainer's old policy, over the tokens of ``mask``
    ([N, T], e.g. the response tokens of the rows the update computes); old_logp, sampler_logp [N, T].

    -> {"logp_gap": mean |old_logp - sampler_logp|, "row_gap": [N] that mean within each row (0 for a row without
    masked tokens), "tis_clip_frac": the share of those tokens whose importance weight pi_old / pi_sampler exceeds
    ``tis_cap`` (truncated there; 0 without a cap)}. All exactly 0 when the old log-probs are the engine's own
    (``optim.old_logp=sampler``)."""
    m = mask.bool()
    n = m.sum().clamp(min=1).to(torch.float32)
    diff = torch.where(m, old_logp.float() - sampler_logp.float(), 0.0)  # [N, T], 0 off the mask
    gap = diff.abs().sum() / n
    row_gap = diff.abs().sum(-1) / m.sum(-1).clamp(min=1)
    clipped = torch.zeros((), dtype=torch.float32, device=old_logp.device)
    if tis_cap is not None:
        clipped = (torch.exp(diff[m]) > tis_cap).sum() / n
    return {"logp_gap": gap, "row_gap": row_gap, "tis_clip_frac": clipped}


def sampled_token_entropy(sampler_logp: Tensor, mask: Tensor) -> Tensor:
    """Mean -log p of the sampled tokens of ``mask`` ([N, T]) under the distribution each was drawn from
    (``sampler_logp`` [N, T]): an unbiased Monte Carlo estimate of that distribution's per-token entropy, since
    E_{y ~ p}[-log p(y)] = H(p). 0 for an empty mask."""
    m = mask.bool()
    if not m.any():
        return torch.zeros((), dtype=torch.float32, device=sampler_logp.device)
    return -sampler_logp.float()[m].mean()
