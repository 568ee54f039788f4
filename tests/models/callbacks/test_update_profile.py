"""``host.profile_update_steps``: the update of chosen RL steps under ``torch.profiler``, summed by phase and operator
family (``mempo.models.profiling``). The sums are checked by hand on made-up events; the wiring on a tiny RL run
(planted: the module's labels or its profiler hook removed -> the run test fails)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from mempo.models.profiling import (
    PHASE_BACKWARD,
    PHASE_FORWARD,
    PHASE_LOGP,
    PHASE_OPTIMIZER,
    UpdateProfiler,
    markdown,
    operator_family,
    summarize,
)
from mempo.stages.config import HostConfig
from mempo.stages.train import fit_rl


def event(name: str, start: float, self_us: float, shapes: list | None = None, end: float | None = None) -> object:
    return SimpleNamespace(
        name=name,
        time_range=SimpleNamespace(start=start, end=start + 1 if end is None else end),
        self_cpu_time_total=self_us,
        input_shapes=shapes or [],
    )


def test_families_by_name_and_shape() -> None:
    vocab = 50
    assert operator_family("aten::mm", [[4, 8], [8, 16]], vocab) == "matmul"
    assert operator_family("aten::addmm", [[16], [4, 8], [8, 16]], vocab) == "matmul"
    assert operator_family("aten::mm", [[4, 8], [8, 50]], vocab) == "lm_head"  # as wide as the vocabulary
    assert operator_family("aten::_log_softmax_backward_data", [[4, 50]], vocab) == "lm_head"
    assert operator_family("aten::_scaled_dot_product_flash_attention_for_cpu", [], vocab) == "attention"
    assert operator_family("aten::_to_copy", [[4, 8]], vocab) == "casts"
    assert operator_family("CompiledFunctionBackward", [], vocab) == "fused_compiled"
    assert operator_family("## Call CompiledFxGraph fabc ##", [], vocab) == "fused_compiled"
    assert operator_family("aten::mul", [[4, 8], [4, 8]], vocab) == "elementwise"
    # the log-softmax's element-wise work on the [chunk, V] logits (logsumexp's sub and exp, the cast, the temperature)
    assert operator_family("aten::sub", [[4, 50], [4, 1]], vocab) == "lm_head"
    assert operator_family("aten::copy_", [[4, 50], [4, 50]], vocab) == "lm_head"
    assert operator_family("MmBackward0", [[4, 8]], vocab) == "overhead"


def test_self_times_go_to_the_phase_that_contains_them() -> None:
    events = [
        event(PHASE_FORWARD, 0, 3, end=100),
        event("aten::mm", 10, 30, [[4, 8], [8, 16]]),
        event("aten::copy_", 20, 5, [[4, 8], [4, 8]]),
        event(PHASE_BACKWARD, 200, 4, end=400),
        event("aten::mm", 210, 50, [[4, 50], [50, 8]]),
        event("CompiledFunctionBackward", 250, 70),
        event("aten::mul", 500, 7),  # after every phase
    ]
    s = summarize(events, vocab_size=50)
    # by hand, in seconds: forward 3 (label) + 30 + 5; backward 4 + 50 + 70; other 7
    assert s["families"] == {
        PHASE_FORWARD: {"overhead": 3e-6, "matmul": 30e-6, "casts": 5e-6},
        PHASE_BACKWARD: {"overhead": 4e-6, "lm_head": 50e-6, "fused_compiled": 70e-6},
        "other": {"elementwise": 7e-6},
    }
    assert s["phases"] == pytest.approx({PHASE_FORWARD: 38e-6, PHASE_BACKWARD: 124e-6, "other": 7e-6})
    assert s["total_s"] == pytest.approx(169e-6)
    # operators by self time over all phases: the two aten::mm (one a matmul, one the LM head's) stay apart
    assert [(n, f, c) for n, f, _, c in s["top"][:3]] == [
        ("CompiledFunctionBackward", "fused_compiled", 1), ("aten::mm", "lm_head", 1), ("aten::mm", "matmul", 1)
    ]  # fmt: skip
    assert s["top"][0][2] == pytest.approx(70e-6)
    table = markdown(s)
    # by hand: families in FAMILIES order (those that occur) x the phases that occur; shares of 169 us
    assert table.splitlines() == [
        "| family | forward | backward | between | all | share |",
        "| --- | --- | --- | --- | --- | --- |",
        "| matmul | 0.00 | 0.00 | 0.00 | 0.00 | 18% |",
        "| lm_head | 0.00 | 0.00 | 0.00 | 0.00 | 30% |",
        "| casts | 0.00 | 0.00 | 0.00 | 0.00 | 3% |",
        "| fused_compiled | 0.00 | 0.00 | 0.00 | 0.00 | 41% |",
        "| elementwise | 0.00 | 0.00 | 0.00 | 0.00 | 4% |",
        "| overhead | 0.00 | 0.00 | 0.00 | 0.00 | 4% |",
        "| all | 0.00 | 0.00 | 0.00 | 0.00 | |",
    ]


def test_steps_are_checked() -> None:
    with pytest.raises(ValueError, match="host.profile_update_steps"):
        HostConfig(profile_update_steps=[0])
    with pytest.raises(ValueError, match="host.profile_update_steps"):
        UpdateProfiler([0], Path("unused"))


RUN = [
    "model=tiny", "data.batch_size=2", "data.group_size=2", "agent.max_turns=2", "sampler.max_new_tokens=12",
    "sampler=hf", "trainer.precision=32-true", "ckpt.every_n_steps=5", "eval.every_n_steps=0", "trainer.max_steps=2",
    "loss.kl_coef=0.01",  # a KL term: every row is updated, whatever the tiny model's rewards
    "optim.old_logp=recompute",  # the old log-probs' own no-grad forward, a phase of its own
    "optim.fuse_old_logp=false",
]  # fmt: skip


def test_the_chosen_step_is_profiled_phase_by_phase(make_cfg, tmp_path: Path) -> None:
    run_dir = tmp_path / "rl"
    fit_rl(make_cfg(*RUN, "host.profile_update_steps=[2]", f"run_dir={run_dir}"))
    assert sorted(p.name for p in (run_dir / "profile").iterdir()) == ["update_step2.json"]
    record = json.loads((run_dir / "profile" / "update_step2.json").read_text())
    assert record["step"] == 2 and record["update_tokens"] > 0
    assert record["settings"]["precision"] == "32-true" and record["settings"]["compile_update"] is False
    phases = record["phases"]
    for phase in (PHASE_LOGP, PHASE_FORWARD, PHASE_BACKWARD, PHASE_OPTIMIZER):
        assert phases[phase] > 0, (phase, phases)
    families = record["families"]
    assert families[PHASE_FORWARD]["matmul"] > 0 and families[PHASE_FORWARD]["lm_head"] > 0
    assert families[PHASE_BACKWARD]["matmul"] > 0 and families[PHASE_BACKWARD]["lm_head"] > 0
    # self times inside the profiled span: no more than the wall time of the phases it wraps
    assert record["total_s"] <= record["update_s"] + record["logp_s"]
    # the labels wrap the model's work: no matmul or LM head outside every phase (not a share of time, which varies)
    assert not {"matmul", "lm_head"} & set(families.get("other", {})), families.get("other")
