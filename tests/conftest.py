"""Shared fixtures: the ``tiny`` model built once per session, the real SmolLM2 from the persistent cache.

``MEMPO_CACHE`` points at a session folder under pytest's basetemp, so tests never write to the user's cache,
except SmolLM2: its materialization takes about 25 s and 517 MB, so it is built once into (and then reused
from) the persistent cache that was configured before the session started (``$MEMPO_CACHE`` or
``~/.cache/mempo``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from mempo.lm.loading import SMOLLM2, TINY, cache_root, load_policy, load_tokenizer, resolve_model_path
from mempo.losses import AdvantageConfig, AdvantageInputs, MemoryConfig, register_advantage
from mempo.rollout.sampler import Generation
from mempo.stages.config import compose_config

# Engines started by tests share 2 cores and 24 GiB with everything else: keep vLLM's CPU KV cache at 1 GiB.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
# W&B without an API key raises unless a mode is set; tests never reach the network.
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# pyproject's addopts run the suite in two pytest-xdist workers: each takes its share of the cores for torch, so two
# workers in a compute-heavy stretch do not oversubscribe them (subprocesses the tests start keep their defaults).
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // _WORKERS))
_PERSISTENT_CACHE = cache_root()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def mempo_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A per-session model cache, exported as $MEMPO_CACHE for code that resolves names itself."""
    cache = tmp_path_factory.mktemp("mempo-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MEMPO_CACHE", str(cache))
        yield cache


@pytest.fixture(autouse=True)
def release_run_log() -> Iterator[None]:
    """A stage run in a test leaves its run.log handler on the root logger; the test's folder is deleted when it
    passes (tmp_path_retention_policy), so the next record of any later test would reopen a log there and fail."""
    yield
    from mempo.core.console import release_log_file

    release_log_file()


@pytest.fixture(scope="session")
def tiny_path(mempo_cache: Path) -> Path:
    """The ``tiny`` random Llama folder (SmolLM2 tokenizer), built once per session."""
    path = resolve_model_path(TINY, cache_dir=mempo_cache)
    assert isinstance(path, Path)
    return path


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """SmolLM2-135M-Instruct as a safetensors folder in the persistent cache (slow the first time)."""
    path = resolve_model_path(SMOLLM2, cache_dir=_PERSISTENT_CACHE)
    assert isinstance(path, Path)
    return path


@pytest.fixture(scope="session")
def smollm2_tokenizer(tiny_path: Path) -> PreTrainedTokenizerBase:
    """The SmolLM2 tokenizer (``tiny`` ships the same files, so this needs no 517 MB model)."""
    return load_tokenizer(tiny_path)


@pytest.fixture
def tiny_policy(tiny_path: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A fresh fp32 ``tiny`` model and its tokenizer; tests may change its weights."""
    return load_policy(tiny_path)


@pytest.fixture
def make_cfg():
    return compose_config


def _plain_logprobs(model: PreTrainedModel, prompt: list[int], gen: Generation) -> torch.Tensor:
    """[L]: one unpadded fp32 forward of prompt + generation, full log-softmax, gather the sampled tokens."""
    ids = torch.tensor([prompt + gen.token_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    return logits[len(prompt) - 1 : -1].log_softmax(-1).gather(-1, ids[0, len(prompt) :, None]).squeeze(-1)


def _greedy_reference(model: PreTrainedModel, prompt: list[int], steps: int) -> list[int]:
    """Greedy decoding by hand: argmax of a full forward, one token at a time, no eos handling."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(steps):
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


@pytest.fixture(scope="session")
def plain_logprobs() -> Callable[[PreTrainedModel, list[int], Generation], torch.Tensor]:
    """The reference a sampler's log-probs must match: a plain fp32 forward on the sampled tokens."""
    return _plain_logprobs


@pytest.fixture(scope="session")
def greedy_reference() -> Callable[[PreTrainedModel, list[int], int], list[int]]:
    """The reference a greedy sampler must match."""
    return _greedy_reference


@pytest.fixture(scope="session")
def prompt_texts() -> list[str]:
    """Prompts of different lengths, so batches need padding."""
    return ["The capital of France is", "One, two, three, four,", "Hi"]


@register_advantage("test_signed", needs_memory_scores=True)  # memories scored, as for MemPO
def _signed_advantage(x: AdvantageInputs, memory: MemoryConfig, advantage: AdvantageConfig) -> torch.Tensor:
    """Test estimator: +1 on every response token of even trajectories, -1 on odd ones. A nonzero learning signal
    that does not depend on a random or tiny model ever answering correctly (fits that must move the policy)."""
    sign = 1.0 - 2.0 * (x.traj_ids % 2).float()  # [N]
    return sign[:, None] * x.response_mask.float()
