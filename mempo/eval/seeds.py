"""Seed-level comparisons of arms: each arm a group of evaluated checkpoints, one per RL seed, all scored on the same
held-out tasks (one evaluation: ``mempo.stages.study``, or ``python -m mempo.eval.report --arm``).

A comparison of arm B against arm A (or against the warm start, one checkpoint standing for every seed) pairs B's
run of seed s with A's run of seed s, and within that pair B's score on task t with A's on task t: a K x T matrix
d[s, t] of paired differences. Every seed is scored on the same tasks, so the design is crossed, d[s, t] = mu + u_t +
v_s + e_st, and the mean's variance has a seed term and a task term (``mempo.eval.stats``):

    per-seed differences   the K row means (what each seed's run gained)
    interval               the seed-plus-task t-interval: s^2(seed means) / K + s^2(task means over seeds) / T,
                           Welch-Satterthwaite df: the interval the verdict reads (near 95% coverage in simulation
                           whichever term dominates)
    crossed bootstrap      seeds resampled with one draw of tasks shared by all of them, beside it (too narrow with
                           2-3 seeds where the seeds dominate: 3 seeds give 10 distinct draws)
    verdict                "above 0" | "below 0" | "includes 0", from the interval; "one seed: no interval" at K = 1
    seed_t_interval        (study.json only) the seed-only t over the K differences, df = K - 1, which S1-S4 read:
                           it leaves out the task term

The tasks-only intervals of ``interval_table`` (and ``--mean``) hold the seeds fixed and so leave out the spread
between RL seeds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from mempo.eval.stats import (
    crossed_bootstrap,
    crossed_variance,
    seed_task_t_interval,
    stratified_t_interval,
    t_interval,
    verdict,
)
from mempo.eval.tables import markdown_table, refuse_repeats

Scores = Mapping[int, Mapping[str, float]]  # seed -> task_id -> a per-task value (EM or F1)
METRICS = ("em", "f1")


def paired_differences(a: Scores, b: Scores, *, names: tuple[str, str] = ("a", "b")) -> dict[int, list[float]]:
    """seed -> [b - a on each task] (tasks in sorted order), pairing runs by seed and scores by task id. Both must
    hold the same seeds, and each seed the same tasks in both: otherwise a ValueError naming what differs."""
    if set(a) != set(b):
        raise ValueError(f"{names[1]} - {names[0]}: seeds {sorted(b)} against {sorted(a)}; arms pair by seed")
    out = {}
    for s in sorted(a):
        if set(a[s]) != set(b[s]):
            only = sorted(set(a[s]) ^ set(b[s]))[:3]
            raise ValueError(f"{names[1]} - {names[0]}, seed {s}: not the same tasks (e.g. {only}); pairs by task")
        out[s] = [float(b[s][t]) - float(a[s][t]) for t in sorted(a[s])]
    return out


def seed_matrix(scores: Scores, *, what: str = "scores") -> tuple[list[int], list[str], np.ndarray]:
    """-> (seeds, tasks, x [K, T]): x[i, j] = scores[seeds[i]][tasks[j]], seeds and tasks sorted. Every seed must hold
    the same tasks (the crossed design: one evaluation scores every checkpoint on the same ones): otherwise a
    ValueError naming ``what`` and two seeds that differ."""
    seeds = sorted(scores)
    tasks = sorted(scores[seeds[0]]) if seeds else []
    for s in seeds[1:]:
        if sorted(scores[s]) != tasks:
            only = sorted(set(scores[s]) ^ set(tasks))[:3]
            raise ValueError(
                f"{what}: seeds {seeds[0]} and {s} hold different tasks (e.g. {only}); the seed-level interval needs "
                "every seed scored on the same tasks"
            )
    x = np.asarray([[float(scores[s][t]) for t in tasks] for s in seeds], dtype=np.float64)
    return seeds, tasks, x.reshape(len(seeds), len(tasks))


def paired_matrix(
    a: Scores, b: Scores, *, names: tuple[str, str] = ("a", "b")
) -> tuple[list[int], list[str], np.ndarray]:
    """-> (seeds, tasks, d [K, T]): ``paired_differences`` as the crossed design's matrix (``seed_matrix``), d[i, j] =
    b - a on task tasks[j] at seed seeds[i]."""
    diffs = paired_differences(a, b, names=names)
    by_task = {s: dict(zip(sorted(a[s]), d, strict=True)) for s, d in diffs.items()}
    return seed_matrix(by_task, what=f"{names[1]} - {names[0]}")


def compare(
    a: Scores, b: Scores, *, names: tuple[str, str] = ("a", "b"), level: float = 0.95, n_resamples: int = 10_000
) -> dict[str, Any]:
    """B - A over seeds and tasks -> {"seeds", "tasks" (per seed), "per_seed" (the seeds' mean paired differences),
    "mean", "interval" ([low, high]: ``seed_task_t_interval``, the verdict's; None for one seed or one task), "df" (its
    Satterthwaite df), "crossed_bootstrap" ([low, high]: ``crossed_bootstrap``, beside it), "seed_t_interval" ([low,
    high]: the seed-only t, df = K - 1, that S1-S4 read; not read), "verdict", "level"}."""
    seeds, tasks, d = paired_matrix(a, b, names=names)
    if not seeds or not tasks:
        raise ValueError(f"{names[1]} - {names[0]}: no seeds or no tasks to compare")
    per_seed = [float(v) for v in d.mean(axis=1)]
    mean, boot_lo, boot_hi = crossed_bootstrap(d, level=level, n_resamples=n_resamples)
    out: dict[str, Any] = {
        "seeds": seeds,
        "tasks": [len(tasks)] * len(seeds),
        "per_seed": per_seed,
        "mean": mean,
        "interval": None,
        "df": None,
        "crossed_bootstrap": [boot_lo, boot_hi],
        "seed_t_interval": None,
        "verdict": "one seed: no interval" if len(seeds) < 2 else "one task: no interval",
        "level": level,
    }
    if len(seeds) >= 2:
        _, lo, hi = t_interval(per_seed, level=level)
        out["seed_t_interval"] = [lo, hi]
    if len(seeds) >= 2 and len(tasks) >= 2:
        _, lo, hi, df = seed_task_t_interval(d, level=level)
        out |= {"interval": [lo, hi], "df": df, "var": crossed_variance(d)[0], "verdict": verdict(lo, hi)}
    return out


def checkpoint_scores(records: Sequence[Mapping[str, Any]], label: str, *, agent: str, n: int, metric: str) -> dict:
    """task_id -> ``metric`` of checkpoint ``label``'s records at (agent, N); a ValueError when it has none, or when a
    task id appears twice (two evaluations of one label merged, or two tasks sharing an id): one would be dropped."""
    out: dict[str, float] = {}
    for r in records:
        if r["checkpoint"] == label and r["agent"] == agent and r["objectives"] == n:
            if r["task_id"] in out:
                raise ValueError(
                    f"checkpoint {label!r}: task {r['task_id']!r} has two records at agent={agent}, N={n}; one "
                    "label must be one evaluated checkpoint scored once per task"
                )
            out[r["task_id"]] = float(r[metric])
    if not out:
        raise ValueError(f"checkpoint {label!r}: no records at agent={agent}, N={n} in the evaluations given")
    return out


def check_labels(
    arms: Mapping[str, Mapping[int, str]], warm_start: str | None = None, *, others: Sequence[str] = ()
) -> None:
    """A ValueError naming the label when one checkpoint label would stand for two runs: two seeds of an arm, two
    arms, or an arm and a warm start (``warm_start``, or one of ``others``: its pairs would compare a run with
    itself, or count one run as two seeds)."""
    used: dict[str, str] = {} if warm_start is None else {warm_start: "the warm start"}
    used |= {label: f"the warm start {label!r}" for label in others if label not in used}
    for arm, labels in arms.items():
        for seed, label in sorted(labels.items()):
            where = f"arm {arm!r} seed {seed}"
            if label in used:
                raise ValueError(
                    f"checkpoint label {label!r} serves both {used[label]} and {where}; each seed of each arm must "
                    "be its own evaluated checkpoint (its own label)"
                )
            used[label] = where


def seed_study(
    records: Sequence[Mapping[str, Any]],
    arms: Mapping[str, Mapping[int, str]],
    *,
    reference: str | None = None,
    warm_start: str | None = None,
    agent: str = "memory",
    agents: Mapping[str, str] | None = None,
    arm_warm_starts: Mapping[str, str] | None = None,
    also_reference: Sequence[str] = (),
    level: float = 0.95,
) -> dict[str, Any]:
    """The seed-level report of ``arms`` (arm -> seed -> checkpoint label in ``records``, results.jsonl's rows),
    per N: per arm its seeds, per-seed EM and F1 and the seed means; per comparison (every other arm against
    ``reference``, the first arm when None, then against each arm of ``also_reference``; every arm against
    ``warm_start``, a label, when given) ``compare``'s result per metric. -> the dict ``study.json`` holds.

    agents: checkpoint label -> the agent it was evaluated as, where not ``agent`` (a ReAct arm's labels and its
    warm start's: "full_history"); arms of different agents pair by seed and task like any two. arm_warm_starts:
    arm -> the label of the warm start it started from, where not ``warm_start`` (a ReAct arm's full-history warm
    start): its comparison with a warm start is against that label (``against``: the label), listed under
    "other_warm_starts"."""
    if not arms:
        raise ValueError("seed_study: no arms")
    own_ws = dict(arm_warm_starts or {})
    check_labels(arms, warm_start, others=sorted(set(own_ws.values())))
    reference = next(iter(arms)) if reference is None else reference
    for ref in (reference, *also_reference):
        if ref not in arms:
            raise ValueError(f"reference arm {ref!r} is not among the arms {list(arms)}")

    def agent_of(label: str) -> str:
        return (agents or {}).get(label, agent)

    used = {agent_of(label) for labels in arms.values() for label in labels.values()}
    ns = sorted({r["objectives"] for r in records if r["agent"] in used})
    if not ns:
        raise ValueError(f"no records of agent={'/'.join(sorted(used))} in the evaluations given")
    out: dict[str, Any] = {"agent": agent, "objectives": ns, "reference": reference, "warm_start": None, "arms": {}}
    if also_reference:
        out["also_reference"] = list(also_reference)
    if agents:
        out["agents"] = dict(agents)
    scores: dict[tuple[str, int, str], dict[int, dict[str, float]]] = {}  # (arm, N, metric) -> Scores
    for arm, labels in arms.items():
        entry: dict[str, Any] = {"seeds": sorted(labels), "checkpoints": {str(s): labels[s] for s in sorted(labels)}}
        for n in ns:
            for m in METRICS:
                got = {s: checkpoint_scores(records, labels[s], agent=agent_of(labels[s]), n=n, metric=m)
                       for s in sorted(labels)}  # fmt: skip
                scores[(arm, n, m)] = got
                per_seed = [float(np.mean(list(v.values()))) for v in got.values()]
                entry.setdefault("by_n", {}).setdefault(str(n), {})[m] = {
                    "per_seed": per_seed,
                    "mean": float(np.mean(per_seed)),
                }
        out["arms"][arm] = entry

    def warm(label: str) -> tuple[dict[tuple[int, str], dict[str, float]], dict[str, Any]]:
        got = {(n, m): checkpoint_scores(records, label, agent=agent_of(label), n=n, metric=m)
               for n in ns for m in METRICS}  # fmt: skip
        by_n = {str(n): {m: float(np.mean(list(got[(n, m)].values()))) for m in METRICS} for n in ns}
        return got, {"checkpoint": label, "agent": agent_of(label), "by_n": by_n}

    pairs = [(arm, ref) for ref in dict.fromkeys((reference, *also_reference)) for arm in arms if arm != ref]
    ws: dict[str, dict[tuple[int, str], dict[str, float]]] = {}  # warm start label -> (N, metric) -> task scores
    if warm_start is not None:
        ws[warm_start], out["warm_start"] = warm(warm_start)
        out["warm_start"].pop("agent")
        pairs += [(arm, "warm_start") for arm in arms if arm not in own_ws]
    for label in dict.fromkeys(own_ws.values()):
        ws[label], entry = warm(label)
        out.setdefault("other_warm_starts", {})[label] = entry
    pairs += [(arm, own_ws[arm]) for arm in arms if arm in own_ws]
    comparisons = []
    for arm, against in pairs:
        label = warm_start if against == "warm_start" else against if against in own_ws.values() else None
        for n in ns:
            row: dict[str, Any] = {"arm": arm, "against": against, "N": n}
            for m in METRICS:
                b = scores[(arm, n, m)]
                a = {s: ws[label][(n, m)] for s in b} if label is not None else scores[(against, n, m)]
                row[m] = compare(a, b, names=(against, arm), level=level)
            comparisons.append(row)
    out["comparisons"] = comparisons
    return out


# A study's per-task results, one row per (arm, seed, N, task) of its agent and one per (N, task) of the warm start
# (arm "warm_start", seed empty): enough to recompute every comparison (``study_from_per_task``). memory_score: the
# task's mean P(gold | question, memory) under the study's fixed scorer, empty where its rollout wrote no memory.
PER_TASK_COLUMNS = ["arm", "seed", "N", "task", "em", "f1", "memory_score"]
WARM_START_ARM = "warm_start"


def per_task_rows(
    records: Sequence[Mapping[str, Any]],
    arms: Mapping[str, Mapping[int, str]],
    *,
    warm_start: str | None = None,
    memory_means: Mapping[tuple[str, int], Mapping[str, float]] | None = None,
    agent: str = "memory",
    agents: Mapping[str, str] | None = None,
    other_warm_starts: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """The rows of per_task.csv (``PER_TASK_COLUMNS``) of ``records`` (results.jsonl's) for ``arms`` (arm -> seed ->
    checkpoint label) and the ``warm_start`` label; ``memory_means``: (label, N) -> task -> mean P (the memory
    scores' ``task_means``), None when the study scored none; ``agents``: label -> its agent where not ``agent``;
    ``other_warm_starts``: more warm-start labels (a ReAct arm's), each a row set of its own (arm: the label, seed
    empty). The warm starts first, then arm, seed, N, task order."""
    check_labels(arms, warm_start, others=other_warm_starts)
    who = {} if warm_start is None else {warm_start: (WARM_START_ARM, "")}
    who |= {label: (label, "") for label in other_warm_starts}
    who |= {label: (arm, str(seed)) for arm, labels in arms.items() for seed, label in sorted(labels.items())}
    order = {label: i for i, label in enumerate(who)}
    own = {label: (agents or {}).get(label, agent) for label in who}  # label -> the agent its rows are of
    kept = sorted((r for r in records if r["checkpoint"] in who and r["agent"] == own[r["checkpoint"]]),
                  key=lambda r: (order[r["checkpoint"]], r["objectives"], r["task_id"]))  # fmt: skip
    rows = []
    for r in kept:
        arm, seed = who[r["checkpoint"]]
        p = (memory_means or {}).get((r["checkpoint"], r["objectives"]), {}).get(r["task_id"])
        rows.append({"arm": arm, "seed": seed, "N": r["objectives"], "task": r["task_id"], "em": float(r["em"]),
                     "f1": float(r["f1"]), "memory_score": "" if p is None else p})  # fmt: skip
    return rows


def study_from_per_task(
    rows: Sequence[Mapping[str, str]],
) -> tuple[list[dict[str, Any]], dict[str, dict[int, str]], str | None, dict[tuple[str, int], dict[str, float]]]:
    """per_task.csv's rows (as ``csv.DictReader`` gives them) -> (records, arms, warm start label, memory means):
    what ``seed_study`` and ``mempo.eval.memory_scores.score_means`` take, the labels "<arm>_s<seed>" and
    "warm_start" (the study's). A ValueError naming the line (2 = the first row) of a malformed or repeated row."""
    key = ("arm", "seed", "N", "task")
    lines = range(2, len(rows) + 2)
    refuse_repeats([tuple(r.get(k) for k in key) for r in rows], key, where="per_task.csv ", numbers=lines)
    records: list[dict[str, Any]] = []
    arms: dict[str, dict[int, str]] = {}
    warm: str | None = None
    means: dict[tuple[str, int], dict[str, float]] = {}
    for line, r in enumerate(rows, start=2):
        missing = [c for c in PER_TASK_COLUMNS if c not in r or r[c] is None]
        try:
            if missing:
                raise ValueError(f"no {', '.join(missing)}")
            n, em, f1 = int(r["N"]), float(r["em"]), float(r["f1"])
            if r["seed"] == "":  # a warm start: the study's, or another arm's own (its label is the arm column)
                label = r["arm"]
                warm = WARM_START_ARM if label == WARM_START_ARM else warm
            else:
                label = f"{r['arm']}_s{int(r['seed'])}"
                arms.setdefault(r["arm"], {})[int(r["seed"])] = label
            if r["memory_score"] != "":
                means.setdefault((label, n), {})[r["task"]] = float(r["memory_score"])
        except ValueError as e:
            raise ValueError(f"per_task.csv line {line}: {e}") from None
        records.append({"checkpoint": label, "agent": "memory", "objectives": n, "task_id": r["task"], "em": em,
                        "f1": f1})  # fmt: skip
    return records, arms, warm, means


def _nums(xs: Sequence[float], digits: int = 3) -> str:
    return ", ".join(f"{x:+.{digits}f}" if x < 0 else f"{x:.{digits}f}" for x in xs)


COMPARISON_NOTE = (
    "Paired by seed and task, every seed on the same tasks (a crossed design). The verdict reads the seed-plus-task "
    "t-interval: Var = s^2(seed means) / K + s^2(task means over seeds) / T, Welch-Satterthwaite df (both variance "
    "sources). Beside it the crossed bootstrap (seeds resampled, one task draw shared by all of them; too narrow with "
    "few seeds where the seeds dominate). One seed: no interval, and the bootstrap is then over tasks alone."
)


def comparison_table(comparisons: Sequence[Mapping[str, Any]], metrics: Sequence[str], *, digits: int = 3) -> str:
    """The comparisons of a seed-level report (rows {"arm", "against", "N", metric: ``compare``'s result}) as one
    markdown table: per-seed paired differences, their mean, the seed-plus-task t-interval and its df, the crossed
    bootstrap, the verdict. A comparison that could not be made (no "mean") shows its verdict alone; one of one seed
    shows "(one seed)" for the interval."""

    def pair(lo_hi: Sequence[float]) -> str:
        return f"[{lo_hi[0]:.{digits}f}, {lo_hi[1]:.{digits}f}]"

    cols = ["comparison", "N", "metric", "per-seed differences", "mean", "seed+task t-interval", "df",
            "crossed bootstrap", "verdict"]  # fmt: skip
    rows = []
    for c in comparisons:
        for m in metrics:
            r = c[m]
            row = dict.fromkeys(cols, "") | {"comparison": f"{c['arm']} - {c['against']}", "N": c["N"],
                                               "metric": m.upper(), "verdict": r["verdict"]}  # fmt: skip
            if "mean" in r:
                one = "(one seed)" if len(r["seeds"]) < 2 else "(one task)"
                row |= {
                    "per-seed differences": _nums(r["per_seed"], digits),
                    "mean": f"{r['mean']:.{digits}f}",
                    "seed+task t-interval": pair(r["interval"]) if r["interval"] else one,
                    "df": f"{r['df']:.1f}" if r["df"] is not None else "",
                    "crossed bootstrap": pair(r["crossed_bootstrap"]),
                }
            rows.append(row)
    return COMPARISON_NOTE + "\n\n" + markdown_table(rows, cols)


def pool_studies(
    studies: Sequence[Mapping[str, Any]], names: Sequence[str], *, level: float = 0.95
) -> list[dict[str, Any]]:
    """The same comparisons of W studies (``seed_study`` reports, e.g. one per synthetic world: strata) pooled: per
    (arm, against, N) that every study holds and metric, the unweighted mean over studies of their differences with
    ``stratified_t_interval`` (the studies fixed strata), each study's own mean, and for two studies the difference
    between them (second - first, Var = Var_1 + Var_2, Welch-Satterthwaite df): whether the effect differs between
    them. A comparison without an interval in some study (one seed) is left out, named in the ValueError if none is
    left."""
    if len(studies) != len(names) or not studies:
        raise ValueError(f"pool_studies: one name per study, got {len(names)} names for {len(studies)} studies")
    keyed = [{(c["arm"], c["against"], c["N"]): c for c in st["comparisons"]} for st in studies]
    common = [k for k in keyed[0] if all(k in other for other in keyed[1:])]
    out = []
    for key in common:
        row: dict[str, Any] = {"arm": key[0], "against": key[1], "N": key[2], "studies": list(names)}
        for m in METRICS:
            got = [kd[key][m] for kd in keyed]
            if not all(g.get("var") is not None and g.get("df") for g in got):
                break
            means, variances, dfs = ([g[k] for g in got] for k in ("mean", "var", "df"))
            mean, lo, hi, df = stratified_t_interval(means, variances, dfs, level=level)
            row[m] = {"by_study": means, "mean": mean, "interval": [lo, hi], "df": df, "verdict": verdict(lo, hi),
                      "level": level}  # fmt: skip
            if len(got) == 2:  # the second study's difference minus the first's
                diff, lo2, hi2, df2 = stratified_t_interval(means, variances, dfs, weights=[-1.0, 1.0], level=level)
                row[m]["between"] = {"mean": diff, "interval": [lo2, hi2], "df": df2}
        else:
            out.append(row)
    if not out:
        raise ValueError(f"pool_studies: no comparison with an interval in every study of {list(names)}")
    return out


def pooled_markdown(pooled: Sequence[Mapping[str, Any]], *, digits: int = 3) -> str:
    """``pool_studies``' rows as one markdown table: each study's mean, the pooled mean and interval, its df, the
    verdict, and for two studies the difference between them with its interval."""

    def pair(lo_hi: Sequence[float]) -> str:
        return f"[{lo_hi[0]:.{digits}f}, {lo_hi[1]:.{digits}f}]"

    names = pooled[0]["studies"] if pooled else []
    cols = ["comparison", "N", "metric", *[f"{n} mean" for n in names], "pooled mean", "pooled interval", "df",
            "verdict", "between studies"]  # fmt: skip
    rows = []
    for c in pooled:
        for m in METRICS:
            r = c[m]
            between = r.get("between")
            rows.append(
                {"comparison": f"{c['arm']} - {c['against']}", "N": c["N"], "metric": m.upper(),
                 **{f"{n} mean": f"{v:.{digits}f}" for n, v in zip(names, r["by_study"], strict=True)},
                 "pooled mean": f"{r['mean']:.{digits}f}", "pooled interval": pair(r["interval"]),
                 "df": f"{r['df']:.1f}", "verdict": r["verdict"],
                 "between studies": f"{between['mean']:+.{digits}f} {pair(between['interval'])}" if between else ""}
            )  # fmt: skip
    return markdown_table(rows, cols)


def study_markdown(study: Mapping[str, Any]) -> str:
    """Two markdown tables of a ``seed_study``: the arms (per-seed EM and F1, seed means), then the comparisons
    (``comparison_table``)."""

    arm_rows = []
    for arm, e in study["arms"].items():
        for n, by in e["by_n"].items():
            arm_rows.append({
                "arm": arm, "N": n, "seeds": ", ".join(map(str, e["seeds"])),
                "EM per seed": _nums(by["em"]["per_seed"]), "EM seed mean": by["em"]["mean"],
                "F1 per seed": _nums(by["f1"]["per_seed"]), "F1 seed mean": by["f1"]["mean"],
            })  # fmt: skip
    warm = [study["warm_start"]] if study.get("warm_start") else []
    for entry in [*warm, *study.get("other_warm_starts", {}).values()]:
        for n, by in entry["by_n"].items():
            row = {"arm": f"warm start ({entry['checkpoint']})", "N": n, "seeds": "(one checkpoint)"}
            arm_rows.append(
                row | {"EM per seed": "", "EM seed mean": by["em"], "F1 per seed": "", "F1 seed mean": by["f1"]}
            )
    cols = ["arm", "N", "seeds", "EM per seed", "EM seed mean", "F1 per seed", "F1 seed mean"]
    out = [markdown_table(arm_rows, cols)]
    if study["comparisons"]:
        out += ["", comparison_table(study["comparisons"], METRICS)]
    return "\n".join(out)


def parse_arm(spec: str) -> tuple[str, dict[int, str]]:
    """``NAME=SEED:LABEL,SEED:LABEL`` (``--arm``) -> (NAME, seed -> checkpoint label)."""
    name, sep, rest = spec.partition("=")
    pairs = [p.partition(":") for p in rest.split(",") if p]
    if not sep or not name or not pairs or any(not c or not s.strip().lstrip("-").isdigit() for s, c, _ in pairs):
        raise ValueError(f"--arm {spec!r}: expected NAME=SEED:LABEL,SEED:LABEL (e.g. mempo=0:mempo_s0,1:mempo_s1)")
    labels = {int(s): label for s, _, label in pairs}
    if len(labels) != len(pairs):
        raise ValueError(f"--arm {spec!r}: a seed given twice")
    return name, labels


def turns_and_failures(
    records: Sequence[Mapping[str, Any]],
    failures: Sequence[Mapping[str, Any]],
    arms: Mapping[str, Mapping[int, str]],
    *,
    agent: str = "memory",
    agents: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Per arm (and checkpoint label, e.g. the warm start, given as an arm of one seed) and N: the mean turns per
    task of each seed and their mean, the mean TT and PT (tokens processed per task, peak tokens of one turn) over its
    seeds, and the failure verdicts (``mempo.eval.failures``) summed over its seeds (``failures``: an evaluation's
    tally rows; none for data without reasoning chains). ``agents``: label -> its agent where not ``agent``."""
    from mempo.eval.failures import VERDICTS

    def agent_of(label: str) -> str:
        return (agents or {}).get(label, agent)

    used = {agent_of(label) for labels in arms.values() for label in labels.values()}
    out: dict[str, Any] = {}
    for arm, labels in arms.items():
        for n in sorted({r["objectives"] for r in records if r["agent"] in used}):
            own = {s: [r for r in records if r["checkpoint"] == labels[s] and r["agent"] == agent_of(labels[s])
                        and r["objectives"] == n] for s in sorted(labels)}  # fmt: skip
            if not all(own.values()):
                continue
            turns = [float(np.mean([float(r["turns"]) for r in rs])) for rs in own.values()]
            tallies = [f for f in failures if f["checkpoint"] in set(labels.values())
                       and f["agent"] == agent_of(f["checkpoint"]) and f["objectives"] == n]  # fmt: skip
            entry: dict[str, Any] = {"turns_per_seed": turns, "turns": float(np.mean(turns))}
            for key in ("tt", "pt"):
                if all(key in r for rs in own.values() for r in rs):
                    entry[key] = float(np.mean([float(r[key]) for rs in own.values() for r in rs]))
            if tallies:
                entry["verdicts"] = {v: int(sum(f[v] for f in tallies)) for v in VERDICTS}
            out.setdefault(arm, {})[str(n)] = entry
    return out


def turns_and_failures_markdown(table: Mapping[str, Any]) -> str:
    """One row per arm and N: turns per task (per seed, mean), TT and PT, and the failure verdicts summed over seeds."""
    from mempo.eval.failures import VERDICTS

    rows = [
        {"arm": arm, "N": n, "turns per seed": ", ".join(f"{t:.2f}" for t in e["turns_per_seed"]), "turns": e["turns"]}
        | {k.upper(): e[k] for k in ("tt", "pt") if k in e}
        | e.get("verdicts", {})
        for arm, by_n in table.items()
        for n, e in by_n.items()
    ]
    tokens = [k for k in ("TT", "PT") if any(k in r for r in rows)]
    verdicts = [v for v in VERDICTS if any(v in r for r in rows)]
    return markdown_table(rows, ["arm", "N", "turns per seed", "turns", *tokens, *verdicts])
