"""``optim.skip_zero_adv_rows``: turn samples whose advantage is 0 on every response token are left out of the update
(no KL term). They add exactly 0 to the gradient and the loss normaliser stays the full batch's, so the weights after
two steps are bit-identical with the skip on and off (float32), while the update computes fewer rows."""

from __future__ import annotations

import torch

from mempo.losses import AdvantageConfig, AdvantageInputs, MemoryConfig, register_advantage
from mempo.stages.builders import build_module
from mempo.stages.train import fit_rl


@register_advantage("test_half_zero", needs_memory_scores=False)
def _half_zero(x: AdvantageInputs, memory: MemoryConfig, advantage: AdvantageConfig) -> torch.Tensor:
    """+1 / -1 on the response tokens of trajectories 0 and 1 of every 4, 0 on trajectories 2 and 3: a batch holding
    rows with and without signal whatever the (random, all-0) rewards."""
    kind = x.traj_ids % 4
    sign = torch.where(kind == 0, 1.0, torch.where(kind == 1, -1.0, 0.0))
    return sign[:, None] * x.response_mask.float()


RUN = [
    "model=tiny", "sampler=hf", "data.batch_size=2", "data.group_size=4", "agent.max_turns=2",
    "sampler.max_new_tokens=12", "advantage.estimator=test_half_zero", "optim.lr=1e-3", "optim.micro_batch_size=3",
    "trainer.precision=32-true", "trainer.max_steps=2", "ckpt.every_n_steps=5", "eval.every_n_steps=0",
]  # fmt: skip


def _fit(make_cfg, run_dir, *extra: str):
    module, _ = fit_rl(make_cfg(*RUN, *extra, f"run_dir={run_dir}"))
    return module, {k: v.detach().clone() for k, v in module.policy.state_dict().items()}


def test_weights_after_two_steps_are_bit_identical_with_the_skip_on_and_off(make_cfg, tmp_path) -> None:
    for old_logp in ("sampler", "recompute"):
        on, w_on = _fit(make_cfg, tmp_path / f"on-{old_logp}", f"optim.old_logp={old_logp}")
        off, w_off = _fit(make_cfg, tmp_path / f"off-{old_logp}", f"optim.old_logp={old_logp}",
                          "optim.skip_zero_adv_rows=false")  # fmt: skip
        rows_on, rows_off = on.last_metrics["train/rows_updated"], off.last_metrics["train/rows_updated"]
        assert 0 < rows_on < rows_off == on.last_metrics["perf/samples"]  # both kinds of rows; fewer computed
        # AdamW's update barely sees a gradient's scale (and clipping removes it), so the loss and the gradient norm
        # before clipping are compared too: a normaliser recomputed on the kept rows alone would double both here.
        for key in ("train/loss", "train/grad_norm"):
            assert on.last_metrics[key] == off.last_metrics[key], key
        for name, want in w_off.items():
            torch.testing.assert_close(w_on[name], want, rtol=0, atol=0, msg=name)
    start = build_module(make_cfg(*RUN, f"run_dir={tmp_path / 'start'}"))[0].policy.state_dict()
    assert any(not torch.equal(start[k], w_on[k]) for k in w_on)  # and the two steps moved the weights
