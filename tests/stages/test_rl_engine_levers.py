"""The RL engine's switches for throughput: ``sampler.dtype=auto``, ``sampler.enforce_eager=auto``,
``sampler.block_size`` and ``sampler.canary_tol=null``, as the config resolves them and as build_sampler hands them to
the engine (captured, not started: the engine itself is tested in tests/rollout). Their defaults leave today's
float32, eager engine with vLLM's own block size exactly as it was."""

from __future__ import annotations

import re
from typing import Any

import pytest

import mempo.core.hardware as hardware
import mempo.rollout.vllm_sampler as vllm_sampler
from mempo.core.hardware import cpu_has_bf16, rate_kind
from mempo.rollout.sampler import COMPILE_MIN_STEPS, SamplerConfig
from mempo.stages.builders import build_optim_config, build_sampler, group, sampler_dtype, speed_settings_line
from mempo.stages.config import compose_config, resolve_precision


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


def as_cpu(monkeypatch: pytest.MonkeyPatch, flags: str, isa: str | None = None) -> None:
    """Make this process read a CPU with these /proc/cpuinfo ``flags`` (and oneDNN capped at ``isa``)."""
    monkeypatch.setattr(hardware, "cpuinfo", lambda: f"processor\t: 0\nflags\t\t: {flags}\n")
    for var in hardware.ONEDNN_ISA_VARS:
        monkeypatch.delenv(var, raising=False)
    if isa is not None:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", isa)


SAPPHIRE_RAPIDS = "fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8"
ZEN4 = "fpu avx2 avx512f avx512_bf16"
AVX2_ONLY = "fpu avx2 fma"


@pytest.mark.parametrize(
    ("flags", "isa", "precision", "engine"),
    [
        (SAPPHIRE_RAPIDS, None, "bf16-mixed", "bfloat16"),
        (SAPPHIRE_RAPIDS, "AVX512_CORE_AMX", "bf16-mixed", "bfloat16"),
        (SAPPHIRE_RAPIDS, "AVX512_CORE_BF16", "bf16-mixed", "bfloat16"),  # oneDNN capped below AMX: as a Zen 4
        (ZEN4, None, "bf16-mixed", "bfloat16"),  # bf16 matmuls 2x float32's on a real Zen 4 EPYC
        (AVX2_ONLY, None, "32-true", "float32"),
    ],
)
def test_precision_and_engine_dtype_auto_per_cpu_kind(monkeypatch, flags, isa, precision, engine) -> None:
    """trainer.precision=auto: bf16 wherever the CPU has native bf16 (from 2026-12-06 to 12-07 it was bf16 on AMX only,
    from a first look with oneDNN capped that a real Zen 4 EPYC then contradicted); sampler.dtype=auto: bf16 wherever
    the CPU has native bf16, whatever the trainer's precision."""
    as_cpu(monkeypatch, flags, isa)
    assert resolve_precision("auto", "cpu") == precision
    cfg = compose_config("sampler.dtype=auto", "+exp=grpo_cpu_fast")
    assert sampler_dtype(cfg) == engine
    optim = build_optim_config(cfg)  # a bf16 engine's log-probs are recomputed, and then the update is compiled
    assert (optim.old_logp, optim.compile_update) == (
        ("recompute", True) if engine == "bfloat16" else ("sampler", False)
    )
    assert f"in {precision} (trainer.precision=auto)" in speed_settings_line(cfg)


@pytest.mark.parametrize("precision", ["bf16-mixed", "32-true"])
def test_dtype_auto_does_not_follow_an_explicit_precision(engine_kwargs, precision) -> None:
    cfg = compose_config("sampler.dtype=auto", f"trainer.precision={precision}")
    dtype = "bfloat16" if cpu_has_bf16() else "float32"
    assert sampler_dtype(cfg) == dtype
    assert build_optim_config(cfg).old_logp == ("recompute" if dtype == "bfloat16" else "sampler")
    build_sampler(cfg, "some/folder")
    assert engine_kwargs[-1]["dtype"] == dtype


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
        ("optim.shared_prefix=sometimes", "optim.shared_prefix"),
        ("optim.head_grad_in_forward=sometimes", "optim.head_grad_in_forward"),
    ],
)
def test_bad_values_are_errors_naming_the_key(override: str, key: str) -> None:
    with pytest.raises(ValueError, match="config key " + re.escape(key) + "="):
        compose_config(override)


def test_the_memory_plan_reads_dtype_auto_as_the_targets_native_bf16() -> None:
    from mempo.capacity.gpu_memory import model_shape, plan_inputs

    shape = model_shape("tiny")  # the plan's inputs do not depend on the model's size
    for precision in ("auto", "32-true"):  # a GPU's engine runs in bf16 whatever the trainer's precision
        cfg = compose_config("+exp=mempo", "sampler.dtype=auto", f"trainer.precision={precision}")
        assert plan_inputs(cfg, shape).engine.dtype_bytes == 2
    cfg = compose_config("+exp=mempo", "sampler.dtype=float32", "trainer.precision=bf16-mixed")
    assert plan_inputs(cfg, shape).engine.dtype_bytes == 4


OFF_OFF = "shared prefix off (optim.shared_prefix=false), head gradient in backward (optim.head_grad_in_forward=false)"
ON_ON = "shared prefix on (optim.shared_prefix=auto), head gradient in forward (optim.head_grad_in_forward=auto)"


@pytest.mark.parametrize(
    ("overrides", "expected", "update_switches"),
    [
        ((), "engine float32 (sampler.dtype=float32), eager (sampler.enforce_eager=true); old log-probs s", OFF_OFF),
        (("+exp=grpo_cpu_40",), "(sampler.dtype=auto), compiled (sampler.enforce_eager=auto); old log-probs ", ON_ON),
        (("+exp=grpo_cpu_fast",), "(sampler.dtype=auto), eager (sampler.enforce_eager=auto); old log-probs ", ON_ON),
    ],
)
def test_the_run_prints_its_speed_switches_as_resolved(overrides, expected, update_switches) -> None:
    line = speed_settings_line(compose_config(*overrides))
    assert expected in line
    bf16_engine = "auto" in expected and cpu_has_bf16()  # auto: a bf16 engine where the CPU has native bf16
    assert line.startswith("engine bfloat16" if bf16_engine else "engine float32")
    assert ("update compiled" in line) == bf16_engine  # compile_update=auto follows the recomputed old log-probs
    assert update_switches in line  # auto: both on for a CPU update, unsharded, with the head frozen (top 8 layers)
    assert line.endswith(f"on a CPU of kind {rate_kind()}")
    # Each switch on alone: the line reads each from its own key.
    alone = ("optim.shared_prefix=true", "optim.head_grad_in_forward=false")
    shared = speed_settings_line(compose_config(*overrides, *alone))
    assert (
        "shared prefix on (optim.shared_prefix=true), head gradient in backward (optim.head_grad_in_forward=false)"
        in shared
    )
    alone = ("optim.shared_prefix=false", "optim.head_grad_in_forward=true")
    head = speed_settings_line(compose_config(*overrides, *alone))
    assert (
        "shared prefix off (optim.shared_prefix=false), head gradient in forward (optim.head_grad_in_forward=true)"
        in head
    )


@pytest.mark.parametrize(
    ("overrides", "shared", "head"),
    [
        ((), False, False),  # the default recipe leaves them off
        (("+exp=grpo_cpu",), False, False),  # and the main job's RL recipe
        (("+exp=grpo_cpu_fast",), True, True),  # a CPU update, unsharded, the head frozen (model.train_top_layers=8)
        (("+exp=grpo_cpu_fast", "model.train_top_layers=null"), True, False),  # every layer trains: the head too
        (("+exp=grpo_cpu_fast", "model.train_top_layers=null", "model.lora.rank=8"), True, True),  # LoRA: base frozen
        (("+exp=grpo_cpu_fast", "trainer=gpu"), False, False),  # not measured on GPUs: auto leaves them off
        (("+exp=grpo_cpu_fast", "trainer=fsdp"), False, False),  # sharded
        (("+exp=grpo_cpu_fast", "optim.shared_prefix=false"), False, True),  # each auto resolves on its own
    ],
)
def test_the_update_switches_auto_resolve_by_where_the_update_runs(overrides, shared: bool, head: bool) -> None:
    optim = build_optim_config(compose_config(*overrides))
    assert (optim.shared_prefix, optim.head_grad_in_forward) == (shared, head)


@pytest.mark.parametrize(
    ("flags", "kind", "precision", "expected"),
    [
        (ZEN4, "avx512_bf16", "auto", "AVX512-BF16 without AMX; trains in bf16, trainer.precision=auto"),
        (ZEN4, "avx512_bf16", "32-true", "AVX512-BF16 without AMX; trains in float32, trainer.precision=32-true"),
        (AVX2_ONLY, "avx2", "auto", "no AVX512-BF16; trains in float32, trainer.precision=auto"),
        (SAPPHIRE_RAPIDS, "amx", "auto", "AMX; trains in bf16, trainer.precision=auto"),
    ],
)
def test_the_time_estimate_names_the_precision_the_run_trains_in(monkeypatch, flags, kind, precision, expected):
    """The console's expected-time line said "trains in bf16" on every AVX512-BF16 CPU while auto was float32 there
    (seen on a Zen 4 EPYC): the label follows trainer.precision as this run resolves it."""
    from mempo.stages.steps import kind_label

    as_cpu(monkeypatch, flags)
    assert kind_label(kind, compose_config(f"trainer.precision={precision}")) == expected
