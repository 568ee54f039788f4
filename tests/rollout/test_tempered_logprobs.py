"""``sampler.logprobs=tempered``: the engines return, and the trainer computes, log softmax(logits / T) of a token
sampled at temperature T (the distribution it was drawn from), checked against a plain float32 forward; greedy calls
stay untempered (the canary and validation compare them with an untempered trainer forward); the update is on-policy
(ratio 1) at T = 0.7 with both old-log-prob sources."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from mempo.lm.loading import load_policy
from mempo.lm.scoring import sequence_logprobs
from mempo.rollout.hf_sampler import HFSampler
from mempo.rollout.sampler import SamplingConfig

T = 0.7
LOGP_TOL = dict(atol=5e-5, rtol=0.0)  # vLLM's fp32 CPU kernels sum in another order than torch's


def plain(model, prompt: list[int], tokens: list[int], temperature: float) -> torch.Tensor:
    """[L] log softmax(logits / temperature) of the sampled tokens, from one unpadded float32 forward."""
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()[len(prompt) - 1 : -1]
    return (logits / temperature).log_softmax(-1).gather(-1, ids[0, len(prompt) :, None]).squeeze(-1)


def trainer_reading(model, prompt: list[int], gens, temperature: float) -> list[torch.Tensor]:
    """The trainer's own log-probs of each generation's tokens (``sequence_logprobs``, as the update, the recomputed
    old log-probs and the reference pass call it): one right-padded batch, the response positions scored."""
    rows = [prompt + g.token_ids for g in gens]
    ids = torch.zeros(len(rows), max(map(len, rows)), dtype=torch.long)
    mask, score = torch.zeros_like(ids), torch.zeros_like(ids, dtype=torch.bool)
    for i, row in enumerate(rows):
        ids[i, : len(row)], mask[i, : len(row)], score[i, len(prompt) : len(row)] = torch.tensor(row), 1, True
    logp = sequence_logprobs(model, ids, mask, score_mask=score, temperature=temperature)
    return [logp[i, len(prompt) : len(rows[i])] for i in range(len(rows))]


@pytest.fixture(scope="module")
def hf(tiny_path: Path):
    return load_policy(tiny_path)


def test_the_hf_sampler_returns_tempered_logprobs_for_sampled_calls_only(hf) -> None:
    model, tok = hf
    prompt = tok("The capital of France is").input_ids
    sampled = SamplingConfig(n=3, max_new_tokens=12, temperature=T, seed=3)
    raw = HFSampler(model, tok).generate([prompt], sampled)[0]
    tempered = HFSampler(model, tok, logprobs="tempered").generate([prompt], sampled)[0]
    assert [g.token_ids for g in tempered] == [g.token_ids for g in raw]  # the same draws, read differently
    for g in tempered:
        torch.testing.assert_close(torch.tensor(g.logprobs), plain(model, prompt, g.token_ids, T))
        assert (torch.tensor(g.logprobs) - plain(model, prompt, g.token_ids, 1.0)).abs().max() > 1e-2
    greedy = HFSampler(model, tok, logprobs="tempered").generate([prompt], SamplingConfig(max_new_tokens=8))[0][0]
    torch.testing.assert_close(torch.tensor(greedy.logprobs), plain(model, prompt, greedy.token_ids, 1.0))


@pytest.mark.slow
def test_the_vllm_engine_returns_tempered_logprobs_for_sampled_calls_only(hf, tiny_path: Path) -> None:
    pytest.importorskip("vllm")
    from mempo.rollout.vllm_sampler import VLLMSampler

    model, tok = hf
    prompt = tok("One, two, three, four,").input_ids
    engine = VLLMSampler(tiny_path, dtype="float32", kv_cache_space_gb=1, max_model_len=512, logprobs="tempered")
    try:
        out = engine.generate([prompt], SamplingConfig(n=3, max_new_tokens=12, temperature=T, seed=5))[0]
        greedy = engine.generate([prompt], SamplingConfig(max_new_tokens=8))[0][0]
    finally:
        engine.shutdown()
    for g in out:
        torch.testing.assert_close(torch.tensor(g.logprobs), plain(model, prompt, g.token_ids, T), **LOGP_TOL)
        assert (torch.tensor(g.logprobs) - plain(model, prompt, g.token_ids, 1.0)).abs().max() > 1e-2
    torch.testing.assert_close(torch.tensor(greedy.logprobs), plain(model, prompt, greedy.token_ids, 1.0), **LOGP_TOL)
    # the trainer reads the engine's sampled tokens as the engine does at T, and not as the raw policy
    for g, trainer_logp, trainer_raw in zip(
        out, trainer_reading(model, prompt, out, T), trainer_reading(model, prompt, out, 1.0)
    ):
        torch.testing.assert_close(trainer_logp, torch.tensor(g.logprobs), **LOGP_TOL)
        assert (trainer_raw - torch.tensor(g.logprobs)).abs().max() > 1e-2


def test_tempered_logprobs_need_top_p_1_and_raw_ones_do_not(make_cfg) -> None:
    with pytest.raises(ValueError, match=r"sampler\.top_p.*sampler\.logprobs=tempered"):
        make_cfg("sampler.top_p=0.9")
    assert make_cfg("sampler.top_p=0.9", "sampler.logprobs=raw").sampler.top_p == 0.9


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "old_logp"), [("vllm", "sampler"), ("hf", "recompute")])
def test_the_update_is_on_policy_at_temperature_0_7(make_cfg, tiny_path: Path, tmp_path: Path, backend, old_logp):
    """Ratio 1 at step 1 (no update yet): the old log-probs (the engine's, or the trainer's recomputed ones) are read
    at the temperature the update reads the policy at."""
    from mempo.stages.train import fit_rl

    cfg = make_cfg(
        f"model.name_or_path={tiny_path}", f"sampler={backend}", "sampler.kv_cache_space_gb=1",
        f"sampler.temperature={T}", "sampler.max_new_tokens=12", "trainer.precision=32-true",
        f"optim.old_logp={old_logp}", "optim.fuse_old_logp=false", "optim.lr=1e-3",  # a separate recompute's reading
        "advantage.estimator=test_signed", "agent.max_turns=2", "data.batch_size=2", "data.group_size=2",
        "trainer.max_steps=1", "ckpt.every_n_steps=5", "eval.every_n_steps=0", f"run_dir={tmp_path}",
    )  # fmt: skip
    fit_rl(cfg)
    (row,) = csv.DictReader((tmp_path / "metrics.csv").open())
    torch.testing.assert_close(float(row["train/ratio_mean"]), 1.0, rtol=0, atol=1e-4)
    assert float(row["train/clip_frac"]) == 0.0


def test_an_engine_whose_reading_differs_from_the_trainers_is_refused() -> None:
    from types import SimpleNamespace

    from mempo.models.callbacks import check_logprob_reading

    module = SimpleNamespace(sampling=SimpleNamespace(temperature=T), logp_temperature=T)
    check_logprob_reading(SimpleNamespace(logprobs="tempered"), module)
    with pytest.raises(ValueError, match="engine returns raw log-probs but the trainer computes tempered"):
        check_logprob_reading(SimpleNamespace(logprobs="raw"), module)
    raw_module = SimpleNamespace(sampling=SimpleNamespace(temperature=T), logp_temperature=1.0)
    with pytest.raises(ValueError, match="engine returns tempered log-probs but the trainer computes raw"):
        check_logprob_reading(SimpleNamespace(logprobs="tempered"), raw_module)
