"""The ``Sampler`` protocol: what the agent loop needs from a generation engine.

Implementations: ``VLLMSampler`` (mempo.rollout.vllm_sampler, a colocated vLLM engine, CPU or CUDA) and
``HFSampler`` (mempo.rollout.hf_sampler, transformers ``generate``: the reference and the fallback).

Log-probs are always the *raw* policy's (no temperature / top-p applied), so they can serve as ``old_logp`` of
the PPO ratio (mempo.md §4) and are comparable to a plain fp32 forward of the same weights.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch


@dataclass(frozen=True)
class SamplingConfig:
    """Per-call generation parameters (config keys under ``sampler.`` repeat these names)."""

    n: int = 1
    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"sampler.n must be >= 1, got {self.n}")
        if self.max_new_tokens < 1:
            raise ValueError(f"sampler.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"sampler.temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"sampler.top_p must be in (0, 1], got {self.top_p}")


@dataclass
class Generation:
    """One sampled continuation.

    token_ids: [L] exactly as sampled (a matched stop string is included; never re-tokenized).
    logprobs:  [L] raw-policy log-prob of each sampled token.
    finish_reason: "stop" (stop string or eos) or "length" (max_new_tokens reached).
    """

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str = "stop"
    extra: dict = field(default_factory=dict)


@runtime_checkable
class Sampler(Protocol):
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingConfig) -> list[list[Generation]]:
        """prompts: B lists of prompt token ids -> [B][params.n] generations."""
        ...

    def push_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Load new policy weights (HF parameter names) into the engine."""
        ...

    def sleep(self) -> None:
        """Release accelerator memory between rollouts where the engine supports it (no-op otherwise)."""
        ...

    def wake(self) -> None: ...

    def shutdown(self) -> None: ...
