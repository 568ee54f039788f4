"""The run-time weight canary of ``SamplerCallback``: a push that silently does not land stops the run with an
error naming the step; a push that lands passes and its cost is logged as ``perf/canary_s``.

The engine here is ``HFSampler`` over its own copy of the policy (as a vLLM engine holds its own copy), so a push
really has to copy weights; the failing case drops them the way a push that silently did not land does.
"""

from __future__ import annotations

import copy
import csv
from collections.abc import Mapping

import pytest
import torch

from mempo.models.callbacks import WeightCanaryError
from mempo.rollout.hf_sampler import HFSampler
from mempo.stages.train import fit_rl

RUN = [
    "model=tiny", "sampler=hf", "data.batch_size=1", "data.group_size=2", "agent.max_turns=1",
    "sampler.max_new_tokens=8", "advantage.estimator=test_signed", "loss.kl_coef=0", "optim.lr=1e-3",
    "ckpt.every_n_steps=5",
]  # fmt: skip


class DroppedPush(HFSampler):
    """An engine whose weight push reads the streamed tensors and loads none of them."""

    def push_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        for _ in state_dict:
            pass


def own_copy(cls: type[HFSampler]):
    return lambda mod: cls(copy.deepcopy(mod.policy), mod.tokenizer, logprobs="tempered")  # the run's sampler.logprobs


def test_a_push_that_does_not_land_stops_the_run_naming_the_step(make_cfg, tmp_path):
    cfg = make_cfg(*RUN, "trainer.max_steps=3", f"run_dir={tmp_path}")
    with pytest.raises(WeightCanaryError, match="weight push of step 1:"):
        fit_rl(cfg, make_sampler=own_copy(DroppedPush))


def test_a_push_that_lands_passes_and_logs_its_cost(make_cfg, tmp_path):
    cfg = make_cfg(*RUN, "trainer.max_steps=2", f"run_dir={tmp_path}")
    module, _ = fit_rl(cfg, make_sampler=own_copy(HFSampler))
    rows = list(csv.DictReader((tmp_path / "metrics.csv").open()))
    assert [int(r["step"]) for r in rows] == [1, 2]
    for r in rows:
        assert 0 < float(r["perf/canary_s"]) < 30
        assert float(r["train/canary_logp_diff"]) <= 1e-5  # the same fp32 weights on both sides


def test_canary_every_k_pushes_and_off(make_cfg, tmp_path):
    # Every 2nd push: the dropped push of step 1 goes unchecked, the one of step 2 is caught.
    every2 = make_cfg(*RUN, "trainer.max_steps=3", "sampler.canary_every=2", f"run_dir={tmp_path / 'a'}")
    with pytest.raises(WeightCanaryError, match="weight push of step 2:"):
        fit_rl(every2, make_sampler=own_copy(DroppedPush))
    off = make_cfg(*RUN, "trainer.max_steps=1", "sampler.canary_every=0", f"run_dir={tmp_path / 'b'}")
    module, _ = fit_rl(off, make_sampler=own_copy(DroppedPush))
    assert "perf/canary_s" not in module.last_metrics
