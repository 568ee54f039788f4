"""Where an RL update's time goes: ``torch.profiler`` over the old log-probs and the update of chosen RL steps
(``host.profile_update_steps``), summed by phase and operator family.

``MemPOModule`` labels its phases with ``torch.profiler.record_function`` (the labels below; free when no profiler
runs): the old log-probs' no-grad recompute, the update's forwards (decoder, LM head, log-softmax, the objective),
its backwards and the optimizer (gradient clipping, AdamW). ``UpdateProfiler`` profiles the chosen steps only (the
rollout's engine is not traced) and writes, per step, ``<run_dir>/profile/update_step<k>.json``: seconds per phase
and per (phase, family), from each operator's self CPU time, so nothing is counted twice. The families:

    matmul                 aten::mm / addmm / bmm / linear and oneDNN's matmul kernels
    lm_head                every operator with an operand as wide as the vocabulary (the output head's matmul, the
                           float32 cast, temperature and log-softmax of its [chunk, V] logits, their backwards) and
                           the log-softmax's own kernels (log_softmax, logsumexp, gather)
    attention              scaled-dot-product attention (its flash kernel on CPU) and its backward
    casts                  dtype casts and copies (aten::copy_, _to_copy, to, contiguous, clone): autocast's
    fused_compiled         the kernels inductor generated (``optim.compile_update``): a compiled graph's own time
    elementwise            every other aten operator (RMSNorm's pow and mean, SiLU, rotary mul/add/cat, ...)
    overhead               the rest: autograd nodes' and Python's own time, profiler labels

``python -m benchmarks.update_profile`` runs one short RL run per setting (eager or compiled, bf16 or float32) and
prints the tables side by side (docs/performance.md).
"""

from __future__ import annotations

import json
import os
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lightning as L
import torch

PHASE_LOGP = "mempo.logp"
PHASE_FORWARD = "mempo.update.forward"
PHASE_BACKWARD = "mempo.update.backward"
PHASE_OPTIMIZER = "mempo.update.optimizer"
PHASES = (PHASE_LOGP, PHASE_FORWARD, PHASE_BACKWARD, PHASE_OPTIMIZER)
FAMILIES = ("matmul", "lm_head", "attention", "casts", "fused_compiled", "elementwise", "overhead")

_MATMUL = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::linear", "aten::matmul", "aten::addmv"}
_LOG_SOFTMAX = {"aten::log_softmax", "aten::_log_softmax", "aten::_log_softmax_backward_data", "aten::logsumexp",
                "aten::gather", "aten::scatter_add_", "aten::scatter_add"}  # fmt: skip
_CASTS = {"aten::copy_", "aten::_to_copy", "aten::to", "aten::contiguous", "aten::clone", "aten::type_as"}


def operator_family(name: str, shapes: Sequence[Sequence[int]], vocab_size: int) -> str:
    """One operator event's family (the module docstring's list) from its name and input shapes."""
    low = name.lower()
    if "compiled" in low or low.startswith("## call"):
        return "fused_compiled"
    if any(vocab_size in tuple(s) for s in shapes):
        return "lm_head"
    if name in _MATMUL or low.startswith(("mkldnn::", "onednn::")) or "mkldnn_linear" in low:
        return "matmul"
    if name in _LOG_SOFTMAX:
        return "lm_head"
    if "scaled_dot_product" in low or "flash_attention" in low:
        return "attention"
    if name in _CASTS:
        return "casts"
    if name.startswith("aten::"):
        return "elementwise"
    return "overhead"


def summarize(events: Iterable[Any], vocab_size: int, top: int = 15) -> dict[str, Any]:
    """Profiler events (``torch.profiler.profile().events()``) -> {"phases": {phase: s}, "families": {phase:
    {family: s}}, "total_s": s, "top": [[operator, family, s, calls], ...]}: each event's self CPU time, in the
    innermost labelled phase that contains its start ("other" outside every phase), and the ``top`` operators by
    self time over all phases. Phase labels themselves count as the phase's overhead."""
    events = list(events)
    spans = sorted(
        (e.time_range.start, e.time_range.end, e.name) for e in events if e.name in PHASES
    )  # phases do not nest in one another
    starts = [s[0] for s in spans]
    families: dict[str, dict[str, float]] = {}
    ops: dict[tuple[str, str], list[float]] = {}
    for e in events:
        i = bisect_right(starts, e.time_range.start) - 1
        phase = spans[i][2] if i >= 0 and e.time_range.start <= spans[i][1] else "other"
        fam = "overhead" if e.name in PHASES else operator_family(e.name, e.input_shapes or [], vocab_size)
        row = families.setdefault(phase, {})
        row[fam] = row.get(fam, 0.0) + e.self_cpu_time_total / 1e6
        op = ops.setdefault((e.name, fam), [0.0, 0])
        op[0] += e.self_cpu_time_total / 1e6
        op[1] += 1
    phases = {p: sum(row.values()) for p, row in families.items()}
    ranked = sorted(ops.items(), key=lambda kv: -kv[1][0])[:top]
    return {
        "phases": phases,
        "families": families,
        "total_s": sum(phases.values()),
        "top": [[name, fam, sec, int(calls)] for (name, fam), (sec, calls) in ranked],
    }


# The table's columns: the update's phases in order, then the time between them
COLUMNS = {PHASE_FORWARD: "forward", PHASE_BACKWARD: "backward", PHASE_OPTIMIZER: "optimizer",
           PHASE_LOGP: "old/ref logp", "other": "between"}  # fmt: skip


def markdown(summary: dict[str, Any]) -> str:
    """Families (rows, those that occur) x phases (columns), seconds, with each family's total and share of the
    profiled time; the last row the phases' totals."""
    phases = [p for p in COLUMNS if p in summary["families"]]
    total = summary["total_s"] or 1.0
    lines = ["| family | " + " | ".join(COLUMNS[p] for p in phases) + " | all | share |",
             "| --- |" + " --- |" * (len(phases) + 2)]  # fmt: skip
    for fam in FAMILIES:
        whole = sum(row.get(fam, 0.0) for row in summary["families"].values())
        if whole:
            cells = " | ".join(f"{summary['families'][p].get(fam, 0.0):.2f}" for p in phases)
            lines.append(f"| {fam} | {cells} | {whole:.2f} | {whole / total:.0%} |")
    lines.append("| all | " + " | ".join(f"{summary['phases'][p]:.2f}" for p in phases) + f" | {total:.2f} | |")
    return "\n".join(lines)


class UpdateProfiler(L.Callback):
    """Profiles the old log-probs and the update of the RL steps in ``steps`` (1-based, as the console counts them)
    and writes each one's ``summarize`` to ``out_dir/update_step<k>.json``, with the step's update tokens and the
    settings that decide its speed (``settings``, e.g. the engine's dtype, and the trainer's precision, the compiled
    update and ``ONEDNN_MAX_CPU_ISA``, read at the fit's start)."""

    def __init__(self, steps: Sequence[int], out_dir: Path, settings: dict[str, Any] | None = None) -> None:
        if any(int(s) < 1 for s in steps):
            raise ValueError(f"host.profile_update_steps: RL steps count from 1, got {list(steps)}")
        self.steps = {int(s) for s in steps}
        self.out_dir = Path(out_dir)
        self.settings = dict(settings or {})
        self.vocab_size = 0  # the output head's width, read at the fit's start
        self.pending: dict[str, Any] | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        pl_module.update_profiler = self.span

    @contextmanager
    def span(self, step: int) -> Iterator[None]:
        if step not in self.steps:
            yield
            return
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
            yield
        self.pending = {"step": step, **summarize(prof.events(), self.vocab_size)}

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.vocab_size = int(pl_module.policy.get_output_embeddings().weight.shape[0])
        self.settings |= {
            "precision": str(trainer.precision),
            "compile_update": pl_module.optim_cfg.compile_update,
            "ONEDNN_MAX_CPU_ISA": os.environ.get("ONEDNN_MAX_CPU_ISA", ""),
        }

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.pending is None:
            return
        record, self.pending = self.pending, None
        metrics = getattr(pl_module, "last_metrics", {})
        record.update(
            update_tokens=metrics.get("perf/update_tokens", 0.0),
            update_positions=metrics.get("perf/update_positions", 0.0),
            update_s=metrics.get("perf/update_s", 0.0),
            logp_s=metrics.get("perf/logp_s", 0.0),
            settings=self.settings,
        )
        if trainer.is_global_zero:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            path = self.out_dir / f"update_step{record['step']}.json"
            path.write_text(json.dumps(record, indent=1))
            print(f"[mempo] profile of RL step {record['step']}'s update ({record['update_tokens']:.0f} tokens, "
                  f"{record['total_s']:.1f} s profiled): {path}")  # fmt: skip
