"""Per-token log-probs of given token ids, without the full [N, T, V] float32 log-softmax.

The decoder runs once over the batch; the output head and the float32 log-softmax then run over chunks of
``chunk_size`` valid positions at a time. Under autograd each chunk's logits are recomputed in backward (a
checkpoint, or for log-probs of a plain linear head ``LinearHeadLogProb``'s own backward), so neither forward nor
backward ever holds more than one chunk's [chunk_size, V] logits: a batch of 16 x 2048 tokens over SmolLM2's 49k
vocabulary would otherwise need 6.4 GB per copy.

Supports models whose logits are ``get_output_embeddings()(last hidden state)``; models that rescale or cap
logits after the head (Gemma-2 soft-capping, Cohere logit_scale) are refused rather than silently mis-scored.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable
from torch.utils.checkpoint import checkpoint
from transformers import PreTrainedModel

from mempo.lm.shared_prefix import shared_prefix_active, shared_prefix_attention, shared_prefix_layout, unpack

# Config attributes of models whose logits are not plain lm_head(hidden).
_LOGIT_POSTPROCESSING = ("final_logit_softcapping", "logit_scale", "output_multiplier_scale", "logits_scaling")


TOKEN_STATS_METHOD = "mempo_token_stats"  # set on sharded models by mempo.lm.sharding.shard_model


def token_logprobs(
    model: PreTrainedModel,
    input_ids: Tensor,
    attention_mask: Tensor,
    *,
    chunk_size: int = 256,
    temperature: float = 1.0,
    score_mask: Tensor | None = None,
    shared_prefix: bool = False,
    head_grad_in_forward: bool = False,
) -> Tensor:
    """input_ids, attention_mask [N, T] -> logp [N, T] float32 (float64 for a float64 model).

    logp[:, t] = log p(input_ids[:, t] | input_ids[:, :t]) under ``softmax(logits / temperature)``. Positions
    with nothing before them (t = 0, a row's first real token under left padding) and padding positions get 0.
    Padding may be on either side; position ids follow the mask, as in ``generate``. Differentiable.
    score_mask [N, T] (optional): score only these positions (others get 0), e.g. the response tokens of a turn
    sample: the decoder still reads the whole sequence, but the output head and the log-softmax, a large share of
    the cost with a 49k-150k vocabulary, run only where a log-prob is used.
    shared_prefix: compute the leading tokens every row shares once (``mempo.lm.shared_prefix``; right padding, SDPA
    attention, an unsharded model): the same log-probs up to the order of float additions.
    head_grad_in_forward: a frozen output head's gradient with respect to the hidden states computed in the forward
    (``head_logprobs``); the same log-probs, the same gradient up to bf16 rounding.
    """
    if shared_prefix or head_grad_in_forward:
        if getattr(model, TOKEN_STATS_METHOD, None) is not None:
            key = "optim.shared_prefix" if shared_prefix else "optim.head_grad_in_forward"
            raise ValueError(f"{key}: not for a sharded model (FSDP); set {key}=false")
        logp, _ = local_token_stats(model, input_ids, attention_mask, chunk_size, temperature, False, score_mask,
                                    shared_prefix=shared_prefix, head_grad_in_forward=head_grad_in_forward)  # fmt: skip
        return logp
    logp, _ = _token_stats(model, input_ids, attention_mask, chunk_size, temperature, False, score_mask)
    return logp


def token_logprobs_and_entropy(
    model: PreTrainedModel,
    input_ids: Tensor,
    attention_mask: Tensor,
    *,
    chunk_size: int = 256,
    temperature: float = 1.0,
    score_mask: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """input_ids, attention_mask [N, T] -> (logp [N, T], entropy [N, T]), both float32 (or float64).

    entropy[:, t] = H(p(. | input_ids[:, :t])), the entropy of the distribution that scored token t; zero
    where logp is zero by convention (see ``token_logprobs``). Differentiable.
    """
    logp, entropy = _token_stats(model, input_ids, attention_mask, chunk_size, temperature, True, score_mask)
    assert entropy is not None
    return logp, entropy


def _token_stats(
    model: PreTrainedModel,
    input_ids: Tensor,
    attention_mask: Tensor,
    chunk_size: int,
    temperature: float,
    with_entropy: bool,
    score_mask: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    # A sharded model (mempo.lm.sharding.shard_model) runs the same computation through a registered FSDP forward
    # method, so its root unit's parameters (embeddings, head) are gathered around it.
    method = getattr(model, TOKEN_STATS_METHOD, None) or (lambda *a: local_token_stats(model, *a))
    return method(input_ids, attention_mask, chunk_size, temperature, with_entropy, score_mask)


def local_token_stats(
    model: PreTrainedModel,
    input_ids: Tensor,
    attention_mask: Tensor,
    chunk_size: int,
    temperature: float,
    with_entropy: bool,
    score_mask: Tensor | None = None,
    *,
    shared_prefix: bool = False,
    head_grad_in_forward: bool = False,
) -> tuple[Tensor, Tensor | None]:
    if input_ids.dim() != 2 or input_ids.shape != attention_mask.shape:
        raise ValueError(
            f"input_ids and attention_mask must both be [N, T]; got {tuple(input_ids.shape)} and "
            f"{tuple(attention_mask.shape)}"
        )
    if score_mask is not None and score_mask.shape != input_ids.shape:
        raise ValueError(f"score_mask must be [N, T] like input_ids; got {tuple(score_mask.shape)}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 for log-probs, got {temperature}")
    for name in _LOGIT_POSTPROCESSING:
        if getattr(model.config, name, None) not in (None, 1, 1.0):
            raise NotImplementedError(f"{type(model).__name__} post-processes logits ({name}); not supported")
    head = model.get_output_embeddings()
    if head is None:
        raise ValueError(f"{type(model).__name__} has no output embeddings (lm_head) to score tokens with")

    mask = attention_mask.bool()
    n, t = input_ids.shape
    layout = shared_prefix_layout(input_ids, attention_mask) if shared_prefix else None
    if layout is None:
        # Left padding: positions count real tokens only, exactly as generate() numbered them.
        position_ids = (mask.long().cumsum(-1) - 1).clamp(min=0)
        hidden = model.get_decoder()(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        ).last_hidden_state  # [N, T, H]
    else:  # the shared leading tokens once (a 4D mask is passed through as it is)
        if getattr(model, "is_gradient_checkpointing", False) and torch.is_grad_enabled():
            if not shared_prefix_active(model):
                raise ValueError(
                    "shared_prefix with gradient checkpointing: the layers run their forward again in backward, so "
                    "hold mempo.lm.shared_prefix.shared_prefix_attention(model) across the backward too"
                )
        with shared_prefix_attention(model):
            packed = model.get_decoder()(
                input_ids=layout.input_ids, attention_mask=layout.mask, position_ids=layout.position_ids,
                use_cache=False,
            ).last_hidden_state  # fmt: skip
        hidden = unpack(packed, layout, n, t)

    # Hidden state at t-1 scores token t; only pairs of two real tokens count.
    scored = mask[:, 1:] & mask[:, :-1]  # [N, T-1]
    if score_mask is not None:
        scored = scored & score_mask[:, 1:].bool()
    rows = hidden[:, :-1][scored]  # [M, H]
    targets = input_ids[:, 1:][scored]  # [M]

    lp, ent = head_logprobs(
        head, rows, targets, chunk_size=chunk_size, temperature=temperature, with_entropy=with_entropy,
        grad_in_forward=head_grad_in_forward,
    )  # fmt: skip

    dtype = torch.promote_types(hidden.dtype, torch.float32)
    out_logp = hidden.new_zeros((n, t - 1), dtype=dtype).masked_scatter(scored, lp.to(dtype))
    out_logp = F.pad(out_logp, (1, 0))  # [N, T]: nothing scores position 0
    if not with_entropy:
        return out_logp, None
    out_ent = hidden.new_zeros((n, t - 1), dtype=dtype).masked_scatter(scored, ent.to(dtype))
    return out_logp, F.pad(out_ent, (1, 0))


def head_logprobs(
    head: torch.nn.Module,
    hidden: Tensor,
    targets: Tensor,
    *,
    chunk_size: int = 256,
    temperature: float = 1.0,
    with_entropy: bool = False,
    fused: bool = True,
    grad_in_forward: bool = False,
) -> tuple[Tensor, Tensor]:
    """hidden [M, H] (each row the state that predicts one token), targets [M] -> (logp [M], entropy [M]) float32
    (float64 for a float64 head); entropy is all zeros unless ``with_entropy``.

    The output head and the float32 log-softmax run over ``chunk_size`` rows at a time; under autograd each chunk
    is checkpointed, so forward and backward hold one [chunk_size, V] block of logits at a time, never [M, V].
    With ``fused`` (the default), log-probs alone of a plain ``nn.Linear`` head take ``LinearHeadLogProb``'s
    hand-written backward instead of the checkpoint's: fewer passes over the [C, V] logits (``python -m
    benchmarks.head_logprobs``), the same numbers bit for bit. It casts a trained head's weight as the ambient autocast
    does (once for all chunks with autocast's cache, once per chunk without it, as under Lightning), so the chunks'
    weight gradients add up in the same dtype as through the checkpoint (``tests/lm/test_logprobs.py`` covers both);
    its first version cast once always, and trained the main job's warm start to other weights. With it on, the main
    job's warm start is bit-identical to the checkpointed path's (2026-12-07, Zen 4 EPYC, bf16).
    ``grad_in_forward`` (a frozen head only, else a ValueError; log-probs alone): the fused path computes each chunk's
    d logp / d hidden in the forward, where the logits are at hand, and its backward only scales it by the incoming
    per-row gradient: two [C, H] x [H, V]-sized matmuls a chunk instead of three (no recompute). The log-probs are the
    same bit for bit; the hidden states' gradient is the same up to rounding (bf16 under autocast: the incoming
    gradient multiplies after the matmul's rounding instead of before).
    """

    def chunk_stats(h: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        logits = head(h)  # [C, V]
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        if temperature != 1.0:
            logits = logits / temperature
        logz = logits.logsumexp(-1)  # [C]
        logp = logits.gather(-1, y[:, None]).squeeze(-1) - logz  # [C]
        if not with_entropy:
            return logp, torch.zeros_like(logp)
        probs = (logits - logz[:, None]).exp()  # [C, V]
        return logp, logz - (probs * logits).sum(-1)  # H = log Z - E_p[logit]

    recompute = torch.is_grad_enabled() and (hidden.requires_grad or any(p.requires_grad for p in head.parameters()))
    fused = fused and recompute and not with_entropy and type(head) is torch.nn.Linear  # not LoRA- or FSDP-wrapped
    if grad_in_forward and any(p.requires_grad for p in head.parameters()):
        raise ValueError(
            "head_grad_in_forward needs a frozen output head (its weight takes no gradient); this head trains: "
            "set optim.head_grad_in_forward=false or freeze it (model.train_top_layers)"
        )
    grad_in_forward = grad_in_forward and fused and hidden.requires_grad
    device = hidden.device.type
    # Autocast with its cache (torch's default) casts the weight once for every chunk, so their gradients add up in
    # bf16 before the cast's backward; without it (Lightning's autocast: cache_enabled=False) each chunk casts its own
    # and the gradients add up in float32. The fused path casts as autocast would, so both stay bit for bit.
    once = fused and torch.is_autocast_cache_enabled()
    if once:
        weight, bias = autocast_params(head, device)
    shared = {"weight": None, "left": -(-hidden.shape[0] // chunk_size)}  # one cast for every chunk's backward
    logp_parts, ent_parts = [], []
    for start in range(0, hidden.shape[0], chunk_size):
        h, y = hidden[start : start + chunk_size], targets[start : start + chunk_size]
        if fused:
            if not once:
                weight, bias = autocast_params(head, device)
            lp = LinearHeadLogProb.apply(h, weight, bias, y, temperature, head, shared, grad_in_forward)
            logp_parts.append(lp)
            ent_parts.append(torch.zeros_like(lp))
            continue
        # Checkpointing keeps only h for backward and recomputes the [C, V] logits then, one chunk at a time.
        lp, ent = checkpoint(chunk_stats, h, y, use_reentrant=False) if recompute else chunk_stats(h, y)
        logp_parts.append(lp)
        ent_parts.append(ent)
    if not logp_parts:
        empty = hidden.new_zeros((0,), dtype=torch.promote_types(hidden.dtype, torch.float32))
        return empty, empty
    return torch.cat(logp_parts), torch.cat(ent_parts)


class LinearHeadLogProb(torch.autograd.Function):
    """log p(y | h) = x[y] - logsumexp(x), x = float32(head(h)) / T, for one chunk of rows of an ``nn.Linear`` head,
    keeping only h and logsumexp(x) for backward. The same arithmetic as autograd through a checkpointed
    ``chunk_stats``: the logits recomputed by ``head`` under the forward's autocast, then the backward of the gather,
    logsumexp, the temperature's division, the float32 cast and the linear, op for op in the same dtypes; without
    re-running the log-softmax's passes over the [C, V] logits or building a graph for them:
    d x = g * onehot(y) - g * exp(x - logsumexp(x)). ``weight`` and ``bias`` are the head's parameters as its matmul
    sees them (under autocast, ``autocast_params``: cast once for every chunk where autocast caches its casts, once
    per chunk where it does not, so the chunks' gradients add up in the dtype they would); they take the gradients
    and are not saved (backward casts the head's own again, as the checkpoint's recompute did: no [V, H] copy lives
    until backward).
    ``tests/lm/test_logprobs.py`` checks the log-probs and gradients equal the checkpointed path's bit for bit.
    ``grad_in_forward`` (a frozen head): forward also computes d logp / d h = (onehot(y) - softmax(x)) / T @ W from the
    logits it has and saves that [C, H] instead of h; backward multiplies it by g: no recompute, one matmul less."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx,
        h: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        y: Tensor,
        temperature: float,
        head: torch.nn.Linear,
        shared: dict[str, Any],
        grad_in_forward: bool = False,
    ) -> Tensor:
        device = h.device.type
        ctx.autocast = (device, torch.is_autocast_enabled(device), torch.get_autocast_dtype(device))
        ctx.head, ctx.temperature, ctx.shared = head, temperature, shared
        x = head(h)  # [C, V], under the caller's autocast; the head's hooks see the chunk
        x = x.to(torch.promote_types(x.dtype, torch.float32))
        if temperature != 1.0:
            x = x / temperature
        logz = x.logsumexp(-1)  # [C]
        logp = x.gather(-1, y[:, None]).squeeze(-1) - logz
        ctx.has_bias = bias is not None
        ctx.grad_in_forward, ctx.h_dtype = grad_in_forward, h.dtype
        if grad_in_forward:  # a frozen head: d logp / d h now, from the logits at hand; backward scales it per row
            dlogits = _logsumexp_and_gather_grad(x, logz, y, torch.ones_like(logz), temperature).to(weight.dtype)
            ctx.save_for_backward(dlogits.mm(weight.to(dlogits.dtype)))  # [C, H]: no [C, V] lives until backward
            return logp
        # Not the weight: its cast is made again in backward (as the checkpoint's recompute did), so no [V, H] copy
        # lives from forward to backward (the GPU memory plan counts none: tests/capacity/test_gpu_memory.py).
        ctx.save_for_backward(h, y, logz)
        return logp

    @staticmethod
    @once_differentiable  # no double backward (the recompute runs without a graph)
    def backward(ctx, g: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        if ctx.grad_in_forward:
            (dh_unit,) = ctx.saved_tensors  # d logp / d h of each row, [C, H]
            return (g[:, None] * dh_unit).to(ctx.h_dtype), None, None, None, None, None, None, None
        h, y, logz = ctx.saved_tensors
        device, autocast, dtype = ctx.autocast
        with torch.no_grad(), torch.autocast(device, dtype=dtype, enabled=autocast):
            logits = ctx.head(h)  # the checkpoint's recompute
        # x, then d x in place: a new tensor (the recompute's own, or its float32 copy)
        dx = logits.to(torch.promote_types(logits.dtype, torch.float32))
        if ctx.temperature != 1.0:
            dx = dx / ctx.temperature
        dlogits = _logsumexp_and_gather_grad(dx, logz, y, g, ctx.temperature).to(logits.dtype)  # the cast's backward
        shared = ctx.shared  # the chunks of one call cast the weight once in backward, freed after the last of them
        if shared["weight"] is None:
            shared["weight"] = ctx.head.weight.to(logits.dtype)
        shared["left"] -= 1
        h_c, w_c = h.to(logits.dtype), shared["weight"]  # the matmul's operands, as autocast cast them
        if shared["left"] == 0:
            shared["weight"] = None
        dh = dlogits.mm(w_c).to(h.dtype) if ctx.needs_input_grad[0] else None
        dw = dlogits.t().mm(h_c) if ctx.needs_input_grad[1] else None  # as autograd's mm_mat2_backward
        db = dlogits.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return dh, dw, db, None, None, None, None, None


def _logsumexp_and_gather_grad(x: Tensor, logz: Tensor, y: Tensor, g: Tensor, temperature: float) -> Tensor:
    """x [C, V] (float32 logits / temperature; overwritten) -> g * d(x[y] - logsumexp(x)) / d logits, in x's memory:
    the gather's and logsumexp's backward, then the temperature's division's (three passes over [C, V])."""
    x.sub_(logz[:, None]).exp_().mul_(g.neg()[:, None])  # logsumexp's backward, of d logz = -g
    x.scatter_add_(-1, y[:, None], g[:, None])  # plus the gather's backward
    if temperature != 1.0:
        x.div_(temperature)
    return x


def autocast_params(head: torch.nn.Linear, device: str) -> tuple[Tensor, Tensor | None]:
    """The head's weight and bias as its matmul sees them: cast to autocast's dtype where autocast is on (and they
    are floating point other than float64, the tensors autocast casts), else as they are."""
    if not torch.is_autocast_enabled(device):
        return head.weight, head.bias
    dtype = torch.get_autocast_dtype(device)

    def cast(t: Tensor | None) -> Tensor | None:
        return t.to(dtype) if t is not None and t.is_floating_point() and t.dtype != torch.float64 else t

    return cast(head.weight), cast(head.bias)
