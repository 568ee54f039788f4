"""Data-parallel plumbing shared by the RL and SFT modules: FSDP2 in ``configure_model`` under Lightning's
``ModelParallelStrategy`` (``trainer=fsdp``), and gathering per-rank objects for checkpoints."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.strategies import ModelParallelStrategy

from mempo.lm.sharding import is_sharded, shard_model


def shard_for_strategy(module: L.LightningModule, models: list[torch.nn.Module | None]) -> None:
    """``configure_model`` of both stages: under ``ModelParallelStrategy`` (a device mesh is set), FSDP2 over its
    data-parallel dimension for each model given (None: absent); a no-op under every other strategy and once done."""
    mesh = module.device_mesh
    if mesh is None:
        return
    dp = mesh["data_parallel"] if mesh.mesh_dim_names and "data_parallel" in mesh.mesh_dim_names else mesh
    if mesh.size() != dp.size():
        raise ValueError("trainer=fsdp shards over data-parallel ranks only: tensor_parallel_size must be 1")
    compute = torch.bfloat16 if mesh.device_type == "cuda" else None  # CPU: fp32 throughout (tests compare to DDP)
    for model in models:
        if model is not None and not is_sharded(model):
            shard_model(model, dp, compute_dtype=compute)


def gather_objects(obj: Any) -> list[Any]:
    """[obj of rank 0, obj of rank 1, ...] (``all_gather_object``) in a process group, else [obj]."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


class FSDP2Strategy(ModelParallelStrategy):
    """``trainer.strategy=fsdp2``: Lightning's ``ModelParallelStrategy`` with data-parallel sharding only (every
    rank of every node in one FSDP2 dimension, tensor parallelism 1); modules shard themselves in
    ``configure_model`` (``shard_for_strategy``). Lightning calls ``training_step`` directly under it, so manual
    optimization (a backward inside the step) works, unlike its FSDP1 strategy. Runs on GPUs (NCCL) and, for tests,
    on CPU processes (gloo)."""

    def setup_environment(self) -> None:
        self._data_parallel_size = self.num_nodes * self.num_processes
        self._tensor_parallel_size = 1
        super().setup_environment()


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
    """The full (unsharded) state dict of a sharded model on rank 0's CPU, gathered by every rank (a collective;
    other ranks get an empty dict); None for a model that is not sharded (its own ``state_dict`` is full)."""
    if not is_sharded(model):
        return None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
