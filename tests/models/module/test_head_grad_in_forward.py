"""``optim.head_grad_in_forward``: the update's forward computes a frozen head's gradient with respect to the hidden
states, so backward runs no recompute of the logits. The same objective: one step from the same rollouts moves the
weights as the recomputing update does, to the rounding of the update's precision."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from mempo.lm import logprobs
from mempo.stages.train import fit_rl

RUN = [
    "model=tiny", "data.batch_size=2", "data.group_size=3", "agent.max_turns=2", "sampler.max_new_tokens=12",
    "advantage.estimator=test_signed", "optim.lr=1e-3", "optim.micro_batch_size=3", "trainer.max_steps=1",
    "ckpt.every_n_steps=5", "eval.every_n_steps=0", "sampler=hf", "optim.old_logp=recompute",
    "model.train_top_layers=1",
]  # fmt: skip


def step_row(run_dir: Path) -> dict[str, str]:
    (row,) = list(csv.DictReader((run_dir / "metrics.csv").open()))
    return row


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_the_gradient_in_forward_is_the_recomputing_update_s(make_cfg, tmp_path: Path, monkeypatch, precision) -> None:
    """The gradient the optimizer steps on, per trained parameter. Not the weights after the step: AdamW's first step
    is lr * sign(gradient) per weight, so a rounding that flips the sign of a near-zero entry moves that weight by
    2 * lr whatever the tolerance (seen: 0.3% of one bf16 matrix's weights at 2e-3)."""
    in_forward = []  # each chunk's grad_in_forward flag, as the update's forward passed it
    real_apply = logprobs.LinearHeadLogProb.apply
    real_clip = torch.nn.utils.clip_grad_norm_
    grads: dict[str, dict[str, torch.Tensor]] = {}

    def counted(*args):
        in_forward.append(args[-1])
        return real_apply(*args)

    def recorded(params, *args, **kwargs):  # the update clips the accumulated gradient just before AdamW's step
        params = list(params)
        grads[on] = {str(i): p.grad.detach().clone() for i, p in enumerate(params) if p.grad is not None}
        return real_clip(params, *args, **kwargs)

    monkeypatch.setattr(logprobs.LinearHeadLogProb, "apply", counted)
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", recorded)
    rows = {}
    for on in ("false", "true"):
        in_forward.clear()
        run_dir = tmp_path / on
        cfg = make_cfg(*RUN, f"trainer.precision={precision}", f"optim.head_grad_in_forward={on}", f"run_dir={run_dir}")
        fit_rl(cfg)
        rows[on] = step_row(run_dir)
        assert rows[on]["train/no_signal"] == "0.0"
        assert in_forward and all(f is (on == "true") for f in in_forward)  # the update's chunks took the switch
    assert grads["true"].keys() == grads["false"].keys() and grads["true"]
    for name, base in grads["false"].items():
        assert base.abs().max() > 0
        if precision == "bf16-mixed":  # the head's gradient rounded to bf16 (8-bit mantissa) in another order, and
            # that rounding carried through the trained layers' backward: relative to the gradient's scale
            tol = {"rtol": 1.6e-2, "atol": 1.6e-2 * float(base.abs().max())}
        else:  # float32: the per-row weight multiplies after the head's matmul instead of before
            tol = {"rtol": 1e-4, "atol": 1e-5 * float(base.abs().max())}
        torch.testing.assert_close(grads["true"][name], base, msg=name, **tol)
    assert float(rows["true"]["train/first_epoch_ratio_dev"]) == 0.0  # old log-probs: the same forward's own
    for key in ("train/loss", "train/grad_norm"):
        torch.testing.assert_close(float(rows["true"][key]), float(rows["false"][key]), rtol=1e-2, atol=1e-6, msg=key)


def test_the_gradient_in_forward_is_refused_where_the_head_trains(make_cfg, tmp_path: Path) -> None:
    cfg = make_cfg(*RUN, "model.train_top_layers=null", "optim.head_grad_in_forward=true", f"run_dir={tmp_path}")
    with pytest.raises(ValueError, match="head_grad_in_forward needs a frozen output head"):
        fit_rl(cfg)
