"""Where the RL update's time goes, per operator family, for each speed setting of the update.

    python -m benchmarks.update_profile                                  # every setting below, 2 RL steps each
    python -m benchmarks.update_profile --isa AVX512_CORE_BF16           # oneDNN as on a CPU without AMX
    python -m benchmarks.update_profile --settings bf16_eager bf16_compiled --steps 3

Each setting is one short run of the real entry point (``experiments/run.py +exp=grpo_cpu_fast`` from the main job's
warm start, seed 0, 4 tasks x G=8 a step) with ``host.profile_update_steps`` on every step, so the old log-probs and
the update of each step run under ``torch.profiler`` and ``mempo.models.profiling`` sums each operator's self time by
phase (forward, backward, optimizer) and family (matmul, LM head and log-softmax, attention, casts, compiled kernels,
other element-wise). The engine is the same bf16 eager vLLM in every setting, so step 1 samples the same rollouts
and its update does the same work everywhere; later steps differ (the weights do), which is why the tables give
trained tokens a second. The compiled update's step 1 includes inductor's compilation: read its step 2.

``--isa`` sets ``ONEDNN_MAX_CPU_ISA`` for the runs (oneDNN's matmuls then use no instruction set above it:
``AVX512_CORE_BF16`` is a CPU with AVX512-BF16 and no AMX), a first look on an AMX machine at what a CPU without AMX
does; the engine's oneDNN kernels are capped too. Profiling adds a per-operator cost (shapes are recorded), so the
seconds here are a little above an unprofiled run's; the shares are what to read. Prints one table per setting and
writes ``benchmarks/results/update_profile.json`` (the machine kind, the ISA cap, every step's summary).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS, ROOT, log, write_json
from benchmarks.rl_throughput import machine_kind, resolve_warm_start, run_side
from mempo.models.profiling import markdown


def setting(precision: str, compiled: bool, shared: bool = False, head_in_forward: bool = False) -> list[str]:
    """Overrides that name the precision and every update switch, whatever the recipe's defaults."""
    on = {True: "true", False: "false"}
    return [f"trainer.precision={precision}", f"optim.compile_update={on[compiled]}",
            f"optim.shared_prefix={on[shared]}", f"optim.head_grad_in_forward={on[head_in_forward]}"]  # fmt: skip


SETTINGS = {
    "bf16_compiled": setting("bf16-mixed", True),
    "bf16_eager": setting("bf16-mixed", False),
    "bf16_compiled_shared": setting("bf16-mixed", True, shared=True),
    "bf16_eager_shared": setting("bf16-mixed", False, shared=True),
    "bf16_compiled_shared_headfwd": setting("bf16-mixed", True, shared=True, head_in_forward=True),
    "bf16_eager_shared_headfwd": setting("bf16-mixed", False, shared=True, head_in_forward=True),
    "float32_eager": setting("32-true", False),
    "float32_compiled": setting("32-true", True),
}
COMMON = [
    "+exp=grpo_cpu_fast",
    "sampler.dtype=bfloat16",  # the same engine for every setting: step 1's rollouts are the same
    "sampler.enforce_eager=true",
    "optim.old_logp=recompute",
    "eval.every_n_steps=0",
    "ckpt.every_n_steps=1000",
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.update_profile",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--warm-start", help="HF folder RL starts from (default: the main job's warm start)")
    add("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    add("--steps", type=int, default=2, help="RL steps per setting, every one profiled (default 2)")
    add("--isa", default="", help="ONEDNN_MAX_CPU_ISA for the runs (e.g. AVX512_CORE_BF16); default: not set")
    add("--set", nargs="+", default=[], metavar="KEY=VALUE", help="Hydra overrides of every run")
    add("--timeout", type=float, default=1800, help="seconds a run may take before it is killed")
    add("--json", default=str(RESULTS / "update_profile.json"))
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps: at least 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    warm_start, warm_kind = resolve_warm_start(args.warm_start)
    kind = machine_kind()
    isa = args.isa or os.environ.get("ONEDNN_MAX_CPU_ISA", "")
    if args.isa:
        os.environ["ONEDNN_MAX_CPU_ISA"] = args.isa  # inherited by each run
    log(f"machine: {kind['label']} ({kind['cpu']}), {kind['cores']} cores; ONEDNN_MAX_CPU_ISA={isa or '(not set)'}; "
        f"warm start: {warm_start} ({warm_kind})")  # fmt: skip
    start = time.perf_counter()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="mempo-update-profile-") as tmp:
        for name in args.settings:
            run_dir = Path(tmp) / name
            steps = ",".join(str(k) for k in range(1, args.steps + 1))
            cmd = [sys.executable, "experiments/run.py", *COMMON, f"model.name_or_path={warm_start}",
                   f"run_dir={run_dir}", f"trainer.max_steps={args.steps}", f"host.profile_update_steps=[{steps}]",
                   *SETTINGS[name], *args.set]  # fmt: skip
            log(f"{name}: {' '.join(cmd[2:])}")
            console = run_side(ROOT, cmd, Path(tmp) / f"{name}.log", args.timeout)
            records = [json.loads((run_dir / "profile" / f"update_step{k}.json").read_text())
                       for k in range(1, args.steps + 1)]  # fmt: skip
            results[name] = {"command": " ".join(cmd[1:]), "settings": console["settings"], "steps": records}
            for r in records:
                rate = r["update_tokens"] / r["update_s"] if r["update_s"] else 0.0
                log(f"  step {r['step']}: update {r['update_s']:.1f} s, {r['update_tokens']:.0f} tokens "
                    f"({rate:.0f} a second), profiled {r['total_s']:.1f} s")  # fmt: skip
    result = {
        "machine": kind,
        "onednn_max_cpu_isa": isa,
        "warm_start": warm_start,
        "steps": args.steps,
        "settings": results,
        "measured_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "wall_s": time.perf_counter() - start,
        "command": " ".join(["python", "-m", "benchmarks.update_profile", *(sys.argv[1:] if argv is None else argv)]),
    }
    write_json(args.json, result)
    print(f"\nThe RL update by operator family; {kind['label']} ({kind['cpu']}), {kind['cores']} cores, "
          f"ONEDNN_MAX_CPU_ISA={isa or '(not set)'}; seconds of self CPU time under the profiler\n")  # fmt: skip
    for name, res in results.items():
        for r in res["steps"]:
            rate = r["update_tokens"] / r["update_s"] if r["update_s"] else 0.0
            positions = r.get("update_positions", 0)
            print(f"{name}, RL step {r['step']}: {r['update_tokens']:.0f} update tokens ({positions:.0f} "
                  f"positions computed), update {r['update_s']:.1f} s ({rate:.0f} tokens a second), old log-probs "
                  f"{r['logp_s']:.1f} s\n")  # fmt: skip
            print(markdown(r) + "\n")
            top = ", ".join(f"{name} ({fam}) {sec:.1f} s" for name, fam, sec, _ in r["top"][:8])
            print(f"top operators by self time: {top}\n")
    print(f"written: {args.json}")


if __name__ == "__main__":
    main()
