"""Slow end-to-end fits: the real SmolLM2 through the vLLM sampler, and two data-parallel CPU processes."""

import csv
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mempo.lm.loading import load_policy
from mempo.stages.train import fit_rl

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_two_step_fit_of_smollm2_through_vllm(make_cfg, smollm2_path, tmp_path):
    cfg = make_cfg(
        f"model.name_or_path={smollm2_path}",
        "sampler=vllm",
        "sampler.kv_cache_space_gb=1",
        "sampler.max_new_tokens=24",
        "agent.max_turns=2",
        "data.batch_size=1",
        "data.group_size=2",
        "trainer.max_steps=2",
        "advantage.estimator=test_signed",  # registered in test_module.py: a signal independent of luck
        "optim.lr=1e-4",
        "loss.kl_coef=1e-3",  # the main config's CPU recipe has no KL term; this test checks the reference stays
        "ckpt.every_n_steps=2",
        f"run_dir={tmp_path}",
    )
    before, _ = load_policy(smollm2_path)
    module, summary = fit_rl(cfg)
    assert summary["steps"] == 2
    changed = [k for k, v in module.policy.state_dict().items() if not torch.equal(v, before.state_dict()[k])]
    assert changed  # the update moved the policy
    for k, v in module.reference.state_dict().items():
        assert torch.equal(v, before.state_dict()[k]), f"reference parameter {k} changed"
    rows = list(csv.DictReader((tmp_path / "metrics.csv").open()))
    assert [int(r["step"]) for r in rows] == [1, 2]
    assert float(rows[-1]["perf/push_s"]) < 30  # the push ran (its speed is a benchmark's business)


@pytest.mark.slow
def test_ddp_two_cpu_processes(tmp_path):
    """trainer=ddp on two CPU processes (gloo) with the tiny model: both ranks step; rank 0 writes the outputs."""
    cmd = [
        sys.executable,
        str(ROOT / "experiments" / "run.py"),
        "+exp=ablation_nomem",
        "+debug=default",
        "trainer=ddp",
        "trainer.accelerator=cpu",
        "trainer.devices=2",
        "trainer.precision=32-true",
        "agent.max_turns=1",
        "sampler.max_new_tokens=8",
        "eval.every_n_steps=0",  # no validation (the debug config's): the two processes are what this tests
        f"run_dir={tmp_path}",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    # Lightning's lines go to the run log, not the console (mempo.core.console), unless verbose=true.
    said = out.stderr + out.stdout + (tmp_path / "run.log").read_text()
    assert "world_size=2" in said or "distributed_backend=gloo" in said
    rows = list(csv.DictReader((tmp_path / "metrics.csv").open()))
    assert [int(r["step"]) for r in rows] == [1, 2]
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.slow
def test_vllm_fit_is_on_policy_and_its_weight_push_lands(make_cfg, tiny_path, tmp_path):
    """The tiny model through a float32 vLLM engine, one PPO epoch, old log-probs from the engine: both steps have
    ratio 1 and nothing clipped. Step 2 samples after the first push (lr 1e-3 moves the tiny model far), so its ratio
    of 1 says the engine's log-probs equal the trainer's after the push: the push landed. The canary says so too."""
    cfg = make_cfg(
        f"model.name_or_path={tiny_path}", "sampler=vllm", "sampler.kv_cache_space_gb=1", "sampler.max_new_tokens=12",
        "trainer.precision=32-true", "optim.old_logp=sampler", "optim.ppo_epochs=1", "optim.lr=1e-3",
        "loss.eps_low=0.01", "loss.eps_high=0.01", "loss.kl_coef=1e-3", "advantage.estimator=test_signed",
        "agent.max_turns=2",
        "data.batch_size=2", "data.group_size=2", "trainer.max_steps=2", "ckpt.every_n_steps=2", f"run_dir={tmp_path}",
    )  # fmt: skip
    fit_rl(cfg)
    rows = list(csv.DictReader((tmp_path / "metrics.csv").open()))
    assert [int(r["step"]) for r in rows] == [1, 2]
    for r in rows:
        # vLLM's fp32 CPU kernels agree with the trainer's to about 2e-5 per token (tests/rollout/test_vllm_sampler.py)
        torch.testing.assert_close(float(r["train/ratio_mean"]), 1.0, rtol=0, atol=1e-4)
        assert float(r["train/clip_frac"]) == 0.0
        assert float(r["train/canary_logp_diff"]) < 1e-4
    assert float(rows[1]["train/kl"]) > 1e-6  # the policy of step 2 is not the initial one: the push had work to do
