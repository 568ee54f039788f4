"""``data.dynamic_sampling`` (DAPO's dynamic sampling, off by default): groups without signal are dropped and extra
tasks from a deterministic stream keyed by (seed, step, round, rank) are rolled out until the step has its number of
groups with signal. The tiny model's rewards are all 0, so a test estimator decides which groups have signal."""

from __future__ import annotations

import random

import torch
from torch.testing import assert_close

from mempo.data.datamodule import RedrawStream, TaskStream
from mempo.losses import AdvantageConfig, AdvantageInputs, MemoryConfig, register_advantage
from mempo.stages.builders import build_tasks
from mempo.stages.train import fit_rl


@register_advantage("test_even_groups", needs_memory_scores=False)
def _even_groups(x: AdvantageInputs, memory: MemoryConfig, advantage: AdvantageConfig) -> torch.Tensor:
    """+1 / -1 (alternating trajectories) on the response tokens of the groups with an even id in the batch it is
    given, 0 on the odd ones: a batch of 2 tasks holds one group with signal and one without."""
    even = (x.group_ids % 2 == 0).float()
    sign = torch.where(x.traj_ids % 2 == 0, 1.0, -1.0)
    return (even * sign)[:, None] * x.response_mask.float()


RUN = [
    "model=tiny", "sampler=hf", "data.batch_size=2", "data.group_size=2", "agent.max_turns=1",
    "sampler.max_new_tokens=8", "advantage.estimator=test_even_groups", "optim.lr=1e-3", "loss.kl_coef=0",
    "trainer.precision=32-true", "ckpt.every_n_steps=1", "eval.every_n_steps=0", "data.dynamic_sampling=true",
]  # fmt: skip


def test_the_redraw_stream_is_a_pure_function_of_seed_step_round_and_rank() -> None:
    pool = [f"t{i}" for i in range(10)]
    stream = RedrawStream(pool, seed=5)  # type: ignore[arg-type]
    assert stream(3, 1, 0, 4) == RedrawStream(pool, seed=5)(3, 1, 0, 4)  # a resumed run redraws the same tasks
    want = [pool[i] for i in random.Random("redraw/5/3/1/0").sample(range(10), 4)]
    assert stream(3, 1, 0, 4) == want
    draws = {tuple(stream(3, r, k, 4)) for r in (1, 2) for k in (0, 1)} | {tuple(stream(4, 1, 0, 4))}
    assert len(draws) == 5  # another round, rank or step draws other tasks
    assert len(stream(0, 1, 0, 25)) == 25  # past the pool's size: with replacement


def test_a_group_without_signal_is_replaced_by_a_redrawn_one(make_cfg, tmp_path) -> None:
    """Step 1's batch holds one group with signal (id 0) and one without (id 1): round 1 rolls out one redrawn task,
    whose group (id 0 in its round) has signal, and the update trains on both groups with signal."""
    cfg = make_cfg(*RUN, "trainer.max_steps=1", f"run_dir={tmp_path}")
    module, _ = fit_rl(cfg)
    m = module.last_metrics
    assert (m["rollout/redraw_rounds"], m["rollout/redrawn_tasks"], m["rollout/signal_groups"]) == (1.0, 1.0, 2.0)
    assert_close(m["rollout/drawn_zero_adv_groups"], 1 / 3)  # 3 groups rolled out, 1 dropped
    # The redrawn group keeps the advantages it was judged on (renumbered, it is group 1 of the merged batch, which
    # the estimator would zero if they were recomputed): every trained turn sample has signal.
    assert m["train/rows_updated"] == m["perf/samples"] == 4.0  # 2 groups x G=2 x 1 turn
    train = build_tasks(cfg, "train")
    first = TaskStream(train, 2, seed=cfg.seed).batch(0)[0]
    assert module.last_task_ids == [first.task_id, RedrawStream(train, seed=cfg.seed)(0, 1, 0, 1)[0].task_id]


def test_dynamic_sampling_is_off_by_default(make_cfg, tmp_path) -> None:
    module, _ = fit_rl(make_cfg(*RUN[:-1], "trainer.max_steps=1", f"run_dir={tmp_path}"))
    assert "rollout/redraw_rounds" not in module.last_metrics
    assert module.last_metrics["train/rows_updated"] == 2.0  # the odd group is not replaced


def test_a_resumed_run_redraws_exactly_what_an_uninterrupted_one_did(make_cfg, tmp_path) -> None:
    """3 straight steps against 2, a resume, 1 more: every step redraws (round 1), so step 3's redrawn tasks, its
    rollouts and the weights after it match only if the stream is keyed by the step and not by the process's state."""
    straight, _ = fit_rl(make_cfg(*RUN, "trainer.max_steps=3", f"run_dir={tmp_path / 'straight'}"))
    fit_rl(make_cfg(*RUN, "trainer.max_steps=2", f"run_dir={tmp_path / 'split'}"))
    resumed, _ = fit_rl(make_cfg(*RUN, "trainer.max_steps=3", "resume=true", f"run_dir={tmp_path / 'split'}"))
    assert resumed.last_metrics["rollout/redraw_rounds"] == 1.0
    assert resumed.last_task_ids == straight.last_task_ids
    for k, v in straight.policy.state_dict().items():
        torch.testing.assert_close(resumed.policy.state_dict()[k], v, rtol=0, atol=0, msg=k)  # float32, one process
