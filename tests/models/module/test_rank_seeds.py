"""Data-parallel ranks sample with seeds of their own (``rollout_seed``): rank 0 keeps the one-process seed, other
ranks draw different rollouts of the same task, and a rank samples after a resume what it sampled before."""

from __future__ import annotations

from types import SimpleNamespace

from mempo.models.module import SEED_BAND_STEPS, STEP_SEED_STRIDE, rollout_seed
from mempo.rollout.hf_sampler import HFSampler
from mempo.stages.builders import build_module, build_tasks

SMOKE = ["model=tiny", "sampler=hf", "data.group_size=2", "agent.max_turns=1", "sampler.max_new_tokens=12"]


def test_rank_zero_keeps_the_one_process_seed_and_ranks_never_share_one() -> None:
    assert rollout_seed(5, 3, 0) == 5 + 1_000_003 * 3  # the formula before ranks had seeds: one process unchanged
    assert rollout_seed(None, 3, 1) is None
    within = 7919 * 15 + 1023 * 16  # the largest turn + prompt offset of a step: 16 turns, 1024 prompts x G=16
    assert within < STEP_SEED_STRIDE
    # Rank r's seeds over SEED_BAND_STEPS steps lie strictly between rank r-1's and rank r+1's ...
    for r in range(8):
        assert rollout_seed(0, SEED_BAND_STEPS - 1, r) + within < rollout_seed(0, 0, r + 1)
    # ... and 8 ranks' seeds stay below 2^32, where torch's CPU generator cuts a seed (it keeps the low 32 bits).
    assert rollout_seed(0, SEED_BAND_STEPS - 1, 7) + within < 2**32


def _rollout_tokens(module, task, *, rank: int, step: int) -> list[list[int]]:
    module._trainer = SimpleNamespace(global_rank=rank)  # what LightningModule.global_rank reads
    module.batches_done = step
    batch = module.rollout([task])
    return [list(s.response_ids) for s in batch.samples]


def test_two_ranks_sample_the_same_task_differently_and_a_resumed_rank_repeats_itself(make_cfg, tmp_path) -> None:
    cfg = make_cfg(*SMOKE, f"run_dir={tmp_path}")
    module, _ = build_module(cfg)
    module.sampler = HFSampler(module.policy, module.tokenizer)
    task = build_tasks(cfg, "train")[0]
    rank0, rank1 = (_rollout_tokens(module, task, rank=r, step=4) for r in (0, 1))
    assert rank0 != rank1
    # A fresh module (as after a restart) restored to step 4 (on_load_checkpoint) samples as rank 1 did before.
    fresh, _ = build_module(cfg)
    fresh.sampler = HFSampler(fresh.policy, fresh.tokenizer)
    fresh.on_load_checkpoint({"mempo": {"batches_done": 4}})
    assert _rollout_tokens(fresh, task, rank=1, step=fresh.batches_done) == rank1
    assert _rollout_tokens(fresh, task, rank=0, step=4) == rank0
