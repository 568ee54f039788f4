"""A two-process CPU fit (gloo, the tiny model, the HF sampler) in which one rank raises in its rollout of step 2,
after step 1's collectives: tests/models/parallel/test_failing_rank.py checks that every process exits. Run as

    python tests/support/failing_rank_probe.py RUN_DIR ddp|fsdp FAIL_RANK

The failing rank writes ``RUN_DIR/raised-rank<r>.txt`` (the wall-clock time of the raise) just before raising.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from mempo.models.module import MemPOModule
from mempo.stages.config import compose_config
from mempo.stages.train import fit_rl

if __name__ == "__main__":
    run_dir, strategy, fail_rank = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    rollout = MemPOModule.rollout

    def failing_rollout(self: MemPOModule, tasks: list) -> object:
        if self.global_rank == fail_rank and self.batches_done == 1:
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / f"raised-rank{fail_rank}.txt").write_text(f"{time.time()}\n")
            raise RuntimeError(f"planted failure in rank {fail_rank}'s rollout (pid {os.getpid()})")
        return rollout(self, tasks)

    MemPOModule.rollout = failing_rollout
    cfg = compose_config(
        "+exp=ablation_nomem", "+debug=default", f"trainer={strategy}", "trainer.accelerator=cpu",
        "trainer.devices=2", "trainer.precision=32-true", "agent.max_turns=1", "sampler.max_new_tokens=8",
        "data.batch_size=2", "trainer.max_steps=3", "eval.every_n_steps=0", "ckpt.every_n_steps=5",
        f"run_dir={run_dir}",
    )  # fmt: skip
    fit_rl(cfg)
