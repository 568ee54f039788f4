"""benchmarks/ is a package: every script runs as ``python -m benchmarks.<name>`` from the repository root with no
path edits, and the TRL comparison names the command that installs its optional dependencies when they are missing.

Each check runs a fresh interpreter in the repository root without PYTHONPATH, as a user would; nothing here loads a
model (the missing-dependency checks fail before the benchmark starts).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
SCRIPTS = sorted(p.stem for p in BENCH.glob("*.py") if p.stem not in ("__init__", "common"))
INSTALL = "MEMPO_BENCH=1 bash scripts/setup.sh"
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def python(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout)


def run_without(modules: list[str], argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``python -m benchmarks.trl_compare *argv`` with ``modules`` made unimportable (None in sys.modules)."""
    code = (
        "import runpy, sys\n"
        f"sys.modules.update(dict.fromkeys({modules!r}))\n"
        f"sys.argv = ['trl_compare', *{argv!r}]\n"
        "runpy.run_module('benchmarks.trl_compare', run_name='__main__', alter_sys=True)\n"
    )
    return python("-c", code, timeout=60)


def test_the_scripts_are_a_package_without_path_edits():
    assert (BENCH / "__init__.py").is_file()
    assert {"run", "trl_compare", "step_time", "logprob_memory", "sampler_throughput"} <= set(SCRIPTS)
    for path in BENCH.glob("*.py"):
        text = path.read_text()
        assert "sys.path" not in text, path
        assert not re.search(r"^from common import|^import common", text, re.M), path


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_script_runs_as_a_module(name):
    out = python("-m", f"benchmarks.{name}", "--help")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"usage: python -m benchmarks.{name}"), out.stdout


def test_the_suite_runs_its_sections_as_modules():
    code = "import json, benchmarks.run as r; print(json.dumps(list(r.SECTIONS.values())))"
    out = python("-c", code)
    assert out.returncode == 0, out.stderr
    modules = json.loads(out.stdout)
    assert modules and all(m.startswith("benchmarks.") and m.removeprefix("benchmarks.") in SCRIPTS for m in modules)


def test_no_python_benchmarks_path_invocation_is_documented():
    files = [ROOT / "README.md", ROOT / ".ci" / "run", *(ROOT / "docs").glob("**/*.md"), *(ROOT / "scripts").glob("*")]
    files += [*BENCH.glob("*.py"), *(ROOT / "tests").rglob("*.py")]
    for path in files:
        assert not re.search(r"python\S*\s+(\S*/)?benchmarks/\w+\.py", path.read_text()), path


def test_the_install_command_is_the_one_setup_sh_uses():
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert re.search(r'MEMPO_BENCH:-0}" = "1" \] && EXTRAS="\$EXTRAS,bench"', setup)
    assert re.search(r'^bench = \["trl', (ROOT / "pyproject.toml").read_text(), re.M)


@pytest.mark.parametrize("missing", ["trl", "datasets"])
def test_a_missing_bench_extra_stops_the_comparison_at_start_naming_the_install_command(missing):
    out = run_without([missing], ["--quick"])
    assert out.returncode == 1
    assert f"needs the bench extra (trl, datasets): run {INSTALL}" in out.stderr, out.stderr
    assert re.search(rf"\(not installed: [^)]*\b{missing}\b", out.stderr), out.stderr
    assert "Traceback" not in out.stderr and "running mempo" not in out.stdout  # stopped before the mempo side


def test_a_trl_side_without_the_bench_extra_names_the_install_command(tmp_path):
    settings = tmp_path / "settings.json"
    settings.write_text("{}")
    argv = ["--side", "trl:hf", "--settings", str(settings), "--work", str(tmp_path)]
    out = run_without(["trl", "datasets"], argv)
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]  # the line benchmarks.common.run_child reports as the cause
    assert last.startswith("ImportError: benchmarks.trl_compare needs the bench extra"), out.stderr
    assert INSTALL in last


def call(function: str, *args: object) -> object:
    """``function(*args)`` (``module:name``) in a fresh interpreter in the repository root, through JSON."""
    module, name = function.split(":")
    code = f"import json, sys; from {module} import {name} as f; print(json.dumps(f(*json.loads(sys.argv[1]))))"
    out = python("-c", code, json.dumps(args))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


def side(seconds: list[float], tokens: int, split: bool = False) -> dict[str, object]:
    """A side's result as its child process writes it: one warm-up step, then the timed ones, each of which changed
    the weights (and recorded its update time, mempo, or its optimizer steps, TRL)."""
    steps = [{"s": s, "tokens": tokens, "tasks": [f"task{i}"], "updated": True} for i, s in enumerate(seconds)]
    for st in steps:
        st |= {"split": {"generate": st["s"] / 4}, "update_s": st["s"] / 2} if split else {"optimizer_steps": 1}
    return {"steps": steps}


def test_the_trl_comparison_reports_medians_and_ranges_of_the_timed_steps():
    mempo = side([50, 10, 14, 11], 40, split=True)  # the 50 s warm-up is not timed
    trl = {
        "hf": side([60, 24, 30, 22], 48),
        "hf_gc": side([70, 21, 26, 27], 48),  # the fastest single step, but not the lowest median
        "vllm": {"error": "AttributeError: 'Parameter' object has no attribute 'weight_loader'"},
    }
    r = call("benchmarks.trl_compare:compare", mempo, trl, {"K": 2, "G": 4, "max_new_tokens": 32, "steps": 4})
    assert (r["mempo_step_s"], r["mempo_step_range_s"], r["mempo_steps_s"]) == (11, [10, 14], [10, 14, 11])
    assert (r["trl_config"], r["trl_step_s"], r["trl_step_range_s"], r["trl_steps_s"]) == (
        "hf",
        24,
        [22, 30],
        [24, 30, 22],
    )
    assert r["ratio"] == round(11 / 24, 3)
    assert r["ratio_range"] == [round(10 / 30, 3), round(14 / 22, 3)]
    assert r["trl_runs"] == {"hf": 24, "hf_gc": 26, "vllm": trl["vllm"]["error"]}
    assert r["trl_vllm_error"] == trl["vllm"]["error"]
    assert r["trl_steps_s_by_config"] == {"hf": [24, 30, 22], "hf_gc": [21, 26, 27]}
    assert (r["timed_steps"], r["warmup_steps"], r["mempo_gen_tokens"], r["trl_gen_tokens"]) == (3, 1, 120, 144)
    assert r["mean_completion_tokens"] == {"mempo": 5.0, "hf": 6.0, "hf_gc": 6.0}
    assert r["mempo_split"] == {"generate": round((10 + 14 + 11) / 4 / 3, 3)}


@pytest.mark.parametrize(
    ("steps", "span", "verdict"),
    [
        (3, [0.333, 0.482], "met"),
        (3, [0.333, 0.636], "inconclusive: the range of its repeats spans the target (met by the median)"),
        (1, [0.333, 0.482], "1 timed step(s): the target is judged on the median"),
    ],
)
def test_the_suite_judges_the_trl_target_on_a_median_of_at_least_3_steps_whose_range_clears_it(steps, span, verdict):
    trl = {"ratio": 0.458, "ratio_range": span, "timed_steps": steps, "quick": False}
    rows = dict(call("benchmarks.run:target_rows", {"trl": trl}))
    assert rows["trl.ratio <= 0.5"].startswith(f"0.458 (range {span[0]:.3g}-{span[1]:.3g}): {verdict}")


def test_the_sampler_target_is_inconclusive_when_its_repeats_straddle_it():
    sampler = {"vllm_vs_raw": 0.96, "vllm_vs_raw_range": [0.87, 1.05], "quick": False}
    rows = dict(call("benchmarks.run:target_rows", {"sampler": sampler}))
    assert rows["sampler.vllm_vs_raw >= 0.9"].startswith("0.96 (range 0.87-1.05): inconclusive")
    rows = dict(call("benchmarks.run:summary_rows", {"sampler": sampler | {"repeats": 5}}))
    assert (rows["sampler.vllm_vs_raw_range"], rows["sampler.repeats"]) == ("0.87-1.05", "5")


@pytest.mark.parametrize(
    ("which", "change", "problem"),
    [
        ("mempo", {"updated": False}, "mempo: timed step 2: the weights did not change"),
        ("mempo", {"update_s": 0.001}, "mempo: timed step 2: update took 0.0010 s (< 0.05 s: skipped)"),
        ("trl", {"optimizer_steps": 0}, "trl:hf: timed step 2: the optimizer did not step"),
        ("trl", {"updated": False}, "trl:hf: timed step 2: the weights did not change"),
    ],
)
def test_a_comparison_in_which_a_side_skipped_an_update_is_refused(which, change, problem):
    from benchmarks.trl_compare import SkippedWorkError, compare

    mempo, trl = side([50, 10, 14, 11], 40, split=True), {"hf": side([60, 24, 30, 22], 48)}
    (mempo if which == "mempo" else trl["hf"])["steps"][2] |= change
    with pytest.raises(SkippedWorkError, match="no ratio is reported") as e:
        compare(mempo, trl, {"K": 2, "G": 4, "max_new_tokens": 32, "steps": 4})
    assert problem in str(e.value)


@pytest.mark.slow
def test_the_mempo_side_records_a_skipped_update_and_the_comparison_refuses_it(tiny_path, tmp_path):
    """The real mempo side on a small config (the tiny model, HF sampling). With GRPO on the task reward, which the
    random model never earns, and ``skip_no_signal`` (the training default) its steps update nothing: the recorded
    steps say so and the comparison is refused. With the benchmark's own settings every step updates."""
    from benchmarks.trl_compare import SkippedWorkError, compare, run_mempo

    small = [f"model.name_or_path={tiny_path}", "sampler=hf", "trainer.precision=32-true", "+debug=default",
             "eval.every_n_steps=0"]  # fmt: skip
    s = {"K": 2, "G": 2, "max_new_tokens": 8, "steps": 2}
    skipped = run_mempo(s | {"overrides": [*small, "advantage.estimator=grpo", "optim.skip_no_signal=true"]},
                        str(tmp_path / "grpo"))  # fmt: skip
    assert [st["updated"] for st in skipped["steps"]] == [False, False]
    assert all(st["update_s"] < 0.05 and st["reward_mean"] == 0 for st in skipped["steps"])
    trl = side([60, 24], 48)  # a TRL side that did its work, on the same tasks
    for st, m in zip(trl["steps"], skipped["steps"]):
        st["tasks"] = m["tasks"]
    with pytest.raises(SkippedWorkError, match="mempo: timed step 1: the weights did not change"):
        compare(skipped, {"hf": trl}, s)
    ran = run_mempo(s | {"overrides": small}, str(tmp_path / "bench"))
    assert [st["updated"] for st in ran["steps"]] == [True, True]
    assert min(st["update_s"] for st in ran["steps"]) > max(st["update_s"] for st in skipped["steps"])


def test_both_sides_train_on_the_same_alternating_pattern():
    import torch

    from benchmarks.trl_compare import ALTERNATING, alternating_rewards, register_alternating
    from mempo.losses import ADVANTAGE_ESTIMATORS, AdvantageConfig, AdvantageInputs, MemoryConfig

    assert alternating_rewards(8, 4) == [1.0, 0.0, 1.0, 0.0] * 2  # TRL: a prompt's G completions side by side
    register_alternating()
    register_alternating()  # once per process
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    x = AdvantageInputs(
        rewards=torch.zeros(8), group_ids=groups, traj_ids=torch.arange(8), turn_ids=torch.zeros(8, dtype=torch.long),
        mem_rewards=torch.zeros(8), mem_valid=torch.zeros(8, dtype=torch.bool),
        response_mask=torch.ones(8, 3, dtype=torch.bool), mem_mask=torch.zeros(8, 3, dtype=torch.bool),
    )  # fmt: skip
    adv = ADVANTAGE_ESTIMATORS[ALTERNATING](x, MemoryConfig(), AdvantageConfig())[:, 0]
    # rewards 1, 0, 1, 0 per group: mean 0.5, sample std 0.5774 -> z-scores +-0.866 (GRPO's, as TRL's)
    torch.testing.assert_close(adv, torch.tensor([0.866, -0.866] * 4), rtol=0, atol=1e-3)


def test_plan_vs_measured_refuses_mixed_up_arguments():
    for argv, message in [
        (["--device", "cuda", "--rows", "2"], "--rows: CPU mode only"),
        (["--set", "optim.micro_batch_size=2"], "--set: recipe mode only"),
        (["--recipes", "+exp=mempo_1gpu", "--set", "optim.micro_batch_size"], "--set takes KEY=VALUE overrides"),
    ]:
        out = python("-m", "benchmarks.plan_vs_measured", *argv)
        assert out.returncode == 2 and message in out.stderr, (argv, out.stderr)


def test_plan_vs_measured_cuda_mode_without_a_gpu_says_so():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: scripts/gpu_smoke.sh runs the CUDA mode")
    out = python("-m", "benchmarks.plan_vs_measured", "--device", "cuda", "--recipes", "+exp=mempo_1gpu")
    assert out.returncode == 1
    assert "--device cuda: torch sees no CUDA device here" in out.stdout, out.stdout


def test_plan_vs_measured_recipe_mode_on_the_cpu(tiny_path, tmp_path):
    """The CUDA mode's code on the CPU: both 1-GPU recipes over the tiny model's shape, a small micro-batch; the
    built policy has the plan's parameter counts and every term is reported."""
    result = tmp_path / "result.json"
    small = [f"model.name_or_path={tiny_path}", "optim.micro_batch_size=1", "agent.max_context_tokens=64",
             "sampler.max_new_tokens=8"]  # fmt: skip
    out = python("-m", "benchmarks.plan_vs_measured", "--recipes", "+exp=mempo_1gpu", "+exp=mempo_1gpu_lora",
                 "--set", *small, "--json", str(result), timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    rows = json.loads(result.read_text())["results"]
    assert [(r["recipe"], r["lora_rank"]) for r in rows] == [("+exp=mempo_1gpu", 0), ("+exp=mempo_1gpu_lora", 32)]
    for r in rows:
        assert (r["params_built"], r["trainable_built"]) == (r["params_planned"], r["trainable_planned"])
        assert (r["rows"], r["length"], r["scored"], r["tokens"]) == (1, 64, 8, 63)
        assert set(r["plan"]) == set(r["measured"]) == {"params", "state", "cache", "compute", "step", "trainer_side"}
        assert r["plan"]["cache"] == 0 and r["precision"] == "bf16-mixed" and r["checkpointing"]
        assert r["measured"]["params"] > 0 and r["fwd_bwd_s"] > 0
        assert set(r["default_cache"]) == {"held_after_backward", "state_in_region"}
    for label in ("grads + AdamW moments", "weight casts + activations + logits", "trainer side, update phase"):
        assert out.stdout.count(label) == 2, out.stdout
    assert out.stdout.count("parameters built") == 2 and "equal" in out.stdout
