"""A 2-step data-parallel fit on two CPU processes (gloo) that writes, per rank and step, the tasks the rank drew
and a hash of its policy weights to ``<run_dir>/probe-rank<r>.jsonl``. Run by tests/models/test_module_slow.py:

    python tests/ddp_probe.py RUN_DIR

Lightning starts rank 1 by re-running this script, so the signed test estimator is registered here (conftest's is
not loaded in a subprocess): a nonzero gradient whatever the rewards, so equal weights mean synchronized updates.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import lightning as L
import torch

from mempo.losses import AdvantageConfig, AdvantageInputs, MemoryConfig, register_advantage
from mempo.stages.config import compose_config
from mempo.stages.train import fit_rl


@register_advantage("probe_signed", needs_memory_scores=True)  # memories scored, as for MemPO
def _signed(x: AdvantageInputs, memory: MemoryConfig, advantage: AdvantageConfig) -> torch.Tensor:
    sign = 1.0 - 2.0 * (x.traj_ids % 2).float()  # [N]
    return sign[:, None] * x.response_mask.float()


class Probe(L.Callback):
    def __init__(self, out: Path) -> None:
        self.out = out

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, idx: int) -> None:
        digest = hashlib.sha256()
        for _, v in sorted(pl_module.policy.state_dict().items()):
            digest.update(v.detach().cpu().contiguous().numpy().tobytes())
        row = {"step": pl_module.batches_done, "tasks": pl_module.last_task_ids, "weights": digest.hexdigest()}
        with (self.out / f"probe-rank{trainer.global_rank}.jsonl").open("a") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    run_dir = Path(sys.argv[1])
    cfg = compose_config(
        "+exp=ablation_nomem", "+debug=default", "trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2",
        "trainer.precision=32-true", "agent.max_turns=1", "sampler.max_new_tokens=8", "optim.lr=1e-3",
        "advantage.estimator=probe_signed", "eval.every_n_steps=0", f"run_dir={run_dir}",
    )  # fmt: skip
    fit_rl(cfg, callbacks=[Probe(run_dir)])
