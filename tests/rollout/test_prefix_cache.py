"""The engine's prefix cache as the RL step sees it (``VLLMSampler.prefix_cache_counts``, ``sampler.block_size``):
vLLM reuses cached KV in whole blocks only, never a prompt's last token, and a weight push empties the cache."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from mempo.lm.loading import load_policy
from mempo.rollout.sampler import SamplingConfig

pytest.importorskip("vllm")
pytestmark = pytest.mark.slow

from mempo.rollout.vllm_sampler import VLLMSampler  # noqa: E402

ONE_TOKEN = SamplingConfig(max_new_tokens=1, temperature=0.0)


def cached_tokens(prompt_len: int, shared: int, block: int) -> int:
    """Tokens of a prompt served from the cache: the whole blocks inside the prefix it shares with a cached prompt,
    at most its length less one (vLLM computes at least the last token)."""
    return min(shared, prompt_len - 1) // block * block


@pytest.fixture(scope="module")
def engine32(tiny_path: Path) -> Iterator[VLLMSampler]:
    sampler = VLLMSampler(tiny_path, dtype="float32", kv_cache_space_gb=1, max_model_len=512, block_size=32)
    yield sampler
    sampler.shutdown()


def test_counts_follow_whole_blocks_of_the_shared_prefix(engine32: VLLMSampler) -> None:
    a = list(range(10, 110))  # 100 tokens
    b = a[:70] + list(range(500, 530))  # shares 70 tokens with a
    engine32.prefix_cache_counts()  # start counting here
    engine32.generate([a], ONE_TOKEN)
    assert engine32.prefix_cache_counts() == (100, 0)
    engine32.generate([a], ONE_TOKEN)
    assert engine32.prefix_cache_counts() == (100, cached_tokens(100, 100, 32))  # 96
    engine32.generate([b], ONE_TOKEN)
    assert engine32.prefix_cache_counts() == (100, cached_tokens(100, 70, 32))  # 64
    assert engine32.prefix_cache_counts() == (0, 0)  # read and restarted


def test_a_weight_push_empties_the_cache(engine32: VLLMSampler, tiny_path: Path) -> None:
    a = list(range(10, 110))
    engine32.generate([a], ONE_TOKEN)
    policy, _ = load_policy(tiny_path)
    engine32.push_weights(policy.state_dict())
    engine32.prefix_cache_counts()
    engine32.generate([a], ONE_TOKEN)
    assert engine32.prefix_cache_counts() == (100, 0)  # KV of the old weights is never served
