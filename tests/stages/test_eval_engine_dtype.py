"""eval.engine_dtype: the evaluation engine's dtype, ``auto`` resolved by whether training runs in bf16, and what
build_sampler hands the vLLM engine (captured, not started: the engine itself is tested in tests/rollout)."""

from __future__ import annotations

from typing import Any

import pytest

import mempo.rollout.vllm_sampler as vllm_sampler
from mempo.eval.compare import EvalConfig
from mempo.stages.builders import build_sampler
from mempo.stages.config import compose_config
from mempo.stages.evaluate import engine_dtype


@pytest.mark.parametrize(
    ("setting", "bf16", "expected"),
    [("auto", True, "bfloat16"), ("auto", False, "float32"), (None, True, None), ("float32", True, "float32")],
)
def test_engine_dtype(setting: str | None, bf16: bool, expected: str | None) -> None:
    assert engine_dtype(EvalConfig(engine_dtype=setting), bf16) == expected


def test_build_sampler_gives_the_engine_the_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict[str, Any]] = []
    monkeypatch.setattr(vllm_sampler, "VLLMSampler", lambda path, **kw: seen.append(kw))
    cfg = compose_config()  # sampler.dtype float32
    build_sampler(cfg, "some/folder", dtype="bfloat16")
    build_sampler(cfg, "some/folder")
    assert [kw["dtype"] for kw in seen] == ["bfloat16", "float32"]


def test_an_unknown_engine_dtype_is_an_error_naming_the_key() -> None:
    with pytest.raises(ValueError, match=r"eval\.engine_dtype"):
        compose_config("eval.engine_dtype=fp8")
