"""The ``headline`` stage: the paper's headline in miniature, MemPO vs GRPO vs a ReAct agent as N grows.

Five arms, evaluated greedily on the same held-out tasks for every N in ``eval.objectives`` (tasks of N objectives
get 2N + 1 + ``eval.turn_slack`` turns), each with its own agent:

    warm_start        SFT on the oracle's trajectories, rendered by the memory prompt builder      memory agent
    mempo             RL from warm_start with the run's config (MemPO)                             memory agent
    ablation_nomem    the same plus exp/ablation_nomem.yaml's delta (memory.alpha=0: GRPO)         memory agent
    react_warm_start  SFT on the same teacher trajectories, rendered by the full-history builder   full-history agent
    react_grpo        RL from react_warm_start plus exp/grpo_react.yaml's delta                    full-history agent

The RL arms differ from the run's config only by those deltas (and their warm start): the same trainer.max_steps,
data sizes, seed and optimizer, so the same budget. A warm start or arm whose ``<run_dir>/<label>/hf/config.json``
exists is reused, not retrained; ``headline.warm_start`` / ``headline.react_warm_start`` name warm starts elsewhere.

Outputs: ``<run_dir>/eval/`` table.csv, table.md, f1_vs_n.png, pt_vs_n.png, tt_vs_n.png (``mempo.eval.headline``);
``<run_dir>/eval/grid/`` the evaluation's full report (results.jsonl, paired intervals, failure tallies);
``<run_dir>/summary.json`` the rows, the token ratios at the largest N, what was trained or reused, and timings.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from mempo.config import CONFIG_DIR

WARM_STARTS = {"warm_start": "memory", "react_warm_start": "full_history"}  # label -> agent.context of its SFT data
RL_ARMS = {  # arm -> (its warm start, the experiment file whose delta it applies; None = the run's config as is)
    "mempo": ("warm_start", None),
    "ablation_nomem": ("warm_start", "ablation_nomem"),
    "react_grpo": ("react_warm_start", "grpo_react"),
}
ARMS = ("warm_start", "mempo", "ablation_nomem", "react_warm_start", "react_grpo")  # rows and lines in this order


def arm_agent(arm: str) -> str:
    """The agent (context mode) an arm is trained and evaluated with: its warm start's."""
    return WARM_STARTS[arm] if arm in WARM_STARTS else WARM_STARTS[RL_ARMS[arm][0]]


def exp_delta(name: str | None) -> dict[str, Any]:
    """The dotted keys ``experiments/configs/exp/<name>.yaml`` sets, less ``name`` and ``stage`` ({} for None)."""
    if name is None:
        return {}
    raw = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "exp" / f"{name}.yaml"))
    if "defaults" in raw:  # a file that swaps config groups is not a plain key delta
        raise ValueError(f"exp/{name}.yaml has a defaults list; the headline applies plain key deltas only")
    flat: dict[str, Any] = {}

    def walk(d: dict[str, Any], prefix: str) -> None:
        for k, v in d.items():
            if isinstance(v, dict):
                walk(v, f"{prefix}{k}.")
            else:
                flat[prefix + k] = v

    walk(raw, "")
    return {k: v for k, v in flat.items() if k not in ("name", "stage")}


def arm_overrides(arm: str) -> dict[str, Any]:
    """The keys an RL arm sets on top of the run's config."""
    delta = exp_delta(RL_ARMS[arm][1])
    if delta.get("agent.context", arm_agent(arm)) != arm_agent(arm):
        raise ValueError(f"{arm}: its experiment sets agent.context={delta['agent.context']}, its warm start another")
    return {"agent.context": arm_agent(arm), **delta}


def _ready(hf: Path) -> bool:
    return (hf / "config.json").is_file()


def run_headline(cfg: DictConfig) -> dict[str, Any]:
    """Warm starts, RL arms (each trained unless its checkpoint exists), then the evaluation, table and figures."""
    from mempo.builders import run_path
    from mempo.entry import _write_json, fit_rl, train_sft, with_overrides
    from mempo.eval.compare import run_eval
    from mempo.eval.headline import write_headline
    from mempo.eval.report import read_records

    start = time.perf_counter()
    out = run_path(cfg)
    folders: dict[str, Path] = {}
    status: dict[str, str] = {}  # label -> trained | reused | given
    phases: dict[str, float] = {}

    for label, context in WARM_STARTS.items():
        t = time.perf_counter()
        given = cfg.headline[label]
        hf = Path(given) if given else out / label / "hf"
        if given:
            status[label] = "given"
            print(f"[mempo] {label}: using {hf} (headline.{label})")
        elif _ready(hf):
            status[label] = "reused"
            print(f"[mempo] {label}: reusing {hf} (delete it to train it again)")
        else:
            status[label] = "trained"
            print(f"[mempo] {label}: warm start on the oracle's trajectories rendered with the {context} prompts")
            overrides = {"stage": "sft", "run_dir": str(out / label), "name": f"{cfg.name}-{label}"}
            train_sft(with_overrides(cfg, {**overrides, "agent.context": context}))
        folders[label] = hf
        phases[f"{label}_s"] = time.perf_counter() - t

    for arm, (warm, _) in RL_ARMS.items():
        t = time.perf_counter()
        hf = out / arm / "hf"
        if _ready(hf):
            status[arm] = "reused"
            print(f"[mempo] {arm}: reusing {hf} (delete it to train it again)")
        else:
            status[arm] = "trained"
            delta = arm_overrides(arm)
            print(f"[mempo] {arm}: {cfg.trainer.max_steps} RL steps from {warm} with {delta}")
            overrides = {"stage": "rl", "run_dir": str(out / arm), "name": f"{cfg.name}-{arm}"}
            module, _ = fit_rl(with_overrides(cfg, {**overrides, "model.name_or_path": str(folders[warm]), **delta}))
            del module
        folders[arm] = hf
        phases[f"{arm}_s"] = time.perf_counter() - t

    t = time.perf_counter()
    n_list = list(cfg.eval.objectives)
    print(f"[mempo] evaluation: {len(ARMS)} arms on the same {cfg.eval.num_tasks} held-out tasks per N = {n_list}")
    checkpoints = "{" + ", ".join(f"{a}: '{folders[a]}'" for a in ARMS) + "}"
    ev = run_eval(
        with_overrides(cfg, {"eval.checkpoints": checkpoints}),
        agents={a: [arm_agent(a)] for a in ARMS},
        out=out / "eval" / "grid",
    )
    records = read_records(Path(ev["files"]["results"]))
    files, rows, ratios = write_headline(out / "eval", records, num_tasks=cfg.eval.num_tasks)
    phases["eval_s"] = time.perf_counter() - t
    phases["total_s"] = time.perf_counter() - start
    summary = {
        "stage": "headline",
        "arms": {a: {"agent": arm_agent(a), "folder": str(folders[a]), "status": status[a]} for a in ARMS},
        "rl_overrides": {a: arm_overrides(a) for a in RL_ARMS},
        "objectives": n_list,
        "eval_tasks": cfg.eval.num_tasks,
        "rows": rows,
        "ratios": ratios,
        "phases": phases,
        "files": {k: str(v) for k, v in files.items()} | {"grid": ev["out"]},
    }
    _write_json(out / "summary.json", summary)
    print("\n" + files["table_md"].read_text())
    print(f"[mempo] done in {phases['total_s']:.0f} s; table and figures in {out / 'eval'}")
    return summary
