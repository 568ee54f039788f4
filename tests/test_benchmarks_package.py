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
    files = [ROOT / "README.md", ROOT / ".ci" / "run", *(ROOT / "docs").glob("*.md"), *(ROOT / "scripts").glob("*")]
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
    """A side's result as its child process writes it: one warm-up step, then the timed ones."""
    steps = [{"s": s, "tokens": tokens, "tasks": [f"task{i}"]} for i, s in enumerate(seconds)]
    for st in steps if split else []:
        st["split"] = {"generate": st["s"] / 4}
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


@pytest.mark.parametrize(("steps", "verdict"), [(3, "met"), (1, "1 timed step(s): the target is judged on the median")])
def test_the_suite_judges_the_trl_target_on_a_median_of_at_least_3_steps(steps, verdict):
    trl = {"ratio": 0.458, "ratio_range": [0.333, 0.636], "timed_steps": steps, "quick": False}
    rows = dict(call("benchmarks.run:target_rows", {"trl": trl}))
    assert rows["trl.ratio <= 0.5"].startswith(f"0.458 (range 0.333-0.636): {verdict}")


def test_the_trl_comparison_times_3_steps_by_default_and_warns_below():
    assert "(default 3)" in " ".join(python("-m", "benchmarks.trl_compare", "--help").stdout.split())
    out = python("-m", "benchmarks.trl_compare", "--steps", "0")
    assert out.returncode == 2 and "--steps must be at least 1" in out.stderr
    out = run_without(["trl"], ["--quick", "--steps", "2"])  # stops at the missing extra, after the warning
    assert out.returncode == 1 and "warning: --steps 2: fewer than 3 timed steps" in out.stdout, out.stdout
