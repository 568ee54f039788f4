"""``trainer=fsdp`` (FSDP2 through Lightning's ModelParallelStrategy) on two CPU processes (gloo), the tiny model.

Each fit runs tests/support/fsdp_probe.py in a subprocess (Lightning starts rank 1 by re-running it), which saves, per
rank, the full step-1 gradients and the full weights after each step. Both strategies use seed 3, the same config and
the same rollouts from the same weights; they differ only in how gradients are reduced. The DDP run takes 2 steps. The
FSDP run takes step 1 with the sharded policy generating in lock step, stops, and resumes for step 2 through a
separate engine (its own unsharded copy of the starting weights), so step 2 equals DDP's only if the checkpoint was
restored (weights, AdamW state, RNG, data position) and the gathered weights were streamed into the engine before its
rollout. Rank 0 updates in micro-batches of 1 and rank 1 of 4, so FSDP's rank 1 pads its calls (without that padding
the first step hangs: seen with the padding removed, then restored).
"""

from __future__ import annotations

import csv
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from parallel_probe import run_fsdp_probe as _probe

ROOT = Path(__file__).resolve().parents[3]
LR = 1e-3  # the probes' optim.lr


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, list[dict]]]:
    base = tmp_path_factory.mktemp("fsdp")
    ddp = _probe(base / "ddp", "ddp")
    first = _probe(base / "fsdp", "fsdp", "hf", "trainer.max_steps=1")
    resumed = _probe(base / "fsdp", "fsdp", "separate", "trainer.max_steps=2", "resume=true")
    return {"ddp": (base / "ddp", ddp), "fsdp_first": (base / "fsdp", first), "fsdp": (base / "fsdp", resumed)}


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert set(a) == set(b)
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.slow
def test_ddp_ranks_draw_their_own_tasks_and_keep_identical_weights(runs) -> None:
    ranks = runs["ddp"][1]
    assert list(ranks[0]["weights"]) == list(ranks[1]["weights"]) == [1, 2]
    for step, step_tasks in ranks[0]["tasks"].items():
        assert not set(step_tasks[0]) & set(step_tasks[1])  # each rank its own share of the data
        for name, want in ranks[0]["weights"][step].items():  # gradients synchronized: the same update on both
            torch.testing.assert_close(ranks[1]["weights"][step][name], want, rtol=0, atol=0, msg=name)
    assert _max_diff(ranks[0]["weights"][2], ranks[0]["weights"][1]) > LR / 2  # and the updates were not empty


@pytest.mark.slow
def test_fsdp_step1_gradients_equal_ddp_and_resumed_step2_agrees(runs) -> None:
    ddp, first, resumed = runs["ddp"][1][0], runs["fsdp_first"][1][0], runs["fsdp"][1][0]
    assert (list(first["weights"]), list(resumed["weights"])) == ([1], [2])
    assert {**first["tasks"], **resumed["tasks"]} == ddp["tasks"]  # the same data on the same ranks, across the resume
    assert set(first["grads"]) == set(ddp["grads"])
    for name in ddp["grads"]:  # fp32 both; a reduce-scatter against an all-reduce of the same two gradients
        torch.testing.assert_close(first["grads"][name], ddp["grads"][name], msg=name)
    assert sum(float(g.abs().sum()) for g in ddp["grads"].values()) > 0  # the signed estimator gives gradient
    # AdamW normalizes each element by its own gradient scale, so a summation-order difference of 1e-7 on an element
    # whose gradient is itself tiny can move it by a visible fraction of lr; 0.1 * lr bounds that over two steps
    # (measured without the resume: 3.4e-6 after step 1, 1.6e-5 after step 2), while a real difference in the update
    # (rollouts from unpushed weights, AdamW moments or RNG not restored) is of order lr.
    assert _max_diff(first["weights"][1], ddp["weights"][1]) < 0.1 * LR
    assert _max_diff(resumed["weights"][2], ddp["weights"][2]) < 0.1 * LR
    assert _max_diff(resumed["weights"][2], first["weights"][1]) > LR / 2  # and the updates were not empty


@pytest.mark.slow
def test_fsdp_writes_a_sharded_checkpoint_and_a_full_hf_folder(runs) -> None:
    run_dir, ranks = runs["fsdp"]
    last = run_dir / "checkpoints" / "last.ckpt"
    assert last.is_symlink() and last.resolve().name == "step-000002"
    assert sorted(p.name for p in last.resolve().glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    assert [p.name for p in (run_dir / "checkpoints").glob("step-*")] == ["step-000002"]  # step 1's was dropped
    from mempo.lm.loading import load_policy

    policy, _ = load_policy(str(run_dir / "hf"), dtype="float32")
    state = policy.state_dict()
    for name, want in ranks[0]["weights"][2].items():
        torch.testing.assert_close(state[name], want, rtol=0, atol=0, msg=name)  # the gathered weights, exactly
    rows = list(csv.DictReader((run_dir / "metrics.csv").open()))
    assert [int(r["step"]) for r in rows] == [1, 2]  # step 1's row kept across the resume
    # The canary ran on every rank; at step 2 the engine has its own weights, so its log-probs are the trainer's only
    # after the restored weights and then each step's gathered policy were streamed into it.
    assert [float(r["train/canary_logp_diff"]) for r in rows] == [0.0, 0.0]


@pytest.mark.slow
def test_ranks_with_unequal_work_finish_instead_of_hanging(tiny_path: Path, tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    cmd = [sys.executable, str(ROOT / "tests" / "support" / "lockstep_probe.py"), str(tiny_path), str(tmp_path)]
    procs = [
        subprocess.Popen(cmd, env={**env, "RANK": str(r)}, cwd=ROOT, stderr=subprocess.PIPE, start_new_session=True)
        for r in (0, 1)
    ]
    try:
        errors = [p.communicate(timeout=300)[1].decode()[-2000:] for p in procs]  # a hang times out here
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], errors
    assert [(tmp_path / f"rank{r}.txt").read_text() for r in (0, 1)] == ["ok\n", "ok\n"]


@pytest.mark.parametrize("strategy", ["fsdp", "deepspeed_stage_2"])
def test_lightning_fsdp1_and_deepspeed_are_refused_naming_the_key(strategy: str) -> None:
    from mempo.stages.config import compose_config

    with pytest.raises(ValueError, match=r"trainer\.strategy.*fsdp2"):
        compose_config(f"trainer.strategy={strategy}")


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_one_vllm_engine_per_rank_under_the_external_launcher(strategy: str, tmp_path: Path) -> None:
    """``sampler=vllm`` on two CPU processes: each rank builds its own float32 vLLM-CPU engine under vLLM's external
    launcher (the executor the CUDA path needs for one engine per GPU), started with its own RANK and LOCAL_RANK, which
    the process's environment holds only while the engine is built; one
    step, whose pushed weights the canary finds in both engines and whose ratios say the engines' log-probs were the
    trainer's."""
    ranks = _probe(tmp_path, strategy, "vllm", "trainer.max_steps=1")
    for r, record in enumerate(ranks):
        engine = {k: record["engine"][k] for k in ("backend", "world", "RANK", "LOCAL_RANK")}
        assert engine == {"backend": "external_launcher", "world": 1, "RANK": str(r), "LOCAL_RANK": str(r)}
        # The launcher's RANK and LOCAL_RANK were set only while the engine was built (Lightning re-reads LOCAL_RANK).
        assert record["engine"]["env_after"] == record["engine"]["env_before"]
        assert record["engine"]["env_before"]["LOCAL_RANK"] == str(r)
    shares = ranks[0]["tasks"][1]
    assert len(shares) == 2 and not set(shares[0]) & set(shares[1])  # data.batch_size=4: 2 tasks per rank
    (row,) = csv.DictReader((tmp_path / "metrics.csv").open())
    assert float(row["train/canary_logp_diff"]) < 1e-3  # sampler.canary_tol's fp32 default
    assert abs(float(row["train/ratio_mean"]) - 1) < 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_rank_whose_rows_all_lack_signal_still_joins_the_update(strategy: str, tmp_path: Path) -> None:
    """``optim.skip_zero_adv_rows``: rank 1's advantages are all 0 (every group's rewards equal), so it computes no
    row of the update; it still takes part in the gradient reduction (a zero-weighted backward), so neither rank
    hangs and both hold the same, moved weights (rank 0's gradient, averaged with rank 1's zeros). With dynamic
    sampling on, rank 1 lacks both groups and rank 0 none: both run the one redraw round (under FSDP the sharded
    policy generates and updates in lock step, so a rank that skipped the round would hang the other; under DDP
    the ranks would record different rounds), and rank 1, still without signal, trains on its own tasks."""
    ranks = _probe(
        tmp_path, strategy, "hf", "advantage.estimator=probe_rank0_only", "trainer.max_steps=2",
        "data.dynamic_sampling=true", "data.redraw_rounds=1",
    )  # fmt: skip
    assert [r["redraws"][2] for r in ranks] == [1.0, 1.0]
    assert [r["rows"][2] for r in ranks][1] == 0.0 < ranks[0]["rows"][2]
    for name, want in ranks[0]["weights"][2].items():
        torch.testing.assert_close(ranks[1]["weights"][2][name], want, rtol=0, atol=0, msg=name)
    assert _max_diff(ranks[0]["weights"][2], ranks[0]["weights"][1]) > LR / 2
