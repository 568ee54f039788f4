"""The objective with an engine whose log-probs are not the trainer's (a bf16 engine; here the float32 HF sampler
against a bf16 trainer, the same mismatch in the other direction): the old log-probs are recomputed by the trainer,
so the first epoch's ratio new / old is exactly 1 on every token of every step, and each step logs how far the
engine is from them (``rollout/engine_logp_gap``) and how many tokens' TIS weight is cut (``train/tis_clip_frac``).
With a float32 engine every new switch resolves to today's path: the weights are bit-identical with the switches on
``auto`` and off."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import torch

from mempo.stages.train import fit_rl

RUN = [
    "model=tiny", "data.batch_size=2", "data.group_size=2", "agent.max_turns=2", "sampler.max_new_tokens=12",
    "advantage.estimator=test_signed", "optim.lr=1e-3", "optim.micro_batch_size=3", "trainer.max_steps=2",
    "ckpt.every_n_steps=5", "eval.every_n_steps=0",
]  # fmt: skip


def rows(run_dir: Path) -> list[dict[str, str]]:
    return list(csv.DictReader((run_dir / "metrics.csv").open()))


BF16_RECOMPUTE = ["sampler=hf", "trainer.precision=bf16-mixed", "optim.old_logp=recompute", "loss.tis_cap=1.01"]


def test_recomputed_old_logprobs_give_ratio_1_at_the_first_epoch_of_every_step(make_cfg, tmp_path: Path) -> None:
    """The separate no-grad recompute (``optim.fuse_old_logp=false``) against the update's forward."""
    fit_rl(make_cfg(*RUN, *BF16_RECOMPUTE, "optim.fuse_old_logp=false", f"run_dir={tmp_path}"))
    steps = rows(tmp_path)
    assert [r["step"] for r in steps] == ["1", "2"] and all(r["train/no_signal"] == "0.0" for r in steps)
    for r in steps:
        assert float(r["train/first_epoch_ratio_dev"]) == 0.0, r["step"]  # exactly: the same forward, twice
        gap = float(r["rollout/engine_logp_gap"])
        assert 1e-4 < gap < 0.5, r["step"]  # the fp32 sampler against bf16 autocast: a real, small gap
        # A cap just above 1 cuts the tokens whose pi_old exceeds pi_engine by more than 1%: some, not all.
        assert 0.0 < float(r["train/tis_clip_frac"]) < 1.0, r["step"]
        assert int(float(r["perf/update_tokens"])) > 0 and 0.0 <= float(r["perf/update_pad_frac"]) < 1.0


def test_old_logprobs_from_the_updates_forward_are_bit_identical_to_a_separate_recompute(make_cfg, tmp_path) -> None:
    """``optim.fuse_old_logp``: with one PPO epoch the update's own forward, detached, gives the old log-probs; it is
    the same computation as the no-grad recompute, so two steps end in the same weights and figures, bit for bit."""
    weights, figures = {}, {}
    for fuse in ("true", "false"):
        cfg = make_cfg(*RUN, *BF16_RECOMPUTE, f"optim.fuse_old_logp={fuse}", f"run_dir={tmp_path / fuse}")
        module, _ = fit_rl(cfg)
        weights[fuse] = {k: v.detach().clone() for k, v in module.policy.state_dict().items()}
        figures[fuse] = [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in rows(tmp_path / fuse)]
    for k, want in weights["false"].items():
        torch.testing.assert_close(weights["true"][k], want, rtol=0, atol=0, msg=k)
    assert figures["true"] == figures["false"]  # loss, gradient norm, engine gap, TIS clip share: the same
    assert float(figures["true"][0]["rollout/engine_logp_gap"]) > 0  # and the old log-probs were the trainer's


@pytest.mark.parametrize(
    ("extra", "fused"),
    [
        ((), True),
        (("optim.fuse_old_logp=false",), False),
        (("optim.ppo_epochs=2",), False),  # a second pass needs the first pass's log-probs, fixed
        (("optim.old_logp=sampler",), False),
        (("model.lora.rank=4",), True),
        (("model.lora.rank=4", "model.lora.dropout=0.1"), False),  # the training forward drops, the recompute not
    ],
)
def test_which_runs_take_old_logprobs_from_the_update(make_cfg, extra, fused) -> None:
    from mempo.stages.builders import build_module

    module, _ = build_module(make_cfg("model=tiny", "sampler=hf", "optim.old_logp=recompute", *extra))
    assert module.fuses_old_logp is fused


def test_engine_logprobs_as_old_ones_log_no_gap(make_cfg, tmp_path: Path) -> None:
    fit_rl(make_cfg(*RUN, "sampler=hf", "trainer.precision=32-true", f"run_dir={tmp_path}"))  # old_logp=sampler
    vocab = json.loads((tmp_path / "hf" / "config.json").read_text())["vocab_size"]
    for r in rows(tmp_path):
        assert 0.0 < float(r["rollout/token_entropy"]) < math.log(vocab)  # logged, and no more than uniform's
        assert float(r["rollout/engine_logp_gap"]) == 0.0 and float(r["train/tis_clip_frac"]) == 0.0
        # The update's forward is not the one that sampled (HF generate with a KV cache): a deviation, small.
        assert 0.0 < float(r["train/first_epoch_ratio_dev"]) < 1e-3


@pytest.mark.slow
def test_float32_engine_switches_on_auto_are_bit_identical_to_off(make_cfg, tmp_path: Path, monkeypatch) -> None:
    """vLLM in float32: ``sampler.dtype=auto`` on a CPU without native bf16 (made so here: the engine's dtype follows
    the machine, not the trainer), ``sampler.enforce_eager=auto`` on a 2-step run and ``sampler.canary_tol=null``
    resolve to today's engine and tolerance; two steps give bit-identical weights and the same figures as the
    switches set off by hand."""
    import mempo.stages.config as config

    monkeypatch.setattr(config, "cpu_has_bf16", lambda: False)
    common = [*RUN, "sampler=vllm", "sampler.kv_cache_space_gb=1", "trainer.precision=32-true"]
    runs = {
        "auto": ["sampler.dtype=auto", "sampler.enforce_eager=auto", "sampler.canary_tol=null"],
        "off": ["sampler.dtype=float32", "sampler.enforce_eager=true", "sampler.canary_tol=1e-3"],
    }
    weights, metrics = {}, {}
    for name, switches in runs.items():
        module, _ = fit_rl(make_cfg(*common, *switches, f"run_dir={tmp_path / name}"))
        weights[name] = {k: v.detach().clone() for k, v in module.policy.state_dict().items()}
        metrics[name] = [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in rows(tmp_path / name)]
    for k, want in weights["off"].items():
        torch.testing.assert_close(weights["auto"][k], want, rtol=0, atol=0, msg=k)
    assert metrics["auto"] == metrics["off"]
    assert all(float(r["rollout/engine_logp_gap"]) == 0.0 for r in metrics["auto"])  # old log-probs: the engine's


def test_a_turn_sample_far_from_the_engine_is_reported_with_its_worst_tokens(make_cfg, caplog) -> None:
    """One turn sample whose engine log-probs are 3 nats off the trainer's (an engine that sampled from another
    context): the step's row maximum says 3, the batch mean less, and run.log names the row and its tokens."""
    from mempo.rollout.agent import TurnBatch
    from mempo.stages.builders import build_module

    module, _ = build_module(make_cfg("model=tiny", "sampler=hf", "optim.old_logp=recompute"))
    n, t = 3, 6
    response = torch.zeros(n, t, dtype=torch.bool)
    response[:, 3:] = True
    old = torch.full((n, t), -4.0) * response
    engine = old.clone()
    engine[1, 3:] += 3.0  # row 1: the engine was 3 nats more sure of each of its 3 tokens
    zeros = torch.zeros(n, dtype=torch.long)
    x = TurnBatch(
        input_ids=torch.arange(n * t).reshape(n, t) + 10, attention_mask=torch.ones(n, t, dtype=torch.long),
        response_mask=response, mem_mask=torch.zeros_like(response), sampler_logp=engine,
        traj_ids=torch.tensor([0, 1, 2]), group_ids=zeros, turn_ids=torch.tensor([0, 2, 0]),
        rewards=torch.zeros(n), traj_group_ids=zeros,
    )  # fmt: skip
    with caplog.at_level("WARNING", logger="mempo.models.module"):
        m = module.engine_mismatch_metrics(x, old, [[0, 1, 2]])
    assert m["rollout/engine_logp_gap_row_max"] == pytest.approx(3.0)
    assert m["rollout/engine_logp_gap"] == pytest.approx(1.0)  # 9 nats over the 9 sampled tokens
    (record,) = [r for r in caplog.records if "engine/trainer" in r.getMessage()]
    message = record.getMessage()
    assert "turn sample 1 (trajectory 1, turn 2, 3 sampled tokens)" in message and "3.000 nats" in message
    assert "engine -1.000 trainer -4.000" in message
    caplog.clear()
    with caplog.at_level("WARNING", logger="mempo.models.module"):
        module.engine_mismatch_metrics(x, old, [[0, 2]])  # the far row not computed: nothing to report
    assert not [r for r in caplog.records if "engine/trainer" in r.getMessage()]
