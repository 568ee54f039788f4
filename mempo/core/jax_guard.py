"""Keep JAX, where it is installed, off the GPU: mempo never uses JAX, but bm25s (the BM25 retriever's index) starts it.

bm25s 0.3.16 runs ``jax.lax.top_k(np.array([0] * 5), 1)`` at import whenever ``jax`` imports (``bm25s/selection.py``),
which initializes JAX's default backend: the GPU where jax has its CUDA plugin. JAX then preallocates 75% of that GPU
for itself, in the training process, before any model exists (seen on an H200: 107,925 MiB in use seconds after the
start of a process that only imported mempo; the first forward of a 1.5B step then ran out of memory).

``keep_jax_off_gpu()`` runs right before mempo's only ``import bm25s`` (``mempo.rollout.retrievers``), so every import
path to bm25s passes through it. It only sets what the user has not set:

- ``JAX_PLATFORMS=cpu`` where ``JAX_PLATFORMS`` is unset or empty; a value the user set is kept, with one warning
  when it names a GPU platform (``cuda``, ``gpu``, ``rocm``);
- ``XLA_PYTHON_CLIENT_PREALLOCATE=false`` where unset, so that even a JAX on the GPU takes memory as it needs it.

Both are environment variables, so processes mempo starts (Lightning's ranks) inherit them. JAX reads
``JAX_PLATFORMS`` when it is imported: where ``jax`` was imported before mempo, the variable cannot act any more and
the guard warns instead (the preallocation setting still acts until JAX's first computation).
Test: tests/core/test_jax_guard.py.
"""

from __future__ import annotations

import os
import sys
import warnings

GPU_PLATFORMS = frozenset({"cuda", "gpu", "rocm"})
_warned = False


def _warn_once(message: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def keep_jax_off_gpu() -> str:
    """Set ``JAX_PLATFORMS=cpu`` and ``XLA_PYTHON_CLIENT_PREALLOCATE=false`` where the user has not set them (see the
    module docstring); call it before anything imports bm25s. Returns the ``JAX_PLATFORMS`` value JAX will see."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    user = os.environ.get("JAX_PLATFORMS", "").strip()
    if not user:
        os.environ["JAX_PLATFORMS"] = "cpu"
        if "jax" in sys.modules:
            _warn_once(
                "jax was imported before mempo, so JAX_PLATFORMS=cpu can no longer keep it off the GPU: bm25s's import "
                "will start JAX's default backend (export JAX_PLATFORMS=cpu before starting Python to avoid it)"
            )
        return "cpu"
    named = {p.strip().lower() for p in user.split(",")}
    if named & GPU_PLATFORMS:
        _warn_once(
            f"JAX_PLATFORMS={user} (set in the environment) puts JAX on the GPU: importing bm25s starts it there, in "
            f"the training process (mempo itself never uses JAX; XLA_PYTHON_CLIENT_PREALLOCATE="
            f"{os.environ['XLA_PYTHON_CLIENT_PREALLOCATE']}). Unset it or set JAX_PLATFORMS=cpu to keep the GPU "
            "for torch"
        )
    return user
