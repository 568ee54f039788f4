"""Memory credit: what the memory advantage pays for, memory by memory (docs/results.md, section 2's diagnostics).

Every RL step that scores memories (``memory.alpha > 0`` or ``memory.log_p_ans``) turns each well-formed memory into
one record (``credit_records``): its task, rollout, turn and text, P = P(gold | q, m) (Eq. 4), R^M (Eq. 5), A^M (as
``memory`` configures it, also when alpha = 0 does not use it), the writing trajectory's A^T and R^T, and the
action its turn took. ``MemoryCreditFile`` appends them to ``<run_dir>/memory_credit.jsonl``; ``credit_metrics``
gives the step's summary metrics (metrics.csv, W&B):

    memory/adv_share          share of |advantage| on <mem> tokens among all response tokens
    memory/adv_corr           within-group Pearson correlation of A^M with A^T (mean over groups where both vary)
    memory/complete_frac      memories that state a value for every objective ("Qk: value", no "need ...")
    rollout/early_answer_rate trajectories that answered while some objective's chain held an entity no query had
                              named (synthetic data only: it needs the chains)

    python -m mempo.eval.memory_credit RUN_DIR   # -> RUN_DIR/memory_credit.md and memory_credit.png
    python -m mempo.eval.memory_credit RUN_DIR RUN_DIR ... --out DIR   # several runs side by side (runs_summary)
"""

from __future__ import annotations

import argparse
import csv
import math
import re
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from mempo.core.base import read_jsonl
from mempo.data.synthetic import SyntheticQuestion
from mempo.eval.tables import pyplot
from mempo.rollout.agent import RolloutBatch, Trajectory, TurnSample

CREDIT_FILE = "memory_credit.jsonl"
RECORD_KEYS = (
    "step", "task_id", "group", "rollout", "turn", "objectives", "memory", "p_ans", "mem_reward", "mem_adv",
    "traj_adv", "traj_reward", "action", "complete",
)  # fmt: skip
_SLOT = re.compile(r"\bQ(\d+)\s*:\s*(.*?)(?=\s*\bQ\d+\s*:|$)", re.S)


def memory_slots(memory: str) -> dict[int, str]:
    """``"Q1: 2020. Q2: need the birth year of X."`` -> ``{1: "2020.", 2: "need the birth year of X."}``."""
    return {int(k): body.strip() for k, body in _SLOT.findall(memory)}


def states_every_value(memory: str, objectives: int) -> bool:
    """Whether the memory states a value for each of the task's objectives: a non-empty ``Qk:`` slot per objective
    without "need" (a single objective's memory may also be one unlabelled value)."""
    slots = memory_slots(memory)
    if not slots and objectives == 1:
        slots = {1: memory.strip()}
    return all(slots.get(k) and "need" not in slots[k].lower() for k in range(1, objectives + 1))


def answered_early(traj: Trajectory, chains: Mapping[str, SyntheticQuestion]) -> bool | None:
    """True when ``traj`` answered while some hop of some objective's chain names an entity that none of its
    queries named (case-insensitive substring, as ``mempo.eval.failures``); None when a chain is unknown."""
    found = [chains.get(q.qid) for q in traj.task.objectives]
    if any(c is None for c in found):
        return None
    if traj.finish != "answer":
        return False
    queries = [t.parsed.argument.lower() for t in traj.turns if t.parsed.ok and t.parsed.action == "search"]
    return any(not any(h.entity.lower() in q for q in queries) for c in found for h in c.hops)


def turn_action(sample: TurnSample) -> str:
    """The action a memory's turn took: ``search: <query>``, ``answer: <answer>`` or ``malformed: <error>``."""
    p = sample.parsed
    if not p.ok:
        return f"malformed: {p.error}"
    return f"{p.action}: {p.argument}"


def credit_records(
    rollouts: RolloutBatch,
    *,
    step: int,
    p_ans: torch.Tensor,
    mem_reward: torch.Tensor,
    mem_adv: torch.Tensor,
    mem_valid: torch.Tensor,
    traj_adv: torch.Tensor,
) -> list[dict[str, Any]]:
    """One record per scored memory. p_ans, mem_reward, mem_adv, mem_valid: [N] over ``rollouts.samples``;
    traj_adv: [R] over ``rollouts.trajectories`` (indexed by ``traj_id``)."""
    trajs = {t.traj_id: t for t in rollouts.trajectories}
    out = []
    for i, s in enumerate(rollouts.samples):
        if not bool(mem_valid[i]):
            continue
        t = trajs[s.traj_id]
        n_obj = len(t.task.objectives)
        out.append({
            "step": step, "task_id": t.task.task_id, "group": s.group_id, "rollout": s.traj_id, "turn": s.turn_id,
            "objectives": n_obj, "memory": s.parsed.memory, "p_ans": float(p_ans[i]),
            "mem_reward": float(mem_reward[i]), "mem_adv": float(mem_adv[i]), "traj_adv": float(traj_adv[s.traj_id]),
            "traj_reward": float(t.reward), "action": turn_action(s),
            "complete": states_every_value(s.parsed.memory, n_obj),
        })  # fmt: skip
    return out


def _pearson(a: Sequence[float], b: Sequence[float]) -> float | None:
    n = len(a)
    if n < 2:
        return None
    ma, mb = sum(a) / n, sum(b) / n
    va, vb = sum((x - ma) ** 2 for x in a), sum((y - mb) ** 2 for y in b)
    if va <= 1e-12 or vb <= 1e-12:
        return None
    return sum((x - ma) * (y - mb) for x, y in zip(a, b)) / math.sqrt(va * vb)


def within_group_correlation(records: Sequence[Mapping[str, Any]]) -> float:
    """Mean over (step, group) of the Pearson correlation of A^M with A^T; groups where either is constant are left
    out; NaN when none is left."""
    groups: dict[tuple[int, int], list[Mapping[str, Any]]] = defaultdict(list)
    for r in records:
        groups[(r["step"], r["group"])].append(r)
    rs = [_pearson([r["mem_adv"] for r in g], [r["traj_adv"] for r in g]) for g in groups.values()]
    rs = [r for r in rs if r is not None]
    return sum(rs) / len(rs) if rs else float("nan")


def credit_metrics(
    records: Sequence[Mapping[str, Any]],
    rollouts: RolloutBatch,
    adv: torch.Tensor,
    mem_mask: torch.Tensor,
    response_mask: torch.Tensor,
    chains: Mapping[str, SyntheticQuestion] | None = None,
) -> dict[str, float]:
    """A step's summary (the module docstring's list); adv, mem_mask, response_mask: [N, T]."""
    return {
        **unscored_metrics(rollouts, adv, mem_mask, response_mask, chains),
        "memory/adv_corr": within_group_correlation(records),
        "memory/complete_frac": sum(r["complete"] for r in records) / len(records) if records else 0.0,
    }


def unscored_metrics(
    rollouts: RolloutBatch,
    adv: torch.Tensor,
    mem_mask: torch.Tensor,
    response_mask: torch.Tensor,
    chains: Mapping[str, SyntheticQuestion] | None = None,
) -> dict[str, float]:
    """The part of ``credit_metrics`` that needs no memory-scoring forward: ``memory/adv_share`` and (synthetic data)
    ``rollout/early_answer_rate``; a step that scores no memories logs these."""
    resp = response_mask.bool()
    total = float(adv[resp].abs().sum())
    on_mem = float(adv[resp & mem_mask.bool()].abs().sum())
    out = {"memory/adv_share": on_mem / total if total > 0 else 0.0}
    if chains is not None:
        early = [answered_early(t, chains) for t in rollouts.trajectories]
        known = [e for e in early if e is not None]
        if known:
            out["rollout/early_answer_rate"] = sum(known) / len(known)
    return out


# --------------------------------------------------------------------------------------------------- the report
def load_credit(path: str | Path) -> list[dict[str, Any]]:
    """Records of a ``memory_credit.jsonl``; a line that is not a JSON object with every ``RECORD_KEYS`` key
    raises a ValueError naming the file, the line and what was wrong."""
    path = Path(path)
    out = []
    for n, rec in read_jsonl(path):
        missing = [k for k in RECORD_KEYS if k not in rec]
        if missing:
            raise ValueError(f"{path}:{n}: record lacks {', '.join(missing)}")
        out.append(rec)
    return out


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def summarize(records: Sequence[Mapping[str, Any]], *, low_p: float = 0.01) -> list[dict[str, Any]]:
    """One row per step: memories, mean P, complete share, corr(A^M, A^T), mean A^M by turn (1, 2, 3+), of complete
    vs other memories, of memories whose turn answered vs searched, and the groups whose best memory has P below
    ``low_p`` while their A^M still spans more than 1 (z-scores of noise)."""
    by_step: dict[int, list[Mapping[str, Any]]] = defaultdict(list)
    for r in records:
        by_step[int(r["step"])].append(r)
    rows = []
    for step in sorted(by_step):
        rs = by_step[step]
        groups: dict[int, list[Mapping[str, Any]]] = defaultdict(list)
        for r in rs:
            groups[r["group"]].append(r)
        noise = [
            g for g in groups.values()
            if max(r["p_ans"] for r in g) < low_p and max(r["mem_adv"] for r in g) - min(r["mem_adv"] for r in g) > 1
        ]  # fmt: skip
        adv = {
            "turn 1": [r["mem_adv"] for r in rs if r["turn"] == 1],
            "turn 2": [r["mem_adv"] for r in rs if r["turn"] == 2],
            "turn 3+": [r["mem_adv"] for r in rs if r["turn"] >= 3],
            "complete": [r["mem_adv"] for r in rs if r["complete"]],
            "not complete": [r["mem_adv"] for r in rs if not r["complete"]],
            "then answer": [r["mem_adv"] for r in rs if r["action"].startswith("answer")],
            "then search": [r["mem_adv"] for r in rs if r["action"].startswith("search")],
        }
        rows.append({
            "step": step, "memories": len(rs), "p_ans_mean": _mean([r["p_ans"] for r in rs]),
            "complete_frac": _mean([float(r["complete"]) for r in rs]), "adv_corr": within_group_correlation(rs),
            "noise_groups": f"{len(noise)}/{len(groups)}", **{f"A^M {k}": _mean(v) for k, v in adv.items()},
        })  # fmt: skip
    return rows


def _share(rows: Sequence[Mapping[str, Any]], test: Callable[[Mapping[str, Any]], bool], *keys: str) -> str:
    """``"k/n"``: of the n rows where every one of ``keys`` is defined (not NaN), k where ``test`` holds."""
    seen = [test(r) for r in rows if not any(math.isnan(r[k]) for k in keys)]
    return f"{sum(seen)}/{len(seen)}"


def runs_summary(runs: Mapping[str, Sequence[Mapping[str, Any]]], *, edge: int = 5) -> list[dict[str, Any]]:
    """One row per run (label -> its records), for reading several runs' memory credit side by side: memories and
    steps; mean P and the complete share over the memories of its first and last ``edge`` steps; in how many steps
    mean A^M was below 0 on turn-1 memories, above 0 on turn-3+ memories, higher on complete memories than on the
    others (of the steps where both are defined); and the median over steps of the within-group corr(A^M, A^T)."""
    out = []
    for label, records in runs.items():
        rows = summarize(records)
        steps = [r["step"] for r in rows]
        first = [r for r in records if r["step"] in steps[:edge]]
        last = [r for r in records if r["step"] in steps[-edge:]]
        corr = [r["adv_corr"] for r in rows if not math.isnan(r["adv_corr"])]
        out.append({
            "run": label, "steps": len(rows), "memories": len(records),
            f"P first {edge}": _mean([r["p_ans"] for r in first]), f"P last {edge}": _mean([r["p_ans"] for r in last]),
            f"complete first {edge}": _mean([float(r["complete"]) for r in first]),
            f"complete last {edge}": _mean([float(r["complete"]) for r in last]),
            "A^M turn 1 < 0": _share(rows, lambda r: r["A^M turn 1"] < 0, "A^M turn 1"),
            "A^M turn 3+ > 0": _share(rows, lambda r: r["A^M turn 3+"] > 0, "A^M turn 3+"),
            "A^M complete > other": _share(rows, lambda r: r["A^M complete"] > r["A^M not complete"],
                                           "A^M complete", "A^M not complete"),
            "adv_corr median": statistics.median(corr) if corr else float("nan"),
        })  # fmt: skip
    return out


def run_labels(paths: Sequence[Path]) -> list[str]:
    """The shortest trailing parts of each path that tell the runs apart (``w0/ledger/mempo_s3`` against
    ``w1/ledger/mempo_s3``; ``mempo_s3`` when the last parts differ)."""
    parts = [Path(p).resolve().parts for p in paths]
    for k in range(1, max(map(len, parts)) + 1):
        labels = ["/".join(p[-k:]) for p in parts]
        if len(set(labels)) == len(labels):
            return labels
    raise ValueError(f"the same run is named twice: {[str(p) for p in paths]}")


def _fmt(v: Any) -> str:
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def render(rows: Sequence[Mapping[str, Any]], step_metrics: Sequence[Mapping[str, str]] = ()) -> str:
    """Markdown: the per-step summary, then the step metrics of metrics.csv that this module logs."""
    if not rows:
        return "no memories were scored (memory.alpha = 0 and memory.log_p_ans = false?)\n"
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + " --- |" * len(keys)]
    lines += ["| " + " | ".join(_fmt(r[k]) for k in keys) + " |" for r in rows]
    cols = ["memory/adv_share", "memory/adv_corr", "memory/complete_frac", "rollout/early_answer_rate"]
    cols = [c for c in cols if step_metrics and c in step_metrics[0]]
    if cols:
        lines += ["", "| step | " + " | ".join(cols) + " |", "|" + " --- |" * (len(cols) + 1)]
        for m in step_metrics:
            vals = [_fmt(float(m[c])) if m.get(c) not in (None, "") else "" for c in cols]
            lines.append(f"| {m['step']} | " + " | ".join(vals) + " |")
    return "\n".join(lines) + "\n"


def plot(records: Sequence[Mapping[str, Any]], path: str | Path) -> None:
    """Two panels: A^M against log10 P (complete memories apart), and mean A^M by turn per step."""
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for complete, color, label in ((True, "tab:green", "states every value"), (False, "tab:red", "other")):
        rs = [r for r in records if bool(r["complete"]) == complete]
        a.scatter([math.log10(max(r["p_ans"], 1e-12)) for r in rs], [r["mem_adv"] for r in rs], s=12, c=color,
                  alpha=0.6, label=f"{label} ({len(rs)})")  # fmt: skip
    a.set(xlabel="log10 P(gold | q, m)", ylabel="A^M", title="memory advantage against its score")
    a.axhline(0, color="grey", lw=0.5)
    a.legend(fontsize=8)
    steps = sorted({int(r["step"]) for r in records})
    turns = sorted({min(int(r["turn"]), 4) for r in records})
    for t in turns:
        ys = [_mean([r["mem_adv"] for r in records if r["step"] == s and min(int(r["turn"]), 4) == t]) for s in steps]
        b.plot(steps, ys, marker="o", label=f"turn {t}" if t < 4 else "turn 4+")
    b.set(xlabel="RL step", ylabel="mean A^M", title="mean memory advantage by turn")
    b.xaxis.get_major_locator().set_params(integer=True)
    b.axhline(0, color="grey", lw=0.5)
    b.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def find_credit_file(run_dir: Path) -> Path:
    for folder in (run_dir, run_dir / "rl"):
        for cand in (folder / CREDIT_FILE, folder / f"{CREDIT_FILE}.gz"):  # .gz: as a study's ledger keeps it
            if cand.is_file():
                return cand
    raise FileNotFoundError(f"no {CREDIT_FILE}(.gz) in {run_dir} or {run_dir / 'rl'} (an RL run that scores memories)")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mempo.eval.memory_credit", description=__doc__.split("\n")[0])
    ap.add_argument("run_dir", type=Path, nargs="+")
    ap.add_argument("--out", type=Path, help="folder for the report and figures (default: next to the one run's "
                                                "records; required with several runs)")  # fmt: skip
    args = ap.parse_args(argv)
    if len(args.run_dir) > 1 and args.out is None:
        ap.error("several runs need --out (their report is written there, not into any one run)")
    paths = [find_credit_file(r) for r in args.run_dir]
    runs = dict(zip(run_labels(args.run_dir), (load_credit(p) for p in paths)))
    out = args.out or paths[0].parent
    out.mkdir(parents=True, exist_ok=True)
    text = ""
    if len(runs) > 1:
        text = f"# Memory credit of {len(runs)} runs\n\n" + render(runs_summary(runs)) + "\n"
    for (label, records), path in zip(runs.items(), paths):
        metrics_csv = path.parent / "metrics.csv"
        step_metrics = list(csv.DictReader(metrics_csv.open(newline=""))) if metrics_csv.is_file() else []
        text += f"{'##' if len(runs) > 1 else '#'} Memory credit of {path.parent}\n\n"
        text += f"{len(records)} memories from {path}\n\n" + render(summarize(records), step_metrics)
        if records:
            png = out / ("memory_credit.png" if len(runs) == 1 else f"memory_credit_{label.replace('/', '_')}.png")
            plot(records, png)
            text += f"\nfigure: {png.name}\n\n"
    (out / ("memory_credit.md" if len(runs) == 1 else "memory_credit_runs.md")).write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
