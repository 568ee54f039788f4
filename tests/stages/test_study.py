"""The ``study`` stage: its arm-seed configs (read off exp/study.yaml, exp/grpo_cpu.yaml and config.yaml by hand),
its expected time, what it does with a run folder it finds, and a tiny study end to end (``+exp=study
+debug=default``: 2 arms x 2 seeds of the tiny model, each its own experiments/run.py process) whose study.json is
checked for structure."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
import yaml

import mempo.stages.study as study_stage
from mempo.stages import run_stage
from mempo.stages.config import check_paths, compose_config
from mempo.stages.demo import DEMO_RATES
from mempo.stages.study import arm_seed_configs, evaluate_in_turn, evaluate_once, expected_seconds, run_arm_seed


def test_every_arm_seed_runs_the_recipe_with_its_delta_and_the_studys_budget(tmp_path: Path) -> None:
    cfg = compose_config("+exp=study", f"run_dir={tmp_path}")
    runs = arm_seed_configs(cfg)
    assert list(runs) == [("ablation", 0), ("ablation", 1), ("ablation", 2), ("mempo", 0), ("mempo", 1), ("mempo", 2)]
    for (arm, seed), c in runs.items():
        assert c.stage == "rl" and c.seed == seed and c.run_dir == str(tmp_path / arm / f"seed{seed}")
        assert c.model.name_or_path == str(tmp_path / "warm_start" / "hf")
        assert c.memory.alpha == (0.0 if arm == "ablation" else 1.0)  # the arms' one difference
        # exp/grpo_cpu.yaml's recipe: 4 tasks x G=8, top 8 layers, lr 3e-5, mean-EM reward, a checkpoint every 5
        assert (c.data.batch_size, c.data.group_size, c.model.train_top_layers) == (4, 8, 8)
        assert (c.optim.lr, c.reward.kind, c.ckpt.every_n_steps) == (3.0e-5, "mean_em", 5)
        # the study's: exp/study.yaml's 6 steps (not grpo_cpu's 10), no in-training validation (not its 10)
        assert c.trainer.max_steps == 6 and c.eval.every_n_steps == 0
    assert cfg.eval.num_tasks == 128 and list(cfg.eval.objectives) == [2] and cfg.eval.engine_dtype == "float32"


def test_study_lora_runs_the_lora_recipe_against_the_full_one(tmp_path: Path) -> None:
    """exp/study_lora.yaml read by hand: exp/study.yaml's arms dropped (null), grpo_cpu as it is against
    grpo_cpu_lora's adapters (rank 16, alpha 32, every layer: train_top_layers null), everything else the same."""
    runs = arm_seed_configs(compose_config("+exp=study_lora", f"run_dir={tmp_path}"))
    assert list(runs) == [("full", 0), ("full", 1), ("full", 2), ("lora", 0), ("lora", 1), ("lora", 2)]
    full, lora = runs[("full", 1)], runs[("lora", 1)]
    assert (full.model.train_top_layers, full.model.lora.rank) == (8, 0)
    assert (lora.model.train_top_layers, lora.model.lora.rank, lora.model.lora.alpha) == (None, 16, 32.0)
    for c in (full, lora):  # the recipe and the study's budget, as in the MemPO study
        assert (c.optim.lr, c.memory.alpha, c.trainer.max_steps, c.data.batch_size) == (3.0e-5, 0.0, 6, 4)


def test_null_drops_an_arm_from_the_command_line(tmp_path: Path) -> None:
    cfg = compose_config("+exp=study", "study.arms.mempo=null", "+study.arms.ptf.memory.normalize=per_turn",
                         "+study.arms.ptf.memory.alpha=1.0", f"run_dir={tmp_path}")  # fmt: skip
    runs = arm_seed_configs(cfg)
    assert sorted({arm for arm, _ in runs}) == ["ablation", "ptf"]
    assert (runs[("ptf", 0)].memory.normalize, runs[("ptf", 0)].memory.alpha) == ("per_turn", 1.0)
    with pytest.raises(ValueError, match=r"study\.reference='mempo' must be one of the arms \['ablation'\]"):
        compose_config("+exp=study", "study.arms.mempo=null", "study.reference=mempo")


def test_bad_study_keys_are_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"study\.reference='nope' must be one of the arms"):
        compose_config("+exp=study", "study.reference=nope")
    with pytest.raises(
        ValueError, match=r"study\.also_reference=\['react'\] must name arms among \['ablation', 'mempo'\]"
    ):
        compose_config("+exp=study", "study.also_reference=[react]")
    with pytest.raises(ValueError, match=r"study\.also_reference=\['ablation'\] must name arms .* other than"):
        compose_config("+exp=study", "study.also_reference=[ablation]")
    with pytest.raises(ValueError, match=r"study\.seeds=\[0, 0\] must not repeat a seed"):
        compose_config("+exp=study", "study.seeds=[0,0]")
    with pytest.raises(ValueError, match=r"study\.arms\.mempo: its run's config is invalid: .*no_such"):
        arm_seed_configs(compose_config("+exp=study", "+study.arms.mempo.memory.no_such=1"))
    with pytest.raises(FileNotFoundError, match=r"study\.warm_start='.*nowhere': not a model folder"):
        check_paths(compose_config("+exp=study", f"study.warm_start={tmp_path / 'nowhere'}"))


def test_the_expected_time_scales_the_measured_rates(tmp_path: Path) -> None:
    cfg = compose_config("+exp=study", f"run_dir={tmp_path}", "study.seeds=[0,1]", "eval.num_tasks=10")
    r = DEMO_RATES["avx512_bf16"]
    got = expected_seconds(cfg, arm_seed_configs(cfg), "avx512_bf16")
    # by hand: the warm start, 96 teacher tasks each of 1 and 2 objectives; 4 runs of 6 steps x 4 tasks x G=8 at the
    # grpo_cpu recipe's measured rate (the study's default recipe), MemPO's two at 1.55x (they score their memories; the
    # factor measured on this kind);
    # 5 checkpoints x 10 two-objective tasks at the float32 engine's measured rate
    ws = r["startup"] + 288 * r["sft_objective"]
    run = r["startup"] + 192 * study_stage.STUDY_RL_ROLLOUT_S["avx512_bf16"]  # grpo_cpu's own rate
    mempo = r["startup"] + 192 * study_stage.STUDY_RL_ROLLOUT_S["avx512_bf16"] * 1.55
    ev = 5 * (r["startup"] + 20 * study_stage.FLOAT32_EVAL_S["avx512_bf16"])
    # the fixed scorer: 5 checkpoints x 10 tasks x 2 objectives x 2 memories an objective
    sc = r["startup"] + 200 * study_stage.SCORE_S_PER_MEMORY["avx512_bf16"]
    torch.testing.assert_close(
        torch.tensor([got["warm_start"], got["runs"], got["eval"], got["memory_scores"], got["total"]],
                     dtype=torch.float64),
        torch.tensor([ws, 2 * run + 2 * mempo, ev, sc, ws + 2 * run + 2 * mempo + ev + sc], dtype=torch.float64),
    )  # fmt: skip


def test_the_expected_time_prices_a_full_history_checkpoint_s_evaluation_higher(tmp_path: Path) -> None:
    react = ("+study.arms.react.agent.context=full_history", "+study.arms.react.advantage.estimator=grpo")
    cfg = compose_config("+exp=study", f"run_dir={tmp_path}", "study.seeds=[0]", "eval.num_tasks=10", *react)
    r = DEMO_RATES["avx512_bf16"]
    got = expected_seconds(cfg, arm_seed_configs(cfg), "avx512_bf16")
    # by hand: warm_start, ablation_s0 and mempo_s0 run the memory agent; react_warm_start and react_s0 full history,
    # each 10 two-objective tasks at 0.97 s an objective (EPYC, float32), times 2.6 for full history
    memory, full = r["startup"] + 20 * 0.97, r["startup"] + 20 * 0.97 * 2.6
    assert got["checkpoints"] == 5
    torch.testing.assert_close(got["eval"], 3 * memory + 2 * full)
    # and its RL run at 1.78x the ablation's step (grpo_cpu: 6 steps x 4 tasks x G = 8 at the study's float32-engine
    # rate; MemPO's at the memory-scoring factor, 1.55 on this kind)
    rollouts, rate = 6 * 32, study_stage.STUDY_RL_ROLLOUT_S["avx512_bf16"]
    runs = [r["startup"] + rollouts * rate * factor for factor in (1.0, 1.55, 1.78)]
    torch.testing.assert_close(got["runs"], sum(runs))


def test_the_expected_time_leaves_out_the_checkpoints_an_earlier_evaluation_holds(tmp_path, monkeypatch) -> None:
    """A finished one-arm study's evaluation (warm start, ablation seed 0), then the MemPO arm added: only MemPO's
    checkpoint is expected to be evaluated, while every checkpoint's memories are scored again."""
    base = ("+exp=study", f"run_dir={tmp_path}", "study.seeds=[0]", "eval.num_tasks=10")
    one_arm = compose_config(*base, "study.arms.mempo=null")
    folders = study_stage.study_checkpoints(one_arm, arm_seed_configs(one_arm))
    for f in folders.values():
        f.mkdir(parents=True)
        (f / "config.json").write_text("{}")

    def fake_run_eval(c, *, out, done=None, agents=None):
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.jsonl").write_text("")
        rows = [{"checkpoint": label} for label in c.eval.checkpoints]
        return {"rows": rows, "out": str(out), "files": {"results": str(out / "results.jsonl")}}

    monkeypatch.setattr(study_stage, "run_eval", fake_run_eval)
    study_stage.evaluate_once(one_arm, folders, tmp_path / "eval")
    both = compose_config(*base)
    r = DEMO_RATES["avx512_bf16"]
    per_checkpoint = r["startup"] + 20 * study_stage.FLOAT32_EVAL_S["avx512_bf16"]
    got = expected_seconds(both, arm_seed_configs(both), "avx512_bf16")
    assert (got["checkpoints"], got["kept"], got["to_train"]) == (3, 2, 1)
    torch.testing.assert_close(got["eval"], per_checkpoint)
    scores = r["startup"] + 3 * 20 * 2 * study_stage.SCORE_S_PER_MEMORY["avx512_bf16"]
    torch.testing.assert_close(got["memory_scores"], scores)
    other = compose_config(*base, "eval.num_tasks=12")  # another evaluation config keeps nothing
    assert expected_seconds(other, arm_seed_configs(other), "avx512_bf16")["kept"] == 0


OFF = ("optim.shared_prefix=false", "optim.head_grad_in_forward=false")  # the fast path's update switches as before


@pytest.mark.parametrize(
    ("recipe", "extra", "kind", "rate", "speedup"),
    [
        # bf16 engine on a bf16 CPU: the fast path's measured rate, over the learning check's 1,429 / 1,151 s of steps
        # with both update switches on (auto: a CPU update, unsharded, the head frozen under train_top_layers)
        ("grpo_cpu_40", (), "avx512_bf16", "fast", 1.24),
        ("grpo_cpu_40", OFF, "avx512_bf16", "fast", 1.0),  # switched off: the rate as measured before them
        ("grpo_cpu_40", OFF[1:], "avx512_bf16", "fast", 1.05),  # the shared prefix alone: 1,429 / 1,366 s
        ("grpo_cpu_40", (), "amx", "fast", 1.0),  # the same at the rate measured with AMX (switches not timed there)
        ("grpo_cpu", (), "amx", "study", 1.0),
        ("grpo_cpu_40", (), "avx2", "study", 1.0),  # its engine switches resolve off on AVX2: grpo_cpu's rate
        ("grpo_cpu", (), "avx512_bf16", "study", 1.0),
        ("grpo_cpu_lora", (), "avx512_bf16", "demo", 1.0),  # every layer adapts: the demo recipe's rate
    ],
)
def test_the_expected_rl_time_follows_the_recipe(tmp_path, recipe, extra, kind, rate, speedup) -> None:
    cfg = compose_config("+exp=study", f"run_dir={tmp_path}", f"study.recipe={recipe}", "study.arms.mempo=null",
                         "study.seeds=[0]", "trainer.max_steps=40", "study.warm_start=x", *extra)  # fmt: skip
    per_rollout = {"fast": study_stage.FAST_PATH_ROLLOUT_S.get(kind), "study": study_stage.STUDY_RL_ROLLOUT_S[kind],
                   "demo": DEMO_RATES[kind]["rl_rollout"]}[rate]  # fmt: skip
    got = expected_seconds(cfg, arm_seed_configs(cfg), kind)
    # by hand: one run of 40 steps x 4 tasks x G = 8 (the grpo_cpu family's batch) at that rate, plus start-up
    torch.testing.assert_close(got["runs"], DEMO_RATES[kind]["startup"] + 40 * 32 * per_rollout / speedup)


@pytest.mark.parametrize("kind", ["amx", "avx512_bf16"])
def test_a_run_that_scores_its_memories_is_priced_at_its_kinds_factor(tmp_path: Path, kind: str) -> None:
    cfg = compose_config("+exp=study", f"run_dir={tmp_path}", "study.recipe=grpo_cpu_40", "study.seeds=[0]",
                         "trainer.max_steps=40", "study.warm_start=x")  # fmt: skip
    runs = arm_seed_configs(cfg)
    assert sorted(a for a, _ in runs) == ["ablation", "mempo"]
    got = expected_seconds(cfg, runs, kind)
    # by hand, the factors measured per kind (the MemPO study on the AMX Xeon: 2.0; world 1 of the horizon study on
    # the EPYC: 4,447 / 2,876 s = 1.55): the ablation at the fast path's rate, MemPO at that rate times the factor
    # (on the EPYC over 1.24, the fast path's update switches, as in the test above)
    rate, factor = {"amx": (1.45, 2.0), "avx512_bf16": (2.35 / 1.24, 1.55)}[kind]
    startup = DEMO_RATES[kind]["startup"]
    torch.testing.assert_close(got["runs"], 2 * startup + 40 * 32 * rate * (1 + factor))


@pytest.mark.parametrize(
    ("holds", "expected"),
    [
        ((), ("new", {"resume": False, "overwrite": False})),
        (("checkpoints/last.ckpt", "metrics.csv", "study_run.yaml"), ("resumed", {"resume": True, "overwrite": False})),
        (("metrics.csv",), ("trained", {"resume": False, "overwrite": True})),  # killed before its first checkpoint
        (("hf/config.json", "study_run.yaml"), ("reused", None)),  # finished, with the config it would train now
    ],
)
def test_a_run_folder_is_reused_continued_or_started(tmp_path, monkeypatch, holds, expected) -> None:
    cfg = compose_config("+exp=study", f"run_dir={tmp_path}")
    sub = arm_seed_configs(cfg)[("mempo", 1)]
    folder = Path(sub.run_dir)
    for name in holds:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        if name == "study_run.yaml":
            study_stage.write_run_config(sub)  # what launch wrote when it trained this run
        else:
            (folder / name).write_text("{}")
    launched = []

    def fake_launch(c) -> None:  # the process would export its policy
        launched.append({"resume": c.resume, "overwrite": c.overwrite})
        (folder / "hf").mkdir(parents=True, exist_ok=True)
        (folder / "hf" / "config.json").write_text("{}")

    monkeypatch.setattr(study_stage, "launch", fake_launch)
    status = run_arm_seed(cfg, sub, "mempo seed 1")
    assert status == ("trained" if expected[0] == "new" else expected[0])
    assert launched == ([] if expected[1] is None else [expected[1]])


def test_a_finished_run_without_a_saved_config_is_not_reused(tmp_path) -> None:
    cfg = compose_config("+exp=study", f"run_dir={tmp_path}")
    sub = arm_seed_configs(cfg)[("mempo", 1)]
    (Path(sub.run_dir) / "hf").mkdir(parents=True)
    (Path(sub.run_dir) / "hf" / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="none of study_run.yaml, config.yaml.*overwrite=true.*new run_dir"):
        run_arm_seed(cfg, sub, "mempo seed 1")


def test_a_finished_run_is_reused_only_when_its_saved_config_is_the_one_it_would_train_now(tmp_path, monkeypatch):
    """The real ``launch`` writes study_run.yaml; only the experiments/run.py process is replaced (it would train that
    config and export its policy). A rerun into the same folder reuses the run when nothing it trains with changed
    (more seeds, as S2 reused S1's; another evaluation), and refuses, naming the keys and the ways out, when an arm's
    delta, the warm start or the steps changed."""

    def run_py(cmd, env, check):
        folder = Path(next(a for a in cmd if a.startswith("hydra.run.dir=")).split("=", 1)[1])
        assert (folder / "study_run.yaml").is_file()
        (folder / "hf").mkdir(parents=True, exist_ok=True)
        (folder / "hf" / "config.json").write_text("{}")
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(study_stage.subprocess, "run", run_py)

    def arm_seed(*extra: str):
        cfg = compose_config("+exp=study", "+debug=default", f"run_dir={tmp_path}", *extra)
        return cfg, arm_seed_configs(cfg)[("mempo", 0)]

    assert run_arm_seed(*arm_seed(), "mempo seed 0") == "trained"
    same = arm_seed("study.seeds=[0,1,2]", "eval.num_tasks=3", "study.memory_scores=false", "study.reference=mempo")
    assert run_arm_seed(*same, "mempo seed 0") == "reused"
    folder = tmp_path / "mempo" / "seed0"
    for extra, change in (
        (("+study.arms.mempo.optim.lr=3e-5",), r"optim\.lr \(1e-05 -> 3e-05\)"),
        ((f"study.warm_start={tmp_path / 'other'}",), rf"model\.name_or_path \({tmp_path}/warm_start/hf -> "),
        (("trainer.max_steps=3",), r"trainer\.max_steps \(2 -> 3\)"),
    ):
        with pytest.raises(ValueError, match=rf"{folder}.*{change}.*overwrite=true.*run_dir"):
            run_arm_seed(*arm_seed(*extra), "mempo seed 0")
    assert run_arm_seed(*arm_seed("trainer.max_steps=3", "overwrite=true"), "mempo seed 0") == "trained"


def test_keys_added_to_the_code_since_a_run_trained_refuse_it_only_off_their_default(tmp_path, monkeypatch) -> None:
    """A run trained by older code: its study_run.yaml lacks keys the config has now. One the run would train with at
    its schema default (config.py: optim.skip_no_signal=true, loss.kl_coef=0.001 by default) is how the old code
    behaved: reused, said so. One set off its default (this recipe's loss.kl_coef=0) is a change: refused. A key
    the code no longer has does not refuse it either."""
    cfg = compose_config("+exp=study", "+debug=default", f"run_dir={tmp_path}")
    sub = arm_seed_configs(cfg)[("mempo", 0)]
    assert (sub.optim.skip_no_signal, sub.loss.kl_coef) == (True, 0.0)
    saved = study_stage.write_run_config(sub)
    (saved.parent / "hf").mkdir()
    (saved.parent / "hf" / "config.json").write_text("{}")

    def older(drop: str) -> None:
        plain = yaml.safe_load(saved.read_text())
        group, key = drop.split(".")
        del plain[group][key]
        plain["optim"]["a_removed_option"] = 3
        saved.write_text(yaml.safe_dump(plain))

    older("optim.skip_no_signal")
    messages = []
    monkeypatch.setattr(study_stage, "say", messages.append)
    assert run_arm_seed(cfg, sub, "mempo seed 0") == "reused"
    assert "optim.skip_no_signal (added since, at its default True)" in messages[-1]
    assert "optim.a_removed_option (no longer a key; it was 3)" in messages[-1]
    study_stage.write_run_config(sub)
    older("loss.kl_coef")
    with pytest.raises(ValueError, match=r"loss\.kl_coef \(\(unset\) -> 0\.0\)"):
        run_arm_seed(cfg, sub, "mempo seed 0")


def test_the_evaluation_is_reused_only_for_the_same_config_and_exports(tmp_path, monkeypatch) -> None:
    cfg = compose_config("+exp=study", f"run_dir={tmp_path}")
    folders = {}
    for label in ("warm_start", "ablation_s0"):
        folders[label] = tmp_path / label / "hf"
        folders[label].mkdir(parents=True)
        (folders[label] / "config.json").write_text("{}")
    calls = []

    def fake_run_eval(c, *, out, done=None, agents=None):  # the real one runs in the tiny study below
        calls.append(dict(c.eval.checkpoints))
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.jsonl").write_text("")
        return {"rows": [], "out": str(out), "files": {"results": str(out / "results.jsonl")}}

    monkeypatch.setattr(study_stage, "run_eval", fake_run_eval)
    out = tmp_path / "eval"
    assert evaluate_once(cfg, folders, out)[1] == "evaluated"
    assert evaluate_once(cfg, folders, out)[1] == "reused" and len(calls) == 1
    other = compose_config("+exp=study", f"run_dir={tmp_path}", "eval.num_tasks=64")
    assert evaluate_once(other, folders, out)[1] == "evaluated"  # another config
    assert evaluate_once(cfg, folders, out)[1] == "evaluated"  # back to the first: the record held the second
    st = (folders["ablation_s0"] / "config.json").stat()
    os.utime(folders["ablation_s0"] / "config.json", (st.st_atime, st.st_mtime + 10))  # that run exported again
    assert evaluate_once(cfg, folders, out)[1] == "evaluated"
    assert evaluate_once(with_overwrite(cfg), folders, out)[1] == "evaluated" and len(calls) == 5
    assert calls[0] == {label: str(f) for label, f in folders.items()}


def test_a_study_killed_in_its_evaluation_keeps_the_checkpoints_it_finished(tmp_path, monkeypatch) -> None:
    """evaluate_in_turn: one checkpoint at a time, each call keeping those before it, so the same command goes on from
    the checkpoint the evaluation was killed in (a fake run_eval that honours ``done``; the real one runs in the tiny
    study below)."""
    cfg = compose_config("+exp=study", f"run_dir={tmp_path}")
    folders = {}
    for label in ("warm_start", "ablation_s0", "mempo_s0"):
        folders[label] = tmp_path / label / "hf"
        folders[label].mkdir(parents=True)
        (folders[label] / "config.json").write_text("{}")
    calls, kill_at = [], ["mempo_s0"]

    def fake_run_eval(c, *, out, done=None, agents=None):
        held = {r["checkpoint"] for r in done.rows} if done else set()
        rows = [r for r in (done.rows if done else []) if r["checkpoint"] in c.eval.checkpoints]
        for label in c.eval.checkpoints:
            if label not in held:
                if label in kill_at:
                    raise KeyboardInterrupt(f"killed while evaluating {label}")
                calls.append(label)
                rows.append({"checkpoint": label, "agent": "memory", "objectives": 2, "em": 1.0})
        out.mkdir(parents=True, exist_ok=True)
        records = [{"checkpoint": r["checkpoint"], "agent": "memory", "objectives": 2, "task_id": "t0"} for r in rows]
        (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        return {"rows": rows, "out": str(out), "files": {"results": str(out / "results.jsonl")}}

    monkeypatch.setattr(study_stage, "run_eval", fake_run_eval)
    out = tmp_path / "eval"
    with pytest.raises(KeyboardInterrupt):
        evaluate_in_turn(cfg, folders, out)
    assert calls == ["warm_start", "ablation_s0"]
    kill_at.clear()
    ev, status = evaluate_in_turn(cfg, folders, out)  # the same command again: only the one it was killed in
    assert calls == ["warm_start", "ablation_s0", "mempo_s0"] and status == "evaluated; kept warm_start, ablation_s0"
    assert [r["checkpoint"] for r in ev["rows"]] == ["warm_start", "ablation_s0", "mempo_s0"]
    assert evaluate_in_turn(cfg, folders, out)[1] == "reused" and len(calls) == 3
    assert evaluate_in_turn(with_overwrite(cfg), folders, out)[1] == "evaluated"
    assert calls[3:] == ["warm_start", "ablation_s0", "mempo_s0"]  # overwrite=true: every one again, in turn


def with_overwrite(cfg):
    from mempo.stages import with_overrides

    return with_overrides(cfg, {"overwrite": True})


@pytest.fixture(scope="module")
def tiny_study(tiny_path, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("study")
    summary = run_stage(compose_config("+exp=study", "+debug=default", "trainer.max_steps=1", f"run_dir={run_dir}",
                                       "study.also_reference=[mempo]"))  # fmt: skip
    return run_dir, summary


def test_a_tiny_study_writes_study_json(tiny_study) -> None:
    run_dir, summary = tiny_study
    got = json.loads((run_dir / "study.json").read_text())
    assert got["design"]["seeds"] == [0, 1] and got["design"]["steps"] == 1 and got["reference"] == "ablation"
    assert list(got["arms"]) == ["ablation", "mempo"] and got["objectives"] == [1, 2]
    for arm in ("ablation", "mempo"):
        assert got["arms"][arm]["seeds"] == [0, 1]
        for n in ("1", "2"):
            for m in ("em", "f1"):
                by = got["arms"][arm]["by_n"][n][m]
                assert len(by["per_seed"]) == 2 and by["mean"] == pytest.approx(sum(by["per_seed"]) / 2)
        for seed in (0, 1):  # each arm-seed its own run folder, trained by its own process
            assert (run_dir / arm / f"seed{seed}" / "hf" / "config.json").is_file()
            assert (run_dir / arm / f"seed{seed}" / "study_run.yaml").is_file()
    assert set(got["warm_start"]["by_n"]) == {"1", "2"}
    pairs = [(c["arm"], c["against"], c["N"]) for c in got["comparisons"]]
    assert pairs == [
        ("mempo", "ablation", 1),
        ("mempo", "ablation", 2),
        ("ablation", "mempo", 1),
        ("ablation", "mempo", 2),
    ] + [(a, "warm_start", n) for a in ("ablation", "mempo") for n in (1, 2)]
    by_pair = {(c["arm"], c["against"], c["N"]): c for c in got["comparisons"]}
    for n in (1, 2):  # study.also_reference=[mempo]: ablation - mempo, the mirror image of mempo - ablation
        for m in ("em", "f1"):
            there, back = by_pair[("mempo", "ablation", n)][m], by_pair[("ablation", "mempo", n)][m]
            assert back["per_seed"] == pytest.approx([-x for x in there["per_seed"]])
    for c in got["comparisons"]:
        for m in ("em", "f1"):
            r = c[m]
            assert r["seeds"] == [0, 1] and r["tasks"] == [2, 2] and len(r["per_seed"]) == 2
            assert r["mean"] == pytest.approx(sum(r["per_seed"]) / 2)
            lo, hi = r["interval"]
            assert lo <= r["mean"] <= hi and len(r["crossed_bootstrap"]) == 2 and r["df"] >= 1
            assert r["verdict"] in ("above 0", "below 0", "includes 0")
    assert "| mempo - ablation | 1 | EM |" in (run_dir / "study.md").read_text()
    # per arm and N the horizon rows: the seed means' mean, and PT averaged here from the evaluation's own records
    records = [json.loads(line) for line in (run_dir / "eval" / "results.jsonl").read_text().splitlines()]
    horizon = {(r["arm"], r["objectives"]): r for r in got["horizon"]["rows"]}
    assert set(horizon) == {(a, n) for a in ("warm_start", "ablation", "mempo") for n in (1, 2)}
    for arm in ("ablation", "mempo"):
        for n in (1, 2):
            row = horizon[(arm, n)]
            assert row["em"] == pytest.approx(got["arms"][arm]["by_n"][str(n)]["em"]["mean"])
            assert row["em_lo"] <= row["em"] <= row["em_hi"] and row["seeds"] == 2 and row["tasks"] == 2
            pts = [r["pt"] for r in records if r["checkpoint"] in (f"{arm}_s0", f"{arm}_s1") and r["objectives"] == n
                   and r["agent"] == "memory"]  # fmt: skip
            assert row["pt"] == pytest.approx(sum(pts) / len(pts))
    assert [(r["arm"], r["against"]) for r in got["horizon"]["token_ratios"]] == [("mempo", "ablation")] * 2
    assert (run_dir / "horizon.png").stat().st_size > 10_000 and summary["files"]["horizon_png"]
    assert set(got["behaviour"]) == {"warm_start", "ablation", "mempo"}
    assert len(got["behaviour"]["mempo"]["2"]["turns_per_seed"]) == 2 and "verdicts" in got["behaviour"]["mempo"]["2"]
    assert summary["status"] == {"warm_start": "trained"} | {
        f"{a}_s{s}": "trained" for a in got["arms"] for s in (0, 1)
    } | {"eval": "evaluated"}
    # the fixed scorer's scores: one per well-formed memory of the evaluation's memory agent, counted here
    memories = sum(1 for r in records if r["agent"] == "memory" for t in r["trace"] if t["ok"] and t["memory"])
    scores = got["memory_scores"]
    assert scores["memories"] == memories and scores["scorer"] == str(run_dir / "warm_start" / "hf")
    assert set(scores["arms"]) == {"ablation", "mempo"} and scores["warm_start"]["checkpoint"] == "warm_start"
    csv_rows = (run_dir / "memory_scores.csv").read_text().splitlines()
    assert len(csv_rows) == 1 + memories and (run_dir / "memory_scores.png").is_file()
    assert "Memories scored by P(gold | question, memory) under the warm start" in (run_dir / "study.md").read_text()


def test_the_tiny_study_commits_its_per_task_results(tiny_study) -> None:
    """per_task.csv: one row per checkpoint (the warm start, 2 arms x 2 seeds) x N (1, 2) x task (2), and every
    comparison of study.json recomputes from it (``python -m mempo.eval.report --per-task``)."""
    import csv

    from mempo.eval.report import per_task_report

    run_dir, _ = tiny_study
    with (run_dir / "per_task.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 5 * 2 * 2 and list(rows[0]) == ["arm", "seed", "N", "task", "em", "f1", "memory_score"]
    assert {(r["arm"], r["seed"]) for r in rows} == {("warm_start", "")} | {
        (a, s) for a in ("ablation", "mempo") for s in ("0", "1")
    }
    got = json.loads((run_dir / "study.json").read_text())
    # a memory score on every (checkpoint, N, task) whose memory agent wrote a scored memory, counted here
    records = [json.loads(line) for line in (run_dir / "eval" / "results.jsonl").read_text().splitlines()]
    written = {(r["checkpoint"], r["objectives"], r["task_id"]) for r in records
               if r["agent"] == "memory" and any(t["ok"] and t["memory"] for t in r["trace"])}  # fmt: skip
    scores_csv = run_dir / "memory_scores.csv" if written else None  # per memory: the turn-matched rows recomputed
    # the study's own reference and also_reference, read from its study.json beside the CSV
    per_task_report(run_dir / "per_task.csv", json_path=run_dir / "recomputed.json", memory_scores=scores_csv)
    again = json.loads((run_dir / "recomputed.json").read_text())
    for was, now in zip(got["comparisons"], again["study"]["comparisons"], strict=True):
        for m in ("em", "f1"):
            assert (now[m]["per_seed"], now[m]["interval"], now[m]["verdict"]) == (
                was[m]["per_seed"], was[m]["interval"], was[m]["verdict"])  # fmt: skip
    assert sum(r["memory_score"] != "" for r in rows) == len(written)
    if not written:  # the tiny model may write none: nothing to recompute
        assert again["memory_scores"] is None
        return
    for was, now in zip(got["memory_scores"]["comparisons"], again["memory_scores"]["comparisons"], strict=True):
        for m in ("p_gold", "p_gold_turn"):  # the turn-matched rows from memory_scores.csv
            assert now[m]["verdict"] == was[m]["verdict"]
            assert now[m].get("interval") == was[m].get("interval")


def test_a_rerun_with_another_arm_delta_refuses_the_finished_runs(tiny_study) -> None:
    """The same study run again into its folder with the MemPO arm's lr changed: the ablation's runs are reused
    (their config is unchanged), MemPO's first is refused before anything trains or evaluates, naming the key."""
    run_dir, _ = tiny_study
    before = (run_dir / "study.json").stat().st_mtime
    cfg = compose_config("+exp=study", "+debug=default", "trainer.max_steps=1", f"run_dir={run_dir}",
                         "+study.arms.mempo.optim.lr=3e-5")  # fmt: skip
    with pytest.raises(ValueError, match=r"mempo seed 0: .*mempo/seed0 holds a run trained with another config.*"
                       r"optim\.lr \(1e-05 -> 3e-05\)"):  # fmt: skip
        run_stage(cfg)
    assert (run_dir / "study.json").stat().st_mtime == before


def test_an_arm_dropped_then_added_back_is_the_only_one_evaluated_again(tiny_study, monkeypatch) -> None:
    """The finished tiny study run again without its MemPO arm evaluates nothing (the warm start's and the ablation's
    results are kept from the earlier evaluation), then with it again evaluates only MemPO's two seeds; the final
    results equal the first evaluation's, record for record (greedy, the same tiny checkpoints)."""
    from evaluations import record_evaluated

    run_dir, _ = tiny_study
    first = (run_dir / "eval" / "results.jsonl").read_text().splitlines()
    evaluated = record_evaluated(monkeypatch)
    base = ("+exp=study", "+debug=default", "trainer.max_steps=1", f"run_dir={run_dir}")
    dropped = run_stage(compose_config(*base, "study.arms.mempo=null"))
    assert evaluated == [] and dropped["status"]["eval"] == "evaluated; kept warm_start, ablation_s0, ablation_s1"
    kept = [r for r in first if json.loads(r)["checkpoint"] in ("warm_start", "ablation_s0", "ablation_s1")]
    assert (run_dir / "eval" / "results.jsonl").read_text().splitlines() == kept
    again = run_stage(compose_config(*base))
    assert evaluated == ["mempo_s0", "mempo_s1"]
    assert again["status"]["eval"] == "evaluated; kept warm_start, ablation_s0, ablation_s1"
    assert (run_dir / "eval" / "results.jsonl").read_text().splitlines() == first


def test_a_killed_run_is_not_continued_under_another_config(tmp_path, monkeypatch) -> None:
    """An arm-seed killed at its checkpoint, the study run again with data.world_seed changed: before, its remaining
    steps trained on the other world, its study_run.yaml was overwritten, and the finished run then passed the reuse
    check as "the same config". Now refused before anything launches, naming the key and the ways out."""
    cfg = compose_config("+exp=study", f"run_dir={tmp_path}")
    sub = arm_seed_configs(cfg)[("mempo", 1)]
    study_stage.write_run_config(sub)  # what launch wrote before the process was killed
    (Path(sub.run_dir) / "checkpoints").mkdir()
    (Path(sub.run_dir) / "checkpoints" / "last.ckpt").write_text("{}")
    launched = []

    def fake_launch(c) -> None:  # the process would train the remaining steps and export its policy
        launched.append(c.data.world_seed)
        (Path(sub.run_dir) / "hf").mkdir(exist_ok=True)
        (Path(sub.run_dir) / "hf" / "config.json").write_text("{}")

    monkeypatch.setattr(study_stage, "launch", fake_launch)
    changed = compose_config("+exp=study", f"run_dir={tmp_path}", "data.world_seed=7")
    with pytest.raises(ValueError, match=r"mempo seed 1: .*mempo/seed1 holds a run trained with another config.*"
                       r"data\.world_seed \(0 -> 7\).*overwrite=true.*accept_changes"):  # fmt: skip
        run_arm_seed(changed, arm_seed_configs(changed)[("mempo", 1)], "mempo seed 1")
    assert launched == []
    assert run_arm_seed(cfg, sub, "mempo seed 1") == "resumed" and launched == [0]  # the same config continues


def test_a_warm_start_retrained_in_place_refuses_the_arms_trained_from_it(tiny_study) -> None:
    """Last in this module (it changes the tiny study's warm start). Before: the arms were reused "with the same
    config", and "arm - warm_start" compared them with weights they did not start from."""
    from weights import retrain_in_place

    run_dir, _ = tiny_study
    retrain_in_place(run_dir / "warm_start" / "hf")
    cfg = compose_config("+exp=study", "+debug=default", "trainer.max_steps=1", f"run_dir={run_dir}")
    with pytest.raises(ValueError, match=r"ablation seed 0: .* provenance\.model \(hf:[0-9a-f]{16} -> "):
        run_arm_seed(cfg, arm_seed_configs(cfg)[("ablation", 0)], "ablation seed 0")


def test_a_study_with_a_react_arm_trains_its_own_warm_start_and_evaluates_it_as_a_full_history_agent(
    tiny_path, tmp_path
) -> None:
    """GRPO on the memory agent (ablation) against GRPO on a full-history (ReAct) agent, 2 seeds, 1 step each, tiny
    model: the ReAct arm starts from a warm start trained on the full-history prompts, is evaluated as a full-history
    agent only, and meets that warm start; per_task.csv recomputes the same comparisons."""
    from mempo.eval.report import per_task_report

    cfg = compose_config("+exp=study", "+debug=default", "trainer.max_steps=1", f"run_dir={tmp_path}",
                         "study.arms.mempo=null", "+study.arms.react.agent.context=full_history",
                         "+study.arms.react.advantage.estimator=grpo", "study.memory_scores=false")  # fmt: skip
    summary = run_stage(cfg)
    got = json.loads((tmp_path / "study.json").read_text())
    assert got["design"]["arm_agents"] == {"ablation": "memory", "react": "full_history"}
    assert got["design"]["arm_warm_starts"] == {"react": "react_warm_start"}
    assert summary["status"]["react_warm_start"] == "trained"
    run_cfg = yaml.safe_load((tmp_path / "react" / "seed0" / "study_run.yaml").read_text())
    assert run_cfg["model"]["name_or_path"] == str(tmp_path / "react_warm_start" / "hf")
    assert run_cfg["agent"]["context"] == "full_history"
    warm_cfg = yaml.safe_load((tmp_path / "react_warm_start" / "config.yaml").read_text())
    assert warm_cfg["agent"]["context"] == "full_history"
    records = [json.loads(line) for line in (tmp_path / "eval" / "results.jsonl").read_text().splitlines()]
    agents = {(r["checkpoint"], r["agent"]) for r in records}
    memory, react = "memory", "full_history"
    assert agents == {("warm_start", memory), ("react_warm_start", react), ("ablation_s0", memory),
                      ("ablation_s1", memory), ("react_s0", react), ("react_s1", react)}  # fmt: skip
    pairs = {(c["arm"], c["against"]) for c in got["comparisons"]}
    assert pairs == {("react", "ablation"), ("ablation", "warm_start"), ("react", "react_warm_start")}
    recomputed = tmp_path / "recomputed.json"
    per_task_report(tmp_path / "per_task.csv", json_path=recomputed)
    again = json.loads(recomputed.read_text())["study"]["comparisons"]
    assert [c["em"]["per_seed"] for c in again] == [c["em"]["per_seed"] for c in got["comparisons"]]
