"""``optim.shared_prefix``: the update computes the leading tokens its micro-batches' rows share once. The same
objective: one step moves the loss and the gradient as the unshared update does, to float32 rounding, while its
forwards compute fewer positions (perf/update_positions) than [rows x longest row]."""

from __future__ import annotations

import csv
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from mempo.lm import logprobs
from mempo.stages.train import fit_rl

RUN = [
    "model=tiny", "data.batch_size=2", "data.group_size=3", "agent.max_turns=2", "sampler.max_new_tokens=12",
    "advantage.estimator=test_signed", "optim.lr=1e-3", "optim.micro_batch_size=3", "trainer.max_steps=1",
    "ckpt.every_n_steps=5", "eval.every_n_steps=0", "sampler=hf", "trainer.precision=32-true",
]  # fmt: skip


def step_row(run_dir: Path) -> dict[str, str]:
    (row,) = list(csv.DictReader((run_dir / "metrics.csv").open()))
    return row


def count_repacks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that grows by one at each forward that runs repacked (the shared prefix's attention installed)."""
    repacked: list[int] = []
    real = logprobs.shared_prefix_attention

    @contextmanager
    def counted(model):
        repacked.append(1)
        with real(model):
            yield

    monkeypatch.setattr(logprobs, "shared_prefix_attention", counted)
    return repacked


@pytest.mark.parametrize(
    ("old_logp", "more"),
    [("recompute", []), ("sampler", []), ("recompute", ["model.gradient_checkpointing=true"])],
)
def test_a_shared_prefix_update_moves_the_weights_as_the_unshared_one(
    make_cfg, tmp_path: Path, monkeypatch, old_logp, more
) -> None:
    """One float32 step from the same rollouts (the HF sampler runs before the update), the old log-probs from the
    update's own forward (recompute, fused) or from the engine; with gradient checkpointing the layers' recompute in
    backward repacks too (the update holds the switch across its backward)."""
    repacked = count_repacks(monkeypatch)
    figures = {}
    for shared in ("false", "true"):
        run_dir = tmp_path / shared
        repacked.clear()
        cfg = make_cfg(*RUN, *more, f"optim.old_logp={old_logp}", f"optim.shared_prefix={shared}", f"run_dir={run_dir}")
        fit_rl(cfg)
        figures[shared] = step_row(run_dir)
        assert figures[shared]["train/no_signal"] == "0.0"
        assert bool(repacked) is (shared == "true")  # the update's forwards took the switch
    base, got = figures["false"], figures["true"]
    tokens, pad = float(base["perf/update_tokens"]), float(base["perf/update_pad_frac"])
    padded = tokens / (1 - pad)
    assert float(base["perf/update_positions"]) == pytest.approx(padded)  # unshared: every padded position
    # The system prompt and chat template lead every turn sample: far fewer positions computed.
    assert float(got["perf/update_positions"]) < 0.9 * padded
    assert got["perf/update_tokens"] == base["perf/update_tokens"]  # the same rows
    # As in test_compiled_update: the loss at ratio 1 is about 0 (compared absolutely); sums in another order.
    for key, atol in (("train/loss", 1e-5), ("train/grad_norm", 1e-7)):
        torch.testing.assert_close(float(got[key]), float(base[key]), rtol=1e-4, atol=atol, msg=key)
    assert float(base["train/grad_norm"]) > 0
    if old_logp == "recompute":  # the old log-probs are the shared forward's own: ratio exactly 1
        assert float(got["train/first_epoch_ratio_dev"]) == 0.0


def test_shared_prefix_refuses_a_sharded_policy() -> None:
    from mempo.lm.logprobs import TOKEN_STATS_METHOD, token_logprobs

    class Sharded(torch.nn.Module):
        pass

    model = Sharded()
    setattr(model, TOKEN_STATS_METHOD, lambda *a: None)
    ids = torch.ones(2, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="optim.shared_prefix: not for a sharded model"):
        token_logprobs(model, ids, ids.bool(), shared_prefix=True)


def test_auto_reaches_the_update_resolved(make_cfg, tmp_path: Path, monkeypatch) -> None:
    """``optim.shared_prefix=auto`` (and head_grad_in_forward=auto) on a CPU run: the builders resolve it before the
    module, so the update repacks, while the head, which trains here (tiny, every layer), keeps its gradient in
    backward (the module would refuse it in forward)."""
    repacked = count_repacks(monkeypatch)
    switches = ("optim.shared_prefix=auto", "optim.head_grad_in_forward=auto", "trainer.accelerator=cpu")
    fit_rl(make_cfg(*RUN, *switches, f"run_dir={tmp_path}"))
    row = step_row(tmp_path)
    assert repacked  # on
    padded = float(row["perf/update_tokens"]) / (1 - float(row["perf/update_pad_frac"]))
    assert float(row["perf/update_positions"]) < 0.9 * padded
