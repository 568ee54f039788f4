"""The GPU smoke suite runs on a machine that has only what it imports (scripts/gpu_smoke.sh): torch, transformers,
lightning, hydra-core, omegaconf, bm25s, gguf, peft and pytest, with what they require, and no vLLM, wandb,
matplotlib, pyarrow, numba or scipy.

A fresh interpreter without site-packages (``python -S``) gets a folder of links to exactly those distributions' files
(their required dependencies followed through the installed metadata, extras left out), so every other installed
package is absent as it is on such a machine (``find_spec`` answers None, which libraries probe). In it the GPU suite
collects, and the HF-sampler path its CUDA tests take runs on the CPU: a 1-step fit of the tiny model with a KL term
and the device probe, then the modules the tests import inside their bodies.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
GPU_MACHINE = ("torch", "transformers", "lightning", "hydra-core", "omegaconf", "bm25s", "gguf", "peft", "pytest")
ABSENT = ("vllm", "wandb", "matplotlib", "pyarrow", "numba", "scipy", "pandas", "datasets")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(roots: tuple[str, ...]) -> set[str]:
    """The installed distributions ``roots`` need: their requirements without extras, followed transitively."""
    seen: set[str] = set()
    todo = [_norm(r) for r in roots]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue  # an optional platform package (e.g. a CUDA wheel) this machine does not have
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(_norm(req.name))
    return seen


def link_site(folder: Path, dists: set[str]) -> None:
    """Links in ``folder`` to every top-level file and package of ``dists`` (from their RECORDs)."""
    folder.mkdir()
    for name in sorted(dists):
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        for top in {f.parts[0] for f in dist.files or [] if f.parts[0] not in ("..", "__pycache__")}:
            src, dst = Path(dist.locate_file(top)), folder / top
            if src.exists() and not dst.exists() and not top.endswith((".data", ".pth")):
                dst.symlink_to(src)


FIT = """
import json, os, sys, tempfile
sys.path.insert(0, "tests/support")
from device_probe import DeviceProbe
from mempo.losses import register_advantage
from mempo.stages.config import compose_config
from mempo.stages.train import fit_rl


@register_advantage("test_signed", needs_memory_scores=True)  # conftest's, which a script does not load
def _signed(x, memory, advantage):
    return (1.0 - 2.0 * (x.traj_ids % 2).float())[:, None] * x.response_mask.float()


run = tempfile.mkdtemp()
cfg = compose_config(
    "model=tiny", f"model.name_or_path={os.environ['MEMPO_TINY']}", "sampler=hf", "trainer.precision=32-true",
    "optim.old_logp=recompute", "loss.tis_cap=2.0", "loss.kl_coef=1e-3", "advantage.estimator=test_signed",
    "data.batch_size=1", "data.group_size=2", "agent.max_turns=1", "sampler.max_new_tokens=4",
    "trainer.max_steps=1", "ckpt.every_n_steps=1", f"run_dir={run}",
)
probe = DeviceProbe()
_, summary = fit_rl(cfg, callbacks=[probe])
import mempo.capacity.gpu_memory, mempo.lm.logprobs, mempo.lm.scoring, mempo.lm.sharding, mempo.rollout.vllm_sampler
print(json.dumps({"steps": summary["steps"], "probe": probe.records, "curves": summary["curves"],
                  "hf": os.path.isfile(os.path.join(run, "hf", "model.safetensors")),
                  "loaded": sorted(m for m in sys.modules if "." not in m)}))
"""


def test_the_gpu_suite_needs_only_what_it_imports(tmp_path: Path, tiny_path: Path) -> None:
    site = tmp_path / "site"
    link_site(site, closure(GPU_MACHINE))
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "MEMPO_TINY": str(tiny_path)}
    env |= {"PYTHONPATH": f"{site}{os.pathsep}{ROOT}", "MEMPO_CACHE": str(tmp_path / "cache")}
    for module in ABSENT:  # this machine has them: the check below must not see them
        code = f"import importlib.util as u; print(u.find_spec({module!r}) is None)"
        out = subprocess.run([sys.executable, "-S", "-c", code], env=env, capture_output=True, text=True, cwd=ROOT)
        assert out.stdout.strip() == "True", (module, out.stdout, out.stderr)

    cmd = [sys.executable, "-S", "-m", "pytest", "--collect-only", "-q", "-o", "addopts=", "-p", "no:cacheprovider"]
    out = subprocess.run([*cmd, "-m", "gpu", "tests/test_gpu.py"], env=env, capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(r"^21 tests collected", out.stdout, re.M), out.stdout

    out = subprocess.run([sys.executable, "-S", "-c", FIT], env=env, capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "matplotlib is not installed: no curves.png" in out.stdout
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["steps"] == 1 and result["hf"] and result["curves"] is None
    assert result["probe"] == [{"step": 1, "param_devices": ["cpu"], "device": "cpu"}]
    assert not set(ABSENT) & set(result["loaded"])
