"""PPO-clip surrogate and KL estimators (Eq. 10)."""

from __future__ import annotations

import torch
from torch import Tensor

KL_KINDS = ("k1", "k2", "k3")


def clipped_surrogate(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token loss -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A), r = exp(logp - old_logp).

    logp: [N, T] (gets gradient); old_logp, adv: [N, T] (detached here); mask: [N, T] tokens that carry loss.
    is_weights: optional [N, T] detached importance weights pi_old / pi_sampler (truncated IS when the sampler's
    log-probs are not the trainer's), multiplied into the loss.
    -> (loss [N, T], zero outside ``mask``; detached stats: clip_frac, clip_frac_low, clip_frac_high, ratio_mean,
    ratio_dev_max = the largest |r - 1| over ``mask``).
    """
    old_logp, adv = old_logp.detach(), adv.detach()
    m = mask.to(logp.dtype)
    ratio = torch.exp(logp - old_logp)  # [N, T]
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    unclipped_obj, clipped_obj = ratio * adv, clipped * adv
    loss = -torch.minimum(unclipped_obj, clipped_obj)
    if is_weights is not None:
        loss = loss * is_weights.detach()
    loss = loss * m
    with torch.no_grad():
        active = (clipped_obj < unclipped_obj).to(m.dtype) * m  # the clip bound is the one taken
        low = active * (ratio < 1.0 - eps_low).to(m.dtype)
        high = active * (ratio > 1.0 + eps_high).to(m.dtype)
        n = m.sum().clamp(min=1)
        stats = {
            "clip_frac": active.sum() / n,
            "clip_frac_low": low.sum() / n,
            "clip_frac_high": high.sum() / n,
            "ratio_mean": (ratio * m).sum() / n,
            "ratio_dev_max": ((ratio - 1.0).abs() * m).amax() if m.numel() else torch.zeros((), dtype=m.dtype),
        }
    return loss, stats


def kl_penalty(logp: Tensor, ref_logp: Tensor, kind: str = "k3") -> Tensor:
    """[N, T] per-token estimate of KL(pi_theta || pi_ref) from sampled tokens (Schulman's k1/k2/k3).

    k1 = logp - ref_logp; k2 = (logp - ref_logp)^2 / 2; k3 = exp(ref_logp - logp) - (ref_logp - logp) - 1.
    """
    ref_logp = ref_logp.detach()
    if kind == "k1":
        return logp - ref_logp
    if kind == "k2":
        return 0.5 * (logp - ref_logp) ** 2
    if kind == "k3":
        d = ref_logp - logp
        return torch.exp(d) - d - 1.0
    raise ValueError(f"loss.kl_kind must be one of {KL_KINDS}, got {kind!r}")
