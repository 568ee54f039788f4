"""One rank of a two-process gloo group in which the ranks have unequal work over an FSDP2-sharded tiny model: run by
tests/models/parallel/test_fsdp.py as

    RANK=r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=p python tests/support/lockstep_probe.py MODEL_DIR OUT_DIR

Rank 0 has five sequences to score, three prompts to generate for and two tasks to play; rank 1 one sequence, one
prompt, nothing to score by answer and no task. Without the lock step (padded micro-batches, padded generate rows
with ``synced_gpus``, the agent loop turning until every rank is done) rank 1 would leave rank 0 waiting in a
collective forever. Each rank also checks the sharded results against an unsharded copy of the same weights and writes
``OUT_DIR/rank<r>.txt`` with ``ok`` once every part has finished.
"""

from __future__ import annotations

import faulthandler
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from mempo.core.tasks import Question, Task
from mempo.lm.loading import load_policy
from mempo.lm.scoring import answer_probabilities, sequence_logprobs
from mempo.lm.sharding import is_sharded, shard_model
from mempo.rollout.agent import AgentConfig, collect
from mempo.rollout.hf_sampler import HFSampler
from mempo.rollout.prompts import PromptBuilder
from mempo.rollout.sampler import SamplingConfig


class NoSearch:
    """An environment whose searches return a fixed passage (the random tiny model rarely searches anyway)."""

    def search(self, queries: list[str]) -> list[str]:
        return ["Doc 1: nothing here." for _ in queries]


def main(model_dir: str, out_dir: Path) -> None:
    rank = int(os.environ["RANK"])
    faulthandler.dump_traceback_later(int(os.environ.get("PROBE_HANG_S", "240")), exit=True)  # a hang shows where
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    sharded, tokenizer = load_policy(model_dir, dtype="float32")
    plain, _ = load_policy(model_dir, dtype="float32")
    shard_model(sharded, init_device_mesh("cpu", (2,)))
    assert is_sharded(sharded) and not is_sharded(plain)

    # Scoring: 3 micro-batches of 2 on rank 0, 1 on rank 1.
    n = 5 if rank == 0 else 1
    g = torch.Generator().manual_seed(rank)
    ids = torch.randint(0, 1000, (n, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[0, 9:] = 0
    got = sequence_logprobs(sharded, ids, mask, micro_batch_size=2)
    torch.testing.assert_close(got, sequence_logprobs(plain, ids, mask, micro_batch_size=2))
    prompts = [list(r[:8]) for r in ids.tolist()][: (4 if rank == 0 else 0)]  # rank 1 scores nothing at all
    answers = [list(r[8:]) for r in ids.tolist()][: len(prompts)]
    got_p = answer_probabilities(sharded, prompts, answers, pad_id=0, micro_batch_size=1)
    torch.testing.assert_close(got_p, answer_probabilities(plain, prompts, answers, pad_id=0, micro_batch_size=1))

    # Generation: 3 prompts against 1, greedy, each stopping at its own length.
    engine, reference = HFSampler(sharded, tokenizer), HFSampler(plain, tokenizer)
    params = SamplingConfig(max_new_tokens=16, temperature=0.0, stop=("</mem>",))
    gen_prompts = [list(r[: 4 + i]) for i, r in enumerate(ids.tolist()[: (3 if rank == 0 else 1)])]
    got_g = engine.generate(gen_prompts, params)
    want_g = reference.generate(gen_prompts, params)
    assert len(got_g) == len(gen_prompts)
    for a, b in zip(got_g, want_g):
        assert a[0].token_ids == b[0].token_ids
        torch.testing.assert_close(torch.tensor(a[0].logprobs), torch.tensor(b[0].logprobs))

    # The agent loop: 2 tasks x 2 rollouts against none (rank 1 must still take part in every turn's generate).
    questions = [(Question(f"Who founded company {i}?", ("Ann",)),) for i in range(2 if rank == 0 else 0)]
    tasks = [Task(f"t{rank}-{i}", q) for i, q in enumerate(questions)]
    batch = collect(
        engine,
        NoSearch(),
        tasks,
        2,
        PromptBuilder(tokenizer),
        AgentConfig(max_turns=3),
        sampling=SamplingConfig(max_new_tokens=24, temperature=1.0, seed=rank),
    )
    assert len(batch.trajectories) == 2 * len(tasks)
    dist.barrier()
    (out_dir / f"rank{rank}.txt").write_text("ok\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
