"""RL rollouts per hour of ``+exp=grpo_cpu``, by phase, one commit or two side by side.

    python -m benchmarks.rl_throughput --warm-start runs/demo/sft/hf                    # this checkout, 4 steps
    python -m benchmarks.rl_throughput --warm-start runs/demo/sft/hf --commits 5cf6635 HEAD
    python -m benchmarks.rl_throughput --commits 5cf6635 HEAD --overrides sampler.dtype=float32   # one lever
    python -m benchmarks.rl_throughput --quick                                          # a smoke run (minutes)

Each side runs the real entry point, ``experiments/run.py +exp=grpo_cpu``, for ``--steps`` RL steps (default 4) from
``--warm-start`` (an HF folder; default: runs/demo/sft/hf when it exists, else the SmolLM2 base, which rolls out
shorter, format-less turns: smoke use only), at seed ``--seed``, with validation and a checkpoint on the last step
only (``eval.every_n_steps`` = ``ckpt.every_n_steps`` = steps), so the steps before it are the steady state of a
long run. With ``--commits A B`` each commit gets a ``git worktree`` (made under ``--worktrees``, or reused when one
of that commit is there) and runs there with ``PYTHONPATH`` = that worktree and this interpreter (the same
environment): A first, then B, never at once. ``--overrides`` go to the last side only (the candidate), so each lever
can be measured against the same base, ``--set`` to both (a smaller size, say); ``.`` as a commit is this checkout as
it is, uncommitted changes included.

Figures per side, from the run's console (each step's wall time, checkpoint included) and its metrics.csv (the
``perf/*`` phase timings): step 1 is the warm-up (kernel selection, caches; reported apart); steps 2..N are measured.
  rollouts/h (steady)   3600 x rollouts a step / mean wall time of the measured steps that neither validate nor
                        checkpoint: the headline, what a long run pays a step
  rollouts/h (measured) the same over every measured step, validation and checkpoint included
  rollouts/h (run)      every step's rollouts over the whole process's wall time, start-up and export included
  gen tok/s             sampled tokens / generate seconds (the rollout: engine calls and search)
  update tok/s          tokens of the rows the update computed (perf/update_tokens) / update seconds
  phase shares          generate, score (memory rewards, advantages), logp (old and reference log-probs), update,
                        push, canary, validation, checkpoint (the step's wall time after metrics.csv's row: the save),
                        other (the rest), each as a share of the measured steps' wall time
The ratio column is candidate / base for every row (for a time, lower is better). The JSON (``--json``, default
benchmarks/results/rl_throughput.json) holds every step of both sides, the machine kind and the commits.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS, ROOT, log, write_json

DEFAULT_WARM_START = ROOT / "runs" / "demo" / "sft" / "hf"
SMOLLM2_BASE = "smollm2-135m-instruct"  # mempo.lm.loading.SMOLLM2, the embedded base model
RECIPE = "+exp=grpo_cpu"
STEP_LINE = re.compile(r"\[mempo\] RL step (\d+)/(\d+):.*, ([0-9.]+) s\s*$")
PHASES = ("generate", "score", "logp", "update", "push", "canary", "validation", "checkpoint")
# --quick: a smoke size of the same recipe (one task of G=4, short turns, two validation tasks).
QUICK = [
    "data.batch_size=1",
    "data.group_size=4",
    "agent.max_turns=3",
    "sampler.max_new_tokens=48",
    "data.num_val_tasks=2",
    "sampler.kv_cache_space_gb=1",
]
QUICK_STEPS = 3


# ----------------------------------------------------------------------------------------------- the machine, git
def cpu_flags() -> dict[str, bool]:
    """The lscpu flags that decide the CPU kind: native bf16 (avx512_bf16), AMX tiles, AVX2."""
    from mempo.core.hardware import cpuinfo

    line = next((x for x in cpuinfo().splitlines() if x.startswith("flags")), "flags:")
    flags = set(line.split(":", 1)[1].split())
    return {name: name in flags for name in ("avx512_bf16", "amx_tile", "avx2")}


# How the benchmarks name each of ``mempo.core.hardware.rate_kind``'s kinds beside a timing
KIND_NAMES = {"amx": "AMX", "avx512_bf16": "AVX512-BF16", "avx2": "AVX2 only"}


def machine_kind() -> dict[str, Any]:
    """``mempo.core.hardware.cpu_kind`` (avx512_bf16 | avx2) and ``rate_kind`` (amx | avx512_bf16 | avx2, which names
    the machine: ``label``; an AMX CPU with oneDNN capped below AMX is labelled "AVX512-BF16 (AMX capped)"), the
    flags, the CPU model and its cores."""
    from mempo.core.hardware import cpu_kind, cpuinfo, onednn_allows_amx, rate_kind

    line = next((x for x in cpuinfo().splitlines() if x.startswith("model name")), "model name:")
    rates = rate_kind()
    label = KIND_NAMES[rates] + ("" if onednn_allows_amx() or not cpu_flags()["amx_tile"] else " (AMX capped)")
    return {"cpu_kind": cpu_kind(), "rate_kind": rates, "flags": cpu_flags(), "label": label,
            "cpu": line.split(":", 1)[1].strip(), "cores": os.cpu_count()}  # fmt: skip


def git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


def describe(commit: str, cwd: Path = ROOT) -> dict[str, str]:
    """{"commit": full sha, "short", "subject"} of ``commit`` (a sha, a branch, HEAD)."""
    sha = git("rev-parse", "--verify", f"{commit}^{{commit}}", cwd=cwd)
    return {"commit": sha, "short": sha[:7], "subject": git("log", "-1", "--format=%s", sha, cwd=cwd)}


def worktree(commit: str, root: Path) -> tuple[Path, dict[str, str]]:
    """A checkout of ``commit`` to run: this one for ``.`` (as it is, "+dirty" when it has uncommitted changes), else
    ``root/<short sha>``, made with ``git worktree add --detach`` or reused when it already holds that commit."""
    if commit == ".":
        info = describe("HEAD")
        if git("status", "--porcelain", "--untracked-files=no"):
            info = {**info, "short": info["short"] + "+dirty", "subject": info["subject"] + " (+ uncommitted changes)"}
        return ROOT, info
    info = describe(commit)
    path = root / info["short"]
    if path.exists():
        have = git("rev-parse", "HEAD", cwd=path)
        if have != info["commit"]:
            raise SystemExit(f"{path} holds commit {have[:7]}, not {info['short']}: remove it or pick --worktrees")
        log(f"reusing the worktree {path} ({info['short']})")
    else:
        root.mkdir(parents=True, exist_ok=True)
        git("worktree", "add", "--detach", str(path), info["commit"])
        log(f"made the worktree {path} ({info['short']}: {info['subject'][:60]})")
    return path, info


# -------------------------------------------------------------------------------------------------------- one side
def side_command(warm_start: str, run_dir: Path, steps: int, seed: int, quick: bool, overrides: list[str]) -> list[str]:
    """The ``experiments/run.py`` command line of one side: the recipe, its budget cut to ``steps`` with validation
    and a checkpoint on the last step only, then the quick size and the side's own overrides (the last word wins)."""
    return [
        sys.executable,
        "experiments/run.py",
        RECIPE,
        f"model.name_or_path={warm_start}",
        f"run_dir={run_dir}",
        "overwrite=true",
        f"seed={seed}",
        f"trainer.max_steps={steps}",
        f"eval.every_n_steps={steps}",
        f"ckpt.every_n_steps={steps}",
        *(QUICK if quick else []),
        *overrides,
    ]


def run_side(checkout: Path, cmd: list[str], log_path: Path, timeout_s: float) -> dict[str, Any]:
    """Run ``cmd`` in ``checkout`` with PYTHONPATH = ``checkout``; -> {"steps": {k: console seconds}, "startup_s",
    "wall_s", "tail_s" (after the last step: the final save and export)} read from its console lines, timed as
    they arrive. Raises RuntimeError with the end of its output when it fails."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    start = time.perf_counter()
    steps: dict[int, float] = {}
    step_done: dict[int, float] = {}
    lines: list[str] = []
    with (
        log_path.open("w") as out,
        subprocess.Popen(
            cmd, cwd=checkout, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        ) as proc,
    ):
        timer = threading.Timer(timeout_s, proc.kill)
        timer.start()
        try:
            for line in proc.stdout:
                out.write(line)
                lines.append(line.rstrip())
                m = STEP_LINE.search(line)
                if m:
                    k = int(m.group(1))
                    steps[k], step_done[k] = float(m.group(3)), time.perf_counter() - start
                    log(f"  step {k}/{m.group(2)}: {float(m.group(3)):.1f} s")
        except BaseException:  # interrupted (Ctrl-C, or SIGTERM through ``main``): the run goes with the benchmark
            proc.kill()
            raise
        finally:
            timer.cancel()
        code = proc.wait()
    wall = time.perf_counter() - start
    if code != 0 or not steps:
        tail = "\n".join(lines[-15:])
        raise RuntimeError(f"{' '.join(cmd[1:4])} ... in {checkout}: exit {code} (log {log_path})\n{tail}")
    first, last = min(steps), max(steps)
    return {
        "settings": speed_settings(lines),
        "steps": steps,
        "startup_s": step_done[first] - steps[first],
        "wall_s": wall,
        "tail_s": wall - step_done[last],
    }


def speed_settings(lines: list[str]) -> str:
    """The run's own console line of its speed switches as resolved (``mempo.stages.builders.speed_settings_line``);
    a commit that did not print one: says so."""
    for line in lines:
        if line.startswith("[mempo] rl: engine ") or line.startswith("[mempo] rl: sampler "):
            return line.removeprefix("[mempo] rl: ")
    return "not printed by this commit"


def read_metrics(run_dir: Path) -> list[dict[str, float]]:
    with (run_dir / "metrics.csv").open(newline="") as f:
        return [{k: float(v) for k, v in row.items() if v not in ("", None)} for row in csv.DictReader(f)]


def rollouts_per_step(run_dir: Path) -> int:
    """data.batch_size x data.group_size of the run (its config.yaml, as the run resolved it)."""
    from omegaconf import OmegaConf

    data = OmegaConf.load(run_dir / "config.yaml").data
    return int(data.batch_size) * int(data.group_size)


def summarize(console: dict[str, Any], rows: list[dict[str, float]], rollouts_per_step: int) -> dict[str, Any]:
    """One side's figures from its console timings (``run_side``) and its metrics.csv rows (module docstring)."""
    by_step = {int(r["step"]): r for r in rows}
    steps = []
    for k in sorted(console["steps"]):
        r = by_step.get(k, {})
        wall = console["steps"][k]
        phases = {p: r.get(f"perf/{p}_s", 0.0) for p in PHASES if p != "checkpoint"}
        if "val/em" in r and "perf/validation_s" not in r:  # a commit that did not time it: the rest of the row's
            phases["validation"] = max(r.get("perf/step_s", wall) - sum(phases.values()), 0.0)
        # After metrics.csv's row come the memory-credit file (empty here) and the checkpoint save.
        phases["checkpoint"] = max(wall - r.get("perf/step_s", wall), 0.0)
        sampled = r.get("perf/gen_tok_per_s", 0.0) * r.get("perf/generate_s", 0.0)
        steps.append(
            {
                "step": k,
                "wall_s": wall,
                "phases": phases,
                "other_s": max(wall - sum(phases.values()), 0.0),
                "sampled_tokens": sampled,
                "update_tokens": r.get("perf/update_tokens"),
                "tokens": r.get("perf/tokens"),
                "samples": r.get("perf/samples"),
                "validates": "perf/validation_s" in r or "val/em" in r,
                "reward": r.get("rollout/reward_mean"),
                "extra": {
                    k2: r[k2]
                    for k2 in (
                        "rollout/engine_logp_gap",
                        "train/tis_clip_frac",
                        "train/first_epoch_ratio_dev",
                        "train/ratio_mean",
                        "rollout/prefix_cache_hit_rate",
                        "perf/update_pad_frac",
                        "perf/update_positions",
                        "perf/prompt_tokens",
                        "train/rows_updated",
                        "val/em",
                    )
                    if k2 in r
                },
            }
        )
    return figures(steps, console, rollouts_per_step)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def figures(steps: list[dict[str, Any]], console: dict[str, Any], rollouts_per_step: int) -> dict[str, Any]:
    """The figures of one side from its per-step records (``summarize``): the first step is the warm-up; a measured
    step is steady when it neither validates nor checkpoints (its checkpoint share under a second)."""
    warm, measured = steps[0], steps[1:]
    steady = [s for s in measured if not s["validates"] and s["phases"]["checkpoint"] < 1.0]
    wall = sum(s["wall_s"] for s in measured)
    gen_s = sum(s["phases"]["generate"] for s in measured)
    upd_s = sum(s["phases"]["update"] for s in measured)
    upd_tokens = [s["update_tokens"] for s in measured]
    steady_s = _mean([s["wall_s"] for s in steady])
    out: dict[str, Any] = {
        "rollouts_per_step": rollouts_per_step,
        "warmup_step_s": warm["wall_s"],
        "steady_steps": [s["step"] for s in steady],
        "steady_step_s": steady_s,
        "rollouts_per_h_steady": 3600 * rollouts_per_step / steady_s if steady_s else None,
        "rollouts_per_h_measured": 3600 * rollouts_per_step * len(measured) / wall if wall else None,
        "rollouts_per_h_run": 3600 * rollouts_per_step * len(steps) / console["wall_s"],
        "startup_s": console["startup_s"],
        "tail_s": console["tail_s"],
        "wall_s": console["wall_s"],
        "gen_tok_per_s": sum(s["sampled_tokens"] for s in measured) / gen_s if gen_s else None,
        "update_tok_per_s": (
            sum(upd_tokens) / upd_s if upd_s and upd_tokens and all(t is not None for t in upd_tokens) else None
        ),
        "shares": {p: sum(s["phases"][p] for s in measured) / wall if wall else None for p in PHASES},
        "phase_s": {p: _mean([s["phases"][p] for s in measured]) for p in PHASES},
        "steps": steps,
    }
    out["shares"]["other"] = sum(s["other_s"] for s in measured) / wall if wall else None
    updated = [s for s in measured if s["update_tokens"]]  # a step without signal has no update to pad
    for key, over in (("rollout/engine_logp_gap", measured), ("train/tis_clip_frac", measured),
                      ("rollout/prefix_cache_hit_rate", measured), ("perf/update_pad_frac", updated)):  # fmt: skip
        out[key] = _mean([s["extra"][key] for s in over if key in s["extra"]])
    # Positions the update's forwards computed per real token (1 + padding; below 1 with optim.shared_prefix).
    pos = [(s["extra"]["perf/update_positions"], s["update_tokens"]) for s in updated
           if "perf/update_positions" in s["extra"]]  # fmt: skip
    out["update_positions_per_token"] = sum(a for a, _ in pos) / sum(b for _, b in pos) if pos else None
    devs = [s["extra"]["train/first_epoch_ratio_dev"] for s in steps if "train/first_epoch_ratio_dev" in s["extra"]]
    out["train/first_epoch_ratio_dev"] = max(devs) if devs else None
    return out


# ------------------------------------------------------------------------------------------------------ the table
ROWS = [
    ("rollouts/h (steady)", "rollouts_per_h_steady", "{:.0f}"),
    ("rollouts/h (measured)", "rollouts_per_h_measured", "{:.0f}"),
    ("rollouts/h (run)", "rollouts_per_h_run", "{:.0f}"),
    ("steady step s", "steady_step_s", "{:.1f}"),
    ("warm-up step s", "warmup_step_s", "{:.1f}"),
    ("start-up s", "startup_s", "{:.1f}"),
    ("gen tok/s", "gen_tok_per_s", "{:.1f}"),
    ("update tok/s", "update_tok_per_s", "{:.0f}"),
    *((f"share {p}", f"shares.{p}", "{:.1%}") for p in (*PHASES, "other")),
    *((f"{p} s/step", f"phase_s.{p}", "{:.2f}") for p in PHASES),
    ("engine logp gap", "rollout/engine_logp_gap", "{:.4f}"),
    ("TIS clip frac", "train/tis_clip_frac", "{:.4f}"),
    ("largest abs(ratio - 1), epoch 1", "train/first_epoch_ratio_dev", "{:.2e}"),
    ("prefix-cache hit rate", "rollout/prefix_cache_hit_rate", "{:.1%}"),
    ("update padding", "perf/update_pad_frac", "{:.1%}"),
    ("update positions per token", "update_positions_per_token", "{:.2f}"),
]


def lookup(result: dict[str, Any], key: str) -> Any:
    value: Any = result
    for part in key.split(".", 1) if key.startswith(("shares.", "phase_s.")) else [key]:
        value = value.get(part) if isinstance(value, dict) else None
    return value


def table(sides: list[dict[str, Any]]) -> str:
    """The figures of one or two sides as a markdown table; with two, a ratio column (candidate / base)."""
    heads = [f"{s['label']} ({s['commit']['short']})" for s in sides]
    lines = ["| figure | " + " | ".join(heads) + (" | ratio |" if len(sides) == 2 else " |")]
    lines.append("| --- " * (len(sides) + 1 + (len(sides) == 2)) + "|")
    for name, key, fmt in ROWS:
        values = [lookup(s["figures"], key) for s in sides]
        if all(v is None for v in values):
            continue
        cells = [fmt.format(v) if isinstance(v, (int, float)) else "n/a" for v in values]
        if len(sides) == 2:
            a, b = values
            cells.append(f"{b / a:.2f}x" if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a else "")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------------------ main
def resolve_warm_start(given: str | None) -> tuple[str, str]:
    """-> (model.name_or_path, what it is): ``given`` (a folder, made absolute since each side runs in its own
    checkout, or a model name such as ``tiny``), else the main job's warm start when this checkout has one, else the
    SmolLM2 base."""
    if given:
        return (str(Path(given).resolve()) if Path(given).exists() else given), "given"
    if (DEFAULT_WARM_START / "config.json").is_file():
        return str(DEFAULT_WARM_START), "the main job's warm start"
    return SMOLLM2_BASE, "the SmolLM2 base (no warm start found: smoke use only)"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.rl_throughput",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--warm-start", help="HF folder (or model name) RL starts from; default: see above")
    add("--steps", type=int, help=f"RL steps per side, the first a warm-up (default 4; --quick: {QUICK_STEPS})")
    add("--seed", type=int, default=0)
    add("--commits", nargs=2, metavar=("BASE", "CANDIDATE"), help="two commits side by side ('.': this checkout)")
    add("--overrides", nargs="+", default=[], metavar="KEY=VALUE", help="Hydra overrides of the candidate side")
    add("--set", nargs="+", default=[], metavar="KEY=VALUE", help="Hydra overrides of both sides (e.g. a size)")
    add("--quick", action="store_true", help="a smoke size: " + " ".join(QUICK))
    add("--worktrees", default=str(Path(tempfile.gettempdir()) / "mempo-rl-bench"), help="the commits' worktrees")
    add("--runs", help="keep each side's run folder and console log here (default: a temporary folder, deleted)")
    add("--timeout", type=float, default=3 * 3600, help="seconds a side may take before it is killed")
    add("--json", default=str(RESULTS / "rl_throughput.json"), help="where the result is written")
    args = parser.parse_args(argv)
    if args.steps is None:
        args.steps = QUICK_STEPS if args.quick else 4
    if args.steps < 3:
        parser.error(f"--steps {args.steps}: at least 3 (a warm-up, a steady step, the validating/checkpoint step)")
    for flag, given in (("--overrides", args.overrides), ("--set", args.set)):
        for o in given:
            if "=" not in o:
                parser.error(f"{flag} {o!r}: each override is KEY=VALUE (Hydra syntax)")
    return args


def _stop(signum: int, frame: Any) -> None:
    raise SystemExit(f"stopped by signal {signum}")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _stop)  # a killed benchmark kills the run it is timing
    warm_start, warm_kind = resolve_warm_start(args.warm_start)
    commits = args.commits or ["."]
    labels = ["base", "candidate"] if len(commits) == 2 else ["this checkout"]
    kind = machine_kind()
    log(f"machine: {kind['label']} ({kind['cpu_kind']}, rates {kind['rate_kind']}), {kind['cores']} cores; "
        f"warm start: {warm_start} ({warm_kind})")  # fmt: skip
    runs_root = Path(args.runs).resolve() if args.runs else Path(tempfile.mkdtemp(prefix="mempo-rl-runs-"))
    sides = []
    start = time.perf_counter()
    try:
        for i, (label, commit) in enumerate(zip(labels, commits)):
            checkout, info = worktree(commit, Path(args.worktrees))
            overrides = [*args.set, *(args.overrides if i == len(commits) - 1 else [])]
            run_dir = runs_root / f"{i}-{label.replace(' ', '_')}-{info['short']}"
            cmd = side_command(warm_start, run_dir, args.steps, args.seed, args.quick, overrides)
            log(f"{label}: {info['short']} ({info['subject'][:60]}), {args.steps} steps"
                + (f", overrides {' '.join(overrides)}" if overrides else ""))  # fmt: skip
            run_dir.parent.mkdir(parents=True, exist_ok=True)
            console = run_side(checkout, cmd, runs_root / f"{i}-{label.replace(' ', '_')}.log", args.timeout)
            rows = read_metrics(run_dir)
            fig = summarize(console, rows, rollouts_per_step(run_dir))
            sides.append({"label": label, "commit": info, "checkout": str(checkout), "overrides": overrides,
                          "command": " ".join(cmd[1:]), "settings": console["settings"], "figures": fig})  # fmt: skip
            steady = f"{fig['rollouts_per_h_steady'] or 0:.0f} rollouts/h steady"
            log(f"  {label}: {steady}, {fig['steady_step_s'] or 0:.1f} s a step")
            if not args.runs:
                shutil.rmtree(run_dir, ignore_errors=True)
    finally:
        if not args.runs:
            shutil.rmtree(runs_root, ignore_errors=True)
    result = {
        "sides": sides,
        "machine": kind,
        "warm_start": warm_start,
        "warm_start_kind": warm_kind,
        "recipe": RECIPE,
        "steps": args.steps,
        "seed": args.seed,
        "quick": args.quick,
        "measured_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "wall_s": time.perf_counter() - start,
        "command": " ".join(
            ["python", "-m", "benchmarks.rl_throughput", *(argv if argv is not None else sys.argv[1:])]
        ),
        "table": table(sides),
    }
    if len(sides) == 2:
        a, b = (s["figures"]["rollouts_per_h_steady"] for s in sides)
        result["ratio"] = b / a if a and b else None
    write_json(args.json, result)
    print(f"\nRL rollouts per hour, {RECIPE}, {args.steps} steps, seed {args.seed}, from {warm_start}; "
          f"{kind['label']} ({kind['cpu_kind']}), {kind['cores']} cores\n")  # fmt: skip
    print(result["table"])
    for side in sides:  # what each switch resolved to on this machine (the table's ratio is between these)
        print(f"{side['label']} ({side['commit']['short']}): {side['settings']}")
    print(f"\nwritten: {args.json}")


if __name__ == "__main__":
    main()
