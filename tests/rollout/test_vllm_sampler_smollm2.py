"""VLLMSampler on the real SmolLM2-135M-Instruct: one engine for the module."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from mempo.lm.loading import load_policy
from mempo.rollout.sampler import SamplingConfig

pytest.importorskip("vllm")
pytestmark = pytest.mark.slow

from mempo.rollout.vllm_sampler import VLLMSampler, _inprocess_worker  # noqa: E402

# 30 layers of vLLM-CPU kernels versus torch's, summed in other orders: fp32 log-probs agree to about 2e-5
# per token; 1e-4 leaves room for the longest sequences here.
LOGP_TOL = dict(atol=1e-4, rtol=0.0)


@pytest.fixture(scope="module")
def engine(smollm2_path: Path) -> Iterator[VLLMSampler]:
    sampler = VLLMSampler(smollm2_path, dtype="float32", kv_cache_space_gb=1, max_model_len=2048)
    yield sampler
    sampler.shutdown()


@pytest.fixture(scope="module")
def hf(smollm2_path: Path):
    return load_policy(smollm2_path)


@pytest.fixture(scope="module")
def prompt(hf) -> list[int]:
    _, tokenizer = hf
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)


def hf_greedy(model, prompt: list[int], steps: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=steps, do_sample=False, top_k=0)
    return out[0, len(prompt) :].tolist()


def test_greedy_answer_matches_hf(engine: VLLMSampler, hf, prompt, plain_logprobs) -> None:
    model, tokenizer = hf
    gen = engine.generate([prompt], SamplingConfig(max_new_tokens=24, temperature=0.0))[0][0]
    assert "Paris" in gen.text
    assert gen.finish_reason == "stop" and gen.token_ids[-1] == tokenizer.eos_token_id  # <|im_end|>, kept
    assert gen.token_ids == hf_greedy(model, prompt, 24)
    torch.testing.assert_close(torch.tensor(gen.logprobs), plain_logprobs(model, prompt, gen), **LOGP_TOL)


def test_sampled_logprobs_match_hf(engine: VLLMSampler, hf, prompt, plain_logprobs) -> None:
    model, _ = hf
    out = engine.generate([prompt], SamplingConfig(n=4, max_new_tokens=32, temperature=1.0, top_p=0.95, seed=0))
    for gen in out[0]:
        torch.testing.assert_close(torch.tensor(gen.logprobs), plain_logprobs(model, prompt, gen), **LOGP_TOL)


def test_push_is_fast_and_followed(engine: VLLMSampler, hf, prompt, plain_logprobs) -> None:
    """Regression: SmolLM2 ties lm_head to the embedding; vLLM-CPU's reload left the packed head stale."""
    model, _ = hf
    greedy = SamplingConfig(max_new_tokens=16, temperature=0.0)
    old = engine.generate([prompt], greedy)

    perturbed = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        emb = perturbed.model.embed_tokens.weight
        emb.add_(0.5 * emb.std() * torch.randn(emb.shape, generator=gen))
    assert _inprocess_worker(engine.llm) is not None, "the push should hand tensors to the worker, not go via disk"
    times = []
    for _ in range(3):
        engine.push_weights(perturbed.state_dict())
        times.append(engine.last_push_s)
    # About 0.3 s on an idle 2-core machine (benchmarks/sampler_throughput.py), but helpers training beside it
    # stretched pushes to 2.5 s. The bound catches a push that restarts or rebuilds the engine (10 s and more).
    assert min(times) < 5.0, f"weight push took {times} s"
    new = engine.generate([prompt], greedy)[0][0]
    assert new.token_ids != old[0][0].token_ids
    assert new.token_ids == hf_greedy(perturbed, prompt, 16)
    torch.testing.assert_close(torch.tensor(new.logprobs), plain_logprobs(perturbed, prompt, new), **LOGP_TOL)

    engine.push_weights(model.state_dict())
    assert engine.generate([prompt], greedy) == old
