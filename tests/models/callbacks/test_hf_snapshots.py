"""``ckpt.hf_every_n_steps``: the policy as an HF folder every k RL steps, kept. Each snapshot is the policy after
that step: the one at step 1 of a 2-step run is bit for bit the exported policy of a 1-step run, the one at the last
step is the run's own export, and the steps between moved the weights."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from mempo.stages.train import fit_rl

RUN = [
    "model=tiny", "data.batch_size=2", "data.group_size=2", "agent.max_turns=2", "sampler.max_new_tokens=12",
    "advantage.estimator=test_signed", "optim.lr=1e-3", "sampler=hf", "trainer.precision=32-true",
    "ckpt.every_n_steps=5", "eval.every_n_steps=0",
]  # fmt: skip


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


def test_snapshots_are_the_policy_after_their_step(make_cfg, tmp_path: Path) -> None:
    two, one = tmp_path / "two", tmp_path / "one"
    fit_rl(make_cfg(*RUN, "trainer.max_steps=2", "ckpt.hf_every_n_steps=1", f"run_dir={two}"))
    fit_rl(make_cfg(*RUN, "trainer.max_steps=1", f"run_dir={one}"))
    assert sorted(p.name for p in (two / "hf_steps").iterdir()) == ["step-000001", "step-000002"]
    assert not (one / "hf_steps").exists()  # off by default
    first, last = weights(two / "hf_steps" / "step-000001"), weights(two / "hf_steps" / "step-000002")
    assert (two / "hf_steps" / "step-000001" / "tokenizer.json").is_file()  # loadable on its own, as eval needs
    for name, want in weights(one / "hf").items():
        torch.testing.assert_close(first[name], want, rtol=0, atol=0, msg=name)
    for name, want in weights(two / "hf").items():
        torch.testing.assert_close(last[name], want, rtol=0, atol=0, msg=name)
    assert any(not torch.equal(first[n], last[n]) for n in first)  # step 2 moved the weights
