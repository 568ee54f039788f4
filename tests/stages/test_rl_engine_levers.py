"""The RL engine's switches for throughput: ``sampler.dtype=auto``, ``sampler.enforce_eager=auto``,
``sampler.block_size`` and ``sampler.canary_tol=null``, as the config resolves them and as build_sampler hands them to
the engine (captured, not started: the engine itself is tested in tests/rollout). Their defaults leave today's
float32, eager engine with vLLM's own block size exactly as it was."""

from __future__ import annotations

import re
from typing import Any

import pytest

import mempo.rollout.vllm_sampler as vllm_sampler
from mempo.core.hardware import cpu_has_bf16, rate_kind
from mempo.rollout.sampler import COMPILE_MIN_STEPS, SamplerConfig
from mempo.stages.builders import build_optim_config, build_sampler, group, sampler_dtype, speed_settings_line
from mempo.stages.config import compose_config


@pytest.fixture
def engine_kwargs(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    monkeypatch.setattr(vllm_sampler, "VLLMSampler", lambda path, **kw: seen.append(kw))
    return seen


def test_the_defaults_are_todays_engine(engine_kwargs: list[dict[str, Any]]) -> None:
    cfg = compose_config()
    build_sampler(cfg, "some/folder", rl_steps=10_000)  # even a long run: enforce_eager stays true by default
    (kw,) = engine_kwargs
    assert (kw["dtype"], kw["enforce_eager"], kw["block_size"]) == ("float32", True, None)
    assert build_optim_config(cfg).old_logp == "sampler"
    assert group(cfg, "sampler").canary_tolerance("float32") == 1e-3


@pytest.mark.parametrize(
    ("precision", "dtype", "old_logp"),
    [("bf16-mixed", "bfloat16", "recompute"), ("32-true", "float32", "sampler")],
)
def test_dtype_auto_follows_the_trainers_precision(engine_kwargs, precision, dtype, old_logp) -> None:
    cfg = compose_config("sampler.dtype=auto", f"trainer.precision={precision}")
    assert sampler_dtype(cfg) == dtype
    assert build_optim_config(cfg).old_logp == old_logp  # a bf16 engine's log-probs are recomputed by the trainer
    build_sampler(cfg, "some/folder")
    assert engine_kwargs[-1]["dtype"] == dtype


def test_dtype_auto_on_this_machine() -> None:
    """trainer.precision=auto: bf16 where the CPU has native bf16 (AVX512-BF16, AMX), float32 on AVX2-only CPUs."""
    assert sampler_dtype(compose_config("sampler.dtype=auto")) == ("bfloat16" if cpu_has_bf16() else "float32")


def test_an_explicit_dtype_and_old_logp_stand() -> None:
    cfg = compose_config("sampler.dtype=float32", "trainer.precision=bf16-mixed")
    assert sampler_dtype(cfg) == "float32" and build_optim_config(cfg).old_logp == "sampler"
    cfg = compose_config("sampler.dtype=auto", "trainer.precision=bf16-mixed", "optim.old_logp=sampler")
    assert build_optim_config(cfg).old_logp == "sampler"


@pytest.mark.parametrize(
    ("setting", "rl_steps", "eager"),
    [
        ("auto", COMPILE_MIN_STEPS - 1, True),
        ("auto", COMPILE_MIN_STEPS, False),
        ("auto", None, True),  # an evaluation engine
        ("true", COMPILE_MIN_STEPS, True),
        ("false", 1, False),
    ],
)
def test_enforce_eager_auto_compiles_long_runs_only(engine_kwargs, setting, rl_steps, eager) -> None:
    build_sampler(compose_config(f"sampler.enforce_eager={setting}"), "some/folder", rl_steps=rl_steps)
    assert engine_kwargs[-1]["enforce_eager"] is eager
    assert COMPILE_MIN_STEPS == 40  # the threshold docs/performance.md states


def test_block_size_reaches_the_engine(engine_kwargs) -> None:
    build_sampler(compose_config("sampler.block_size=32"), "some/folder")
    assert engine_kwargs[-1]["block_size"] == 32


@pytest.mark.parametrize(
    ("canary_tol", "engine", "tol"),
    [(None, "float32", 1e-3), (None, "bfloat16", 0.1), (None, "float16", 0.1), (0.05, "float32", 0.05)],
)
def test_the_canary_tolerance_follows_the_engine_unless_set(canary_tol, engine, tol) -> None:
    assert SamplerConfig(canary_tol=canary_tol).canary_tolerance(engine) == tol


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("sampler.dtype=fp8", "sampler.dtype"),
        ("sampler.enforce_eager=sometimes", "sampler.enforce_eager"),
        ("sampler.block_size=0", "sampler.block_size"),
        ("sampler.canary_tol=0", "sampler.canary_tol"),
    ],
)
def test_bad_values_are_errors_naming_the_key(override: str, key: str) -> None:
    with pytest.raises(ValueError, match="config key " + re.escape(key) + "="):
        compose_config(override)


def test_the_memory_plan_reads_dtype_auto_as_the_trainers_precision() -> None:
    from mempo.capacity.gpu_memory import model_shape, plan_inputs

    shape = model_shape("tiny")  # the plan's inputs do not depend on the model's size
    cfg = compose_config("+exp=mempo", "sampler.dtype=auto")
    assert plan_inputs(cfg, shape).engine.dtype_bytes == 2  # a GPU trains in bf16
    cfg = compose_config("+exp=mempo", "sampler.dtype=auto", "trainer.precision=32-true")
    assert plan_inputs(cfg, shape).engine.dtype_bytes == 4


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ((), "engine float32 (sampler.dtype=float32), eager (sampler.enforce_eager=true); old log-probs sampler"),
        (("+exp=grpo_cpu_40",), "(sampler.dtype=auto), compiled (sampler.enforce_eager=auto); old log-probs "),
        (("+exp=grpo_cpu_fast",), "(sampler.dtype=auto), eager (sampler.enforce_eager=auto); old log-probs "),
    ],
)
def test_the_run_prints_its_speed_switches_as_resolved(overrides: tuple[str, ...], expected: str) -> None:
    line = speed_settings_line(compose_config(*overrides))
    assert expected in line
    bf16_engine = "auto" in expected and cpu_has_bf16()  # auto: a bf16 engine where the trainer runs in bf16
    assert line.startswith("engine bfloat16" if bf16_engine else "engine float32")
    assert ("update compiled" in line) == bf16_engine  # compile_update=auto follows the recomputed old log-probs
    assert line.endswith(f"on a CPU of kind {rate_kind()}")
