"""The compiled engine (``sampler.enforce_eager=false``, what ``enforce_eager=auto`` picks for long RL runs) takes the
in-process weight push as the eager one does: its graphs read the reloaded weights, not copies captured at start."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mempo.lm.loading import load_policy, random_tiny_model
from mempo.rollout.sampler import SamplingConfig

pytest.importorskip("vllm")
pytestmark = pytest.mark.slow

from mempo.rollout.vllm_sampler import VLLMSampler  # noqa: E402

LOGP_TOL = dict(
    atol=5e-5, rtol=0.0
)  # vLLM's CPU kernels against a plain fp32 forward (tests/rollout/test_vllm_sampler.py)


def test_a_compiled_engine_samples_from_pushed_weights(tiny_path: Path, plain_logprobs, greedy_reference) -> None:
    model, tokenizer = load_policy(tiny_path)
    engine = VLLMSampler(tiny_path, dtype="float32", enforce_eager=False, kv_cache_space_gb=1, max_model_len=1024)
    try:
        prompt = tokenizer(" ".join(["The quick brown fox jumps over the lazy dog."] * 20)).input_ids
        greedy = SamplingConfig(max_new_tokens=8, temperature=0.0)
        before = engine.generate([prompt], greedy)[0][0]
        other = random_tiny_model(tokenizer, seed=1)
        engine.push_weights(other.state_dict())
        new = engine.generate([prompt], greedy)[0][0]
        assert new.token_ids == greedy_reference(other, prompt, 8) != before.token_ids
        torch.testing.assert_close(torch.tensor(new.logprobs), plain_logprobs(other, prompt, new), **LOGP_TOL)
        engine.push_weights(model.state_dict())
        assert engine.generate([prompt], greedy)[0][0] == before  # the old weights back: the same tokens, exactly
    finally:
        engine.shutdown()
