"""``trainer=fsdp`` (FSDP2 through Lightning's ModelParallelStrategy) on two CPU processes (gloo), the tiny model.

Each fit runs tests/fsdp_probe.py in a subprocess (Lightning starts rank 1 by re-running it), which saves the full
step-1 gradients and the full weights after each step. Both runs use seed 3, the same config and the HF sampler, so
DDP and FSDP sample the same rollouts from the same weights; they differ only in how gradients are reduced. Rank 0
updates in micro-batches of 1 and rank 1 of 4, so FSDP's rank 1 pads its calls (without that padding the first step
hangs: seen with the padding removed, then restored).
"""

from __future__ import annotations

import csv
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
LR = 1e-3  # the probes' optim.lr


def _probe(run_dir: Path, strategy: str, *args: str) -> dict:
    """Runs the probe; a hang (ranks out of step) fails after 300 s and kills both ranks (rank 1 is Lightning's
    child process: the whole process group goes)."""
    cmd = [sys.executable, str(ROOT / "tests" / "fsdp_probe.py"), str(run_dir), strategy, *args]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=300)  # a 2-step probe takes about 40 s here
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err.decode()[-3000:]
    return torch.load(run_dir / "probe.pt")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict]]:
    base = tmp_path_factory.mktemp("fsdp")
    return {name: (base / name, _probe(base / name, name)) for name in ("ddp", "fsdp")}


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert set(a) == set(b)
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.slow
def test_fsdp_step1_gradients_equal_ddp_and_weights_agree_after_two_steps(runs) -> None:
    ddp, fsdp = runs["ddp"][1], runs["fsdp"][1]
    assert fsdp["tasks"] == ddp["tasks"]  # the same data on the same ranks
    for step_tasks in fsdp["tasks"].values():
        assert not set(step_tasks[0]) & set(step_tasks[1])  # each rank its own share
    assert set(fsdp["grads"]) == set(ddp["grads"])
    for name in ddp["grads"]:  # fp32 both; a reduce-scatter against an all-reduce of the same two gradients
        torch.testing.assert_close(fsdp["grads"][name], ddp["grads"][name], msg=name)
    assert sum(float(g.abs().sum()) for g in ddp["grads"].values()) > 0  # the signed estimator gives gradient
    # AdamW normalizes each element by its own gradient scale, so a summation-order difference of 1e-7 on an element
    # whose gradient is itself tiny can move it by a visible fraction of lr; 0.1 * lr bounds that over two steps
    # (measured: 3.4e-6 after step 1, 1.6e-5 after step 2), while any real difference in the update is of order lr.
    for step in (1, 2):
        assert _max_diff(fsdp["weights"][step], ddp["weights"][step]) < 0.1 * LR
    assert _max_diff(fsdp["weights"][2], fsdp["weights"][1]) > LR / 2  # and the updates were not empty


@pytest.mark.slow
def test_fsdp_writes_a_sharded_checkpoint_and_a_full_hf_folder(runs) -> None:
    run_dir = runs["fsdp"][0]
    last = run_dir / "checkpoints" / "last.ckpt"
    assert last.is_symlink() and last.resolve().name == "step-000002"
    assert sorted(p.name for p in last.resolve().glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    assert [p.name for p in (run_dir / "checkpoints").glob("step-*")] == ["step-000002"]  # step 1's was dropped
    from mempo.lm.loading import load_policy

    policy, _ = load_policy(str(run_dir / "hf"), dtype="float32")
    state = policy.state_dict()
    for name, want in runs["fsdp"][1]["weights"][2].items():
        torch.testing.assert_close(state[name], want, rtol=0, atol=0, msg=name)  # the gathered weights, exactly
    rows = list(csv.DictReader((run_dir / "metrics.csv").open()))
    assert [int(r["step"]) for r in rows] == [1, 2]
    assert all(float(r["train/canary_logp_diff"]) == 0.0 for r in rows)  # the canary ran (on every rank)


@pytest.mark.slow
def test_fsdp_one_step_resume_one_step_equals_two_steps_through_a_separate_engine(runs, tmp_path: Path) -> None:
    """The weight push lands and resume is exact: the separate engine (its own unsharded copy of the starting
    weights) samples like the policy only if every streamed push landed, and the resumed run equals the
    uninterrupted shared-engine one only if the restored weights are pushed into it before step 2's rollout. FSDP2
    restores the checkpoint after ``on_fit_start``, so the push (and metrics.csv's trimming) waits for
    ``on_train_start``."""
    _probe(tmp_path, "fsdp", "separate", "trainer.max_steps=1")
    resumed = _probe(tmp_path, "fsdp", "separate", "trainer.max_steps=2", "resume=true")
    assert list(resumed["weights"]) == [2]
    assert resumed["tasks"][2] == runs["fsdp"][1]["tasks"][2]
    for name, want in runs["fsdp"][1]["weights"][2].items():
        torch.testing.assert_close(resumed["weights"][2][name], want, rtol=0, atol=0, msg=name)
    rows = list(csv.DictReader((tmp_path / "metrics.csv").open()))
    assert [int(r["step"]) for r in rows] == [1, 2]  # step 1's row kept across the resume
    # The engine has its own weights: after each streamed push of the gathered policy its log-probs are the trainer's.
    assert [float(r["train/canary_logp_diff"]) for r in rows] == [0.0, 0.0]


@pytest.mark.slow
def test_ranks_with_unequal_work_finish_instead_of_hanging(tiny_path: Path, tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    cmd = [sys.executable, str(ROOT / "tests" / "lockstep_probe.py"), str(tiny_path), str(tmp_path)]
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
