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


# ----------------------------------------------------------------------------------------------- rl_throughput
def rl_rows(walls: list[float], *, val_step: int, val_s: float, ckpt_s: float) -> tuple[dict, list[dict[str, float]]]:
    """A side's console timings and metrics.csv rows: every step generates 20 s at 10 tok/s and updates 12 s over
    600 tokens; step ``val_step`` also validates (``val_s``) and, after its metrics row, checkpoints (``ckpt_s``)."""
    rows = []
    for k, wall in enumerate(walls, start=1):
        r = {"step": k, "perf/generate_s": 20.0, "perf/gen_tok_per_s": 10.0, "perf/update_s": 12.0,
             "perf/update_tokens": 600.0, "perf/push_s": 1.0, "rollout/reward_mean": 0.5}  # fmt: skip
        if k == val_step:
            r |= {"perf/validation_s": val_s, "val/em": 0.25}
        r["perf/step_s"] = wall - (ckpt_s if k == val_step else 0.0)
        rows.append(r)
    console = {"steps": dict(enumerate(walls, start=1)), "startup_s": 30.0, "wall_s": 30.0 + sum(walls) + 5.0,
               "tail_s": 5.0}  # fmt: skip
    return console, rows


def test_rl_throughput_figures_keep_the_warm_up_and_the_validating_step_apart():
    from benchmarks.rl_throughput import summarize

    console, rows = rl_rows([90.0, 40.0, 44.0, 80.0], val_step=4, val_s=25.0, ckpt_s=7.0)
    f = summarize(console, rows, rollouts_per_step=32)
    assert f["warmup_step_s"] == 90.0 and f["steady_steps"] == [2, 3]
    assert f["steady_step_s"] == 42.0
    assert abs(f["rollouts_per_h_steady"] - 3600 * 32 / 42.0) < 1e-9
    assert abs(f["rollouts_per_h_measured"] - 3600 * 32 * 3 / 164.0) < 1e-9  # steps 2-4: 40 + 44 + 80 s
    assert abs(f["rollouts_per_h_run"] - 3600 * 32 * 4 / (30 + 254 + 5)) < 1e-9  # start-up and export included
    assert f["gen_tok_per_s"] == 10.0 and f["update_tok_per_s"] == 50.0  # 600 tokens in 12 s
    assert abs(f["shares"]["validation"] - 25 / 164) < 1e-9 and abs(f["shares"]["checkpoint"] - 7 / 164) < 1e-9
    assert abs(f["shares"]["generate"] - 60 / 164) < 1e-9
    other = (40 - 33) + (44 - 33) + (80 - 33 - 25 - 7)  # each step less generate 20, update 12, push 1, val, ckpt
    assert abs(f["shares"]["other"] - other / 164) < 1e-9
    assert abs(sum(f["shares"].values()) - 1.0) < 1e-9


def test_rl_throughput_reads_validation_of_a_commit_that_did_not_time_it():
    from benchmarks.rl_throughput import summarize

    console, rows = rl_rows([90.0, 40.0, 44.0, 80.0], val_step=4, val_s=25.0, ckpt_s=7.0)
    del rows[3]["perf/validation_s"]  # an older commit: only val/em says the step validated
    f = summarize(console, rows, rollouts_per_step=32)
    assert f["steps"][3]["phases"]["validation"] == 80.0 - 7.0 - 33.0  # the row's time less every timed phase
    assert f["steady_steps"] == [2, 3]


def test_rl_throughput_parses_the_console_line_rl_progress_prints():
    from types import SimpleNamespace

    from benchmarks.rl_throughput import STEP_LINE
    from mempo.models.callbacks import RLProgress

    module = SimpleNamespace(last_metrics={"rollout/reward_mean": 0.5, "rollout/em_mean": 0.25, "val/em": 0.125})
    line = RLProgress(4).line(SimpleNamespace(), module, 3, 51.84)
    m = STEP_LINE.search(line)
    assert m and (m.group(1), m.group(2), float(m.group(3))) == ("3", "4", 51.8)


def test_rl_throughput_table_puts_two_sides_and_their_ratio_side_by_side():
    from benchmarks.rl_throughput import table

    def side(label: str, short: str, rate: float, gap: float | None) -> dict:
        figs = {"rollouts_per_h_steady": rate, "steady_step_s": 3600 * 32 / rate, "rollout/engine_logp_gap": gap}
        return {"label": label, "commit": {"short": short}, "figures": figs}

    lines = table([side("base", "5cf6635", 1000.0, None), side("candidate", "abc1234", 2500.0, 0.02)]).splitlines()
    assert lines[0] == "| figure | base (5cf6635) | candidate (abc1234) | ratio |"
    rows = {ln.split(" | ")[0].lstrip("| "): ln for ln in lines[2:]}
    assert rows["rollouts/h (steady)"] == "| rollouts/h (steady) | 1000 | 2500 | 2.50x |"
    assert rows["steady step s"] == "| steady step s | 115.2 | 46.1 | 0.40x |"
    assert rows["engine logp gap"] == "| engine logp gap | n/a | 0.0200 |  |"  # the base did not log it
    assert all(ln.count("|") == 5 for ln in lines)  # no cell breaks the markdown table


def test_rl_throughput_command_line_and_arguments():
    from benchmarks.rl_throughput import QUICK, side_command

    cmd = side_command("/w/hf", Path("/r"), 4, 1, True, ["sampler.dtype=auto"])
    assert cmd[1:3] == ["experiments/run.py", "+exp=grpo_cpu"]
    assert {"trainer.max_steps=4", "eval.every_n_steps=4", "ckpt.every_n_steps=4", "seed=1"} <= set(cmd)
    assert cmd[-1] == "sampler.dtype=auto" and cmd[-1 - len(QUICK) : -1] == QUICK  # the side's own word is last
    for argv, message in (
        (["--steps", "2"], "--steps 2: at least 3"),
        (["--overrides", "sampler.dtype"], "--overrides 'sampler.dtype': each override is KEY=VALUE"),
        (["--commits", "5cf6635"], "expected 2 arguments"),
    ):
        out = python("-m", "benchmarks.rl_throughput", *argv)
        assert out.returncode == 2 and message in out.stderr, out.stderr


@pytest.mark.slow
def test_rl_throughput_runs_two_sides_of_a_tiny_recipe(tmp_path):
    """The real entry point, twice (this checkout on both sides, the candidate with one more key), on the tiny model
    with HF sampling and a few tokens: the JSON holds both sides' figures and the table their ratio."""
    size = ["sampler=hf", "model.train_top_layers=2", "sampler.max_new_tokens=8", "agent.max_turns=1",
            "data.group_size=2", "data.num_val_tasks=1"]  # fmt: skip
    out = python("-m", "benchmarks.rl_throughput", "--quick", "--warm-start", "tiny", "--commits", ".", ".",
                 "--set", *size, "--overrides", "sampler.canary_every=1", "--json", str(tmp_path / "r.json"),
                 timeout=600)  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads((tmp_path / "r.json").read_text())
    base, cand = result["sides"]
    assert cand["overrides"][-1] == "sampler.canary_every=1" and "sampler.canary_every=1" not in base["overrides"]
    for s in (base, cand):
        f = s["figures"]
        assert f["steady_steps"] == [2] and [st["step"] for st in f["steps"]] == [1, 2, 3]
        assert f["rollouts_per_h_steady"] > 0 and f["steps"][2]["phases"]["validation"] > 0
    assert result["machine"]["cpu_kind"] in ("avx512_bf16", "avx2") and "| ratio |" in result["table"]
    assert result["machine"]["rate_kind"] in ("amx", "avx512_bf16", "avx2")
    for s in (base, cand):  # each run's own line of its resolved speed switches, carried into the JSON and printed
        assert s["settings"].startswith("sampler hf; old log-probs sampler (optim.old_logp=auto); update eager")
        assert f"{s['label']} ({s['commit']['short']}): {s['settings']}" in out.stdout


def test_turn_occupancy_counts_the_synchronous_loop_s_decode_steps(tmp_path):
    import torch

    from benchmarks.turn_occupancy import batch_figures, main

    # by hand: rollouts of 10 + 20 and 30 tokens; the loop decodes max(10, 30) + 20 = 50 steps for 60 tokens in 2 rows
    # (occupancy 60 / 100), and the longest rollout alone needs 30 (50 / 30)
    torch.testing.assert_close(batch_figures([[10, 20], [30]]), (0.6, 50 / 30))
    traces = ([10, 20], [30])
    rows = [{"checkpoint": "c", "agent": "memory", "objectives": 2, "task_id": f"val-n2-{i}",
             "trace": [{"generated_tokens": g} for g in t]} for i, t in enumerate(traces)]  # fmt: skip
    (tmp_path / "results.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    main([str(tmp_path / "results.jsonl"), "--batch", "2"])
    with pytest.raises(SystemExit, match="no rows of checkpoint 'x'"):
        main([str(tmp_path / "results.jsonl"), "--checkpoint", "x"])


def test_engine_split_counts_the_linear_weights_and_splits_a_decode_step(tiny_policy):
    import torch

    from benchmarks.engine_split import figures, linear_params, split

    model, _ = tiny_policy
    decoder, head = linear_params(model.config.to_dict())
    linears = [m for m in model.get_decoder().modules() if isinstance(m, torch.nn.Linear)]
    assert decoder == sum(m.weight.numel() for m in linears)  # counted from the module tree, not the config
    assert head == model.get_output_embeddings().weight.numel()
    # by hand: 10 decode steps that took 3.0 - 1.0 s; B = 4 rows of 100 prompt tokens, 1,000 + 200 weights, bf16
    assert split(1.0, 3.0, 10) == pytest.approx(0.2)
    got = figures(4, 100, 1.0, 0.2, decoder=1000, head=200, bytes_per_weight=2)
    assert got["prefill_tok_per_s"] == pytest.approx(400)
    assert got["prefill_gflops"] == pytest.approx((2 * 1000 * 400 + 2 * 200 * 4) / 1e9)
    assert got["decode_tok_per_s"] == pytest.approx(20) and got["decode_step_ms"] == pytest.approx(200)
    assert got["decode_gflops"] == pytest.approx(2 * 1200 * 4 / 0.2 / 1e9)
    assert got["decode_weight_gb_per_s"] == pytest.approx(1200 * 2 / 0.2 / 1e9)
    with pytest.raises(ValueError, match="decode_tokens"):
        split(1.0, 3.0, 0)
