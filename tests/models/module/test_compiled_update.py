"""``optim.compile_update``: the update's decoder layers run compiled, every other forward eager. Compiled kernels
round differently from eager ones, so the switch needs recomputed old log-probs (then from the same compiled forward:
the first epoch's ratio is exactly 1) and one update moves the weights as the eager update does, to float32
rounding: the same loss, gradient norm and engine gap."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
from torch._dynamo.utils import counters

from mempo.stages.train import fit_rl

RUN = [
    "model=tiny", "data.batch_size=2", "data.group_size=2", "agent.max_turns=2", "sampler.max_new_tokens=12",
    "advantage.estimator=test_signed", "optim.lr=1e-3", "optim.micro_batch_size=3", "trainer.max_steps=1",
    "ckpt.every_n_steps=5", "eval.every_n_steps=0", "sampler=hf", "optim.old_logp=recompute",
]  # fmt: skip


def rows(run_dir: Path) -> list[dict[str, str]]:
    return list(csv.DictReader((run_dir / "metrics.csv").open()))


def test_a_compiled_update_moves_the_weights_as_the_eager_one(make_cfg, tmp_path: Path) -> None:
    """One float32 step from the same rollouts (the HF sampler runs the policy eagerly before the update)."""
    figures = {}
    for compiled in ("false", "true"):
        counters.clear()
        run_dir = f"run_dir={tmp_path / compiled}"
        cfg = make_cfg(*RUN, "trainer.precision=32-true", f"optim.compile_update={compiled}", run_dir)
        module, _ = fit_rl(cfg)
        # The compiled layers ran in the update (dynamo captured their frames) and only there: eager afterwards.
        assert (counters["stats"]["calls_captured"] > 0) is (compiled == "true")
        layers = module.policy.get_decoder().layers
        assert all(layer._compiled_call_impl is None for layer in layers)
        (figures[compiled],) = rows(tmp_path / compiled)
        assert figures[compiled]["train/no_signal"] == "0.0"
    # Not the weights: AdamW's first step is g / (|g| + eps), so a gradient entry near eps moves by up to lr on a
    # rounding difference. The loss and the whole gradient's norm carry the comparison; fused kernels sum in another
    # order, float32 rounding (about 1e-6 relative), hence rtol 1e-4. The loss at ratio 1 is -sum(w A), about 0 by
    # the advantages' centring: compared absolutely.
    for key, atol in (("train/loss", 1e-5), ("train/grad_norm", 1e-7)):
        got, want = float(figures["true"][key]), float(figures["false"][key])
        torch.testing.assert_close(got, want, rtol=1e-4, atol=atol, msg=f"{key}: {got} against {want}")
    assert float(figures["false"]["train/grad_norm"]) > 0
    # The engine gap is the eager sampler's log-probs against the update's: float32 rounding either way.
    assert 0 < float(figures["true"]["rollout/engine_logp_gap"]) < 1e-4


def test_a_compiled_update_takes_its_old_logprobs_from_its_own_forward(make_cfg, tmp_path: Path) -> None:
    fit_rl(make_cfg(*RUN, "trainer.precision=bf16-mixed", "optim.compile_update=true", f"run_dir={tmp_path}"))
    (step,) = rows(tmp_path)
    assert float(step["train/first_epoch_ratio_dev"]) == 0.0  # exactly: old and new are the same compiled forward
    assert float(step["rollout/engine_logp_gap"]) > 0  # the eager float32 sampler is not that forward


def test_compile_update_refuses_the_engines_logprobs_as_old_ones(make_cfg) -> None:
    from mempo.stages.builders import build_module

    with pytest.raises(ValueError, match="compile_update"):
        build_module(make_cfg("model=tiny", "sampler=hf", "optim.old_logp=sampler", "optim.compile_update=true"))


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (("optim.old_logp=sampler",), False),  # a float32 engine's log-probs are the old ones: nothing to compile
        (("optim.old_logp=auto",), False),  # the HF sampler runs the float32 policy itself: auto = sampler
        (("optim.old_logp=recompute",), True),
        (("optim.old_logp=recompute", "trainer.strategy=fsdp2"), False),  # refused when sharded, so auto is off
    ],
)
def test_compile_update_auto_follows_the_recomputed_old_logprobs(make_cfg, overrides, expected) -> None:
    from mempo.stages.builders import build_optim_config

    optim = build_optim_config(make_cfg("model=tiny", "sampler=hf", "optim.compile_update=auto", *overrides))
    assert optim.compile_update is expected
