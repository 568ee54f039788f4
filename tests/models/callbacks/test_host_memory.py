"""The ``host`` settings: the free pages glibc's malloc arenas hold go back to the kernel after RL steps
(``HostMemory``, ``host.release_every``), large blocks are their own mappings from the RL stage's start
(``host.mmap_threshold_mb``), and a run whose memory grows gets one console warning (``host.rss_warn_growth``).

The bug it guards against (docs/performance.md, "Long runs"): an RL run's RSS grew 0.2-0.35 GB a step, almost all of
it freed memory that the arenas kept (each step's tensors have new shapes, so freed blocks were not reused and the
heap could not shrink past the live blocks above them). The fragmentation below is built the same way, by hand: a
freed 16 MiB block raises glibc's mmap threshold, so later 4 MiB tensors come from the heap, each followed by a small
live tensor that pins the heap above it; freeing the large ones leaves their pages resident and unused.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from mempo.models.callbacks import HostMemory
from mempo.stages.config import LONG_RUN_STEPS, HostConfig
from mempo.stages.train import fit_rl

pytestmark = pytest.mark.skipif(not Path("/proc/self/statm").is_file(), reason="needs Linux's /proc")

FRAGMENT = """
import sys
import torch
from types import SimpleNamespace
from mempo.core.hardware import resident_gb, set_mmap_threshold
from mempo.models.callbacks import HostMemory

if float(sys.argv[2]) > 0:
    set_mmap_threshold(float(sys.argv[2]))  # host.mmap_threshold_mb, as the RL stage sets it at its start
base = resident_gb()
big = torch.ones(16 * 2**20 // 4)
del big  # an mmapped block freed: glibc raises its mmap threshold to 16 MiB
kept, chunks = [], []
for i in range(64):
    chunks.append(torch.ones((4 * 2**20 + 4096 * i) // 4))  # 4 MiB and up, from the heap, every page written
    kept.append(torch.ones(16384))  # a live 64 KiB block after each one, from the heap's top
del chunks
held = resident_gb() - base
guard = HostMemory(release_every=int(sys.argv[1]), warn_growth=0)
module = SimpleNamespace(batches_done=1, last_metrics={}, log=lambda *a, **k: None)
guard.on_train_batch_end(SimpleNamespace(global_step=1, world_size=1, global_rank=0), module, None, None, 0)
print(held, resident_gb() - base)
"""


def fragmented(release_every: int, mmap_threshold_mb: float = 0) -> tuple[float, float]:
    """(GB resident above the start after the freed tensors, GB resident after one RL step's end) in a fresh
    interpreter (the test process's arenas hold whatever earlier tests left)."""
    argv = [sys.executable, "-c", FRAGMENT, str(release_every), str(mmap_threshold_mb)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True)
    held, after = map(float, out.stdout.split()[-2:])
    return held, after


def test_a_step_end_hands_back_the_pages_the_arenas_hold_free() -> None:
    held, kept = fragmented(release_every=0)
    assert held > 0.2 and kept > 0.2  # the control: 256 MiB freed but resident, and nothing hands it back
    held, after = fragmented(release_every=1)
    assert held > 0.2
    assert after < 0.05, f"{after:.3f} GB still resident after the step's release ({held:.3f} GB before)"


def test_a_fixed_mmap_threshold_leaves_nothing_to_fragment() -> None:
    held, after = fragmented(release_every=0, mmap_threshold_mb=1)
    # the 4 MiB tensors were their own mappings, unmapped when freed: nothing held, with no release at all
    assert held < 0.05 and after < 0.05, (held, after)


def step(guard: HostMemory, k: int, rss: float, monkeypatch: pytest.MonkeyPatch) -> dict[str, float]:
    """RL step ``k`` ends with ``rss`` GB resident -> the module's last_metrics."""
    monkeypatch.setattr("mempo.models.callbacks.resident_gb", lambda: rss)
    logged: dict[str, float] = {}
    module = SimpleNamespace(batches_done=k, last_metrics={}, log=lambda key, v, **_: logged.update({key: v}))
    trainer = SimpleNamespace(global_step=k, world_size=1, global_rank=0)
    guard.on_train_batch_end(trainer, module, None, None, k - 1)
    assert logged == module.last_metrics == {"perf/rss_kept_gb": rss}
    return module.last_metrics


def test_growth_past_the_share_warns_once_naming_the_slope_and_the_docs(
    capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    guard = HostMemory(release_every=0, warn_growth=0.5)
    # RL steps 11.. of a resumed run: the base is this process's second step (12: 4.0 GB), not RL step 2
    for k, rss in [(11, 5.0), (12, 4.0), (13, 5.0), (14, 5.9), (15, 6.2), (16, 7.0), (17, 9.0)]:
        step(guard, k, rss, monkeypatch)
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "warning" in ln]
    assert len(lines) == 1, lines
    # 6.2 GB at step 15 is the first reading above 4.0 x 1.5: (6.2 - 4.0) / 3 steps = +0.733 GB a step
    assert "4.00 GB at RL step 12 to 6.20 GB at step 15 (+0.733 GB a step" in lines[0]
    assert "docs/performance.md#long-runs" in lines[0]


def test_no_warning_while_memory_stays_within_the_share(
    capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    guard = HostMemory(release_every=0, warn_growth=0.5)
    for k, rss in enumerate([5.0, 4.0, 5.9, 6.0, 5.5], start=1):
        step(guard, k, rss, monkeypatch)
    off = HostMemory(release_every=0, warn_growth=0)
    for k, rss in enumerate([1.0, 1.0, 9.0], start=1):
        step(off, k, rss, monkeypatch)
    assert "warning" not in capsys.readouterr().out


RUN = [
    "model=tiny", "data.batch_size=2", "data.group_size=2", "agent.max_turns=2", "sampler.max_new_tokens=12",
    "sampler=hf", "trainer.precision=32-true", "ckpt.every_n_steps=5", "eval.every_n_steps=0", "trainer.max_steps=3",
]  # fmt: skip


@pytest.mark.parametrize(("release_every", "calls"), [(1, 3), (2, 1), (0, 0)])
def test_the_rl_stage_releases_after_the_configured_steps(
    make_cfg, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, release_every: int, calls: int
) -> None:
    released: list[int] = []
    monkeypatch.setattr("mempo.models.callbacks.release_free_memory", lambda: released.append(1) or True)
    fit_rl(make_cfg(*RUN, f"host.release_every={release_every}", f"run_dir={tmp_path / 'rl'}"))
    assert len(released) == calls


@pytest.mark.parametrize(("value", "calls"), [("1", [1.0]), ("4.5", [4.5]), ("null", []), ("auto", [])])
def test_the_rl_stage_sets_the_mmap_threshold_at_its_start(
    make_cfg, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str, calls: list[float]
) -> None:
    seen: list[float] = []
    monkeypatch.setattr("mempo.stages.train.set_mmap_threshold", lambda mib: seen.append(mib) or True)
    fit_rl(make_cfg(*RUN, "trainer.max_steps=1", f"host.mmap_threshold_mb={value}", f"run_dir={tmp_path / 'rl'}"))
    assert seen == calls


def test_auto_fixes_the_threshold_for_long_runs_only() -> None:
    assert HostConfig().mmap_threshold_mb is None  # off by default: the capped oneDNN caches keep the RSS flat
    host = HostConfig(mmap_threshold_mb="auto")
    assert [host.threshold_mb(n) for n in (1, LONG_RUN_STEPS - 1, LONG_RUN_STEPS, 160)] == [None, None, 1.0, 1.0]
    assert HostConfig(mmap_threshold_mb=None).threshold_mb(160) is None
    with pytest.raises(ValueError, match="host.mmap_threshold_mb"):
        HostConfig(mmap_threshold_mb=64)


def test_host_values_are_checked() -> None:
    with pytest.raises(ValueError, match="host.release_every"):
        HostMemory(release_every=-1)
    trainer = SimpleNamespace(global_step=1, world_size=1, global_rank=0)
    HostMemory().on_train_batch_end(trainer, SimpleNamespace(), None, None, 0)  # a module without last_metrics
