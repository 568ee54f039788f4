"""JAX stays off the GPU when mempo imports bm25s (mempo.core.jax_guard), without jax installed.

bm25s's import runs ``jax.lax.top_k`` whenever ``jax`` imports, which starts JAX's default backend: the GPU, where jax
has its CUDA plugin, and JAX then preallocates 75% of it. Here a stand-in ``jax`` package, first on the path of a fresh
interpreter, does what jax does with the environment: it reads ``JAX_PLATFORMS`` when imported, and at its first
computation starts the first platform named there, or, with none named, its default, the GPU. It writes the platform
it started (and ``XLA_PYTHON_CLIENT_PREALLOCATE``) to a log, which the tests read after importing mempo's real chain.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

STANDIN_INIT = '''"""A stand-in for jax: the environment as jax reads it, a log of the backend it starts."""
import json
import os

_PLATFORMS = os.environ.get("JAX_PLATFORMS", "")  # jax reads it into its config at import
_started = []


def _start_backend():
    if not _started:  # jax starts its backend once, at the first computation; "" -> its default, the GPU first
        names = [p.strip() for p in _PLATFORMS.split(",") if p.strip()] or ["cuda", "cpu"]
        _started.append(names[0])
        record = {"platform": names[0], "preallocate": os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "true")}
        with open(os.environ["JAX_STANDIN_LOG"], "a") as f:
            f.write(json.dumps(record) + "\\n")
    with open(os.environ["JAX_STANDIN_LOG"] + ".calls", "a") as f:
        f.write("call\\n")
    return _started[0]


def devices():
    return [_start_backend()]
'''
STANDIN_LAX = """import numpy as np

import jax


def top_k(operand, k):
    jax._start_backend()
    operand = np.asarray(operand)
    index = np.argsort(-operand, kind="stable")[:k]
    return operand[index], index
"""

# Import the chain, call the guard once more (still one warning at most), then retrieve: the retriever ranks with its
# own numpy top-k (mempo.rollout.retrievers.top_k_stable), so JAX sees only bm25s's import-time call.
CHILD = """
import json, sys
import {entry}
from mempo.core.jax_guard import keep_jax_off_gpu
from mempo.rollout.retrievers import BM25Retriever, Passage

keep_jax_off_gpu()
r = BM25Retriever([Passage("a", "A\\nalpha beta"), Passage("b", "B\\nbeta gamma"), Passage("c", "C\\ngamma delta")])
print(json.dumps([[p.id for p in ps] for ps in r.retrieve(["beta", "gamma delta"], 2)]))
"""


def run_child(tmp_path: Path, entry: str, env_extra: dict[str, str], pre: str = "") -> tuple[list[dict], int, str, str]:
    """A fresh interpreter with the stand-in jax first on its path and neither variable set unless ``env_extra`` sets
    it; returns the backends the stand-in started, its computations, stdout and stderr."""
    standin = tmp_path / "standin"
    (standin / "jax").mkdir(parents=True, exist_ok=True)
    (standin / "jax" / "__init__.py").write_text(STANDIN_INIT)
    (standin / "jax" / "lax.py").write_text(STANDIN_LAX)
    log = tmp_path / "jax.log"
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_PYTHON_CLIENT_PREALLOCATE")}
    env |= {"PYTHONPATH": f"{standin}{os.pathsep}{ROOT}", "JAX_STANDIN_LOG": str(log), **env_extra}
    code = pre + CHILD.format(entry=entry)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    records = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    calls = len(Path(f"{log}.calls").read_text().splitlines()) if Path(f"{log}.calls").exists() else 0
    return records, calls, out.stdout, out.stderr


def test_the_training_entry_point_keeps_jax_on_the_cpu(tmp_path: Path) -> None:
    """``mempo.stages.train`` (what experiments/run.py runs) imports bm25s through the retrievers."""
    records, calls, stdout, stderr = run_child(tmp_path, "mempo.stages.train", {})
    assert records == [{"platform": "cpu", "preallocate": "false"}], records
    assert calls == 1  # bm25s's import; the retriever never asked JAX for a top-k
    assert json.loads(stdout.splitlines()[-1]) == [["a", "b"], ["c", "b"]]
    assert "JAX_PLATFORMS" not in stderr, stderr


def test_a_gpu_platform_the_user_set_is_kept_with_one_warning(tmp_path: Path) -> None:
    records, calls, _, stderr = run_child(tmp_path, "mempo.rollout.retrievers", {"JAX_PLATFORMS": "cuda"})
    assert records == [{"platform": "cuda", "preallocate": "false"}], records
    assert calls == 1
    assert stderr.count("JAX_PLATFORMS=cuda (set in the environment) puts JAX on the GPU") == 1, stderr


def test_a_cpu_platform_and_a_preallocation_the_user_set_are_kept_silently(tmp_path: Path) -> None:
    env = {"JAX_PLATFORMS": "cpu", "XLA_PYTHON_CLIENT_PREALLOCATE": "true"}
    records, _, _, stderr = run_child(tmp_path, "mempo.rollout.retrievers", env)
    assert records == [{"platform": "cpu", "preallocate": "true"}], records
    assert "RuntimeWarning" not in stderr, stderr


def test_jax_imported_before_mempo_gets_a_warning(tmp_path: Path) -> None:
    """JAX_PLATFORMS cannot act on a jax that was already imported: the default backend starts, and the guard says so
    (the preallocation is still switched off: JAX reads that when its backend starts)."""
    records, _, _, stderr = run_child(tmp_path, "mempo.rollout.retrievers", {}, pre="import jax\n")
    assert records == [{"platform": "cuda", "preallocate": "false"}], records
    assert stderr.count("jax was imported before mempo") == 1, stderr
