"""FSDP2 (``fully_shard``) for the policy and the frozen reference, and the lock step sharded models need.

``shard_model`` shards every decoder layer, then the model itself (embeddings, final norm and a tied or untied output
head form the root unit). Under sharding every forward and backward is a collective: each data-parallel rank must
make the same calls in the same order, or the run hangs. The helpers here keep the ranks in step:

- ``token_logprobs`` (mempo.lm.logprobs) runs the decoder and then the output head over chunks of positions, outside
  the model's own ``forward``; ``shard_model`` registers that computation as an FSDP forward method, so the root
  unit's parameters are gathered around it as around ``forward``;
- ``lockstep_count`` gives every rank the largest local count (micro-batches, generate rows), so ranks with less
  work pad with calls on dummy inputs instead of leaving the others waiting;
- ``full_tensors`` streams a sharded state dict as full tensors, one at a time (every rank gathers the same tensor
  at the same time), for the weight push and the Hugging Face export.

Nothing here runs a collective unless the model is sharded (``is_sharded``), so single-process and DDP runs are
untouched.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from mempo.lm.logprobs import TOKEN_STATS_METHOD, local_token_stats, token_logprobs


def is_sharded(model: nn.Module) -> bool:
    """Whether ``model`` holds FSDP2-sharded parameters (DTensors)."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks of a Hugging Face causal LM (``model.model.layers`` for Llama, Qwen2, SmolLM2)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model
    layers = getattr(decoder, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__}: no decoder layers found to shard (expected get_decoder().layers)")
    return list(layers)


def shard_model(
    model: nn.Module,
    mesh: Any,
    *,
    compute_dtype: torch.dtype | None = None,
) -> nn.Module:
    """``fully_shard`` each decoder layer, then ``model``, over the 1-D data-parallel ``mesh``; in place.

    compute_dtype: gather parameters in this dtype for forward and backward (bf16 on GPUs), while the sharded master
    weights, their gradients and AdamW's moments stay in the parameters' own dtype (fp32) and gradients are reduced
    in fp32; None computes in the parameters' dtype (CPU tests, which compare with DDP in fp32).
    A LoRA policy whose adapters' dtype differs from its frozen base's (peft keeps adapters in fp32 over a bf16 base)
    shards each adapter linear as its own unit first: FSDP2 wants one original dtype per unit.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

    kwargs: dict[str, Any] = {"mesh": mesh}
    if compute_dtype is not None:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    for layer in decoder_layers(model):
        for unit in _adapter_units(layer):
            fully_shard(unit, **kwargs)
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    setattr(model, TOKEN_STATS_METHOD, lambda *args, **kw: local_token_stats(model, *args, **kw))
    register_fsdp_forward_method(model, TOKEN_STATS_METHOD)
    return model


def _adapter_units(layer: nn.Module) -> list[nn.Module]:
    """The LoRA A and B linears of ``layer`` when its parameters mix dtypes, else none."""
    if len({p.dtype for p in layer.parameters()}) < 2:
        return []
    return [m for n, m in layer.named_modules() if isinstance(m, nn.Linear) and (".lora_A." in n or ".lora_B." in n)]


def lockstep_count(n: int, model: nn.Module) -> int:
    """The largest ``n`` over the ranks when ``model`` is sharded (a collective every rank must call), else ``n``."""
    if not (dist.is_available() and dist.is_initialized() and is_sharded(model)):
        return n
    t = torch.tensor([n], dtype=torch.long, device=_collective_device(model))
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def any_rank(flag: bool, model: nn.Module) -> bool:
    """Whether ``flag`` holds on any rank when ``model`` is sharded (a collective), else ``flag``."""
    return lockstep_count(int(flag), model) > 0


def idle_forward(model: nn.Module) -> torch.Tensor:
    """A forward on a two-token dummy row (a rank with fewer micro-batches than another takes part in its
    collectives this way) -> its summed log-prob; under autograd, ``(0 * result).backward()`` takes part in the
    gradient reduction with an all-zero contribution."""
    ids = torch.zeros((1, 2), dtype=torch.long, device=next(model.parameters()).device)
    return token_logprobs(model, ids, torch.ones_like(ids)).sum()


def idle_forwards(n: int, model: nn.Module) -> None:
    """``n`` no-grad idle forwards: a rank's share of the busiest rank's extra micro-batches. Agree on ``n`` with
    ``lockstep_count`` before the first real forward (collectives must come in the same order on every rank)."""
    for _ in range(n):
        with torch.no_grad():
            idle_forward(model)


def full_tensors(state: dict[str, torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) for each entry of a (possibly sharded) state dict, gathered one at a time: the caller
    holds one full tensor beyond the shards while it uses it, never a second copy of the model. Every rank must
    consume the iterator to the end (each gather is a collective)."""
    from torch.distributed.tensor import DTensor

    for name, value in state.items():
        value = value.detach()
        yield name, value.full_tensor() if isinstance(value, DTensor) else value


def scalar(x: torch.Tensor) -> float:
    """A plain float of a (possibly DTensor) scalar, e.g. ``clip_grad_norm_``'s total norm under FSDP2; every rank
    gets the same value."""
    from torch.distributed.tensor import DTensor

    return float(x.full_tensor() if isinstance(x, DTensor) else x)


def _collective_device(model: nn.Module) -> torch.device:
    backend = dist.get_backend()
    return next(model.parameters()).device if backend == "nccl" else torch.device("cpu")
