"""A user's own reward, retriever and advantage estimator, given by import path in the config (docs/guide/extending.md):

    reward.kind=pkg.module:fn               a ``mempo.rollout.rewards.RewardFn``: (answer, gold_answers) -> float
    env.retriever=pkg.module:Factory        ``Factory(corpus=PATH)`` -> an object with ``retrieve(queries, topk)``
                                            returning, per query, a list of ``mempo.rollout.retrievers.Passage``
    advantage.estimator=pkg.module:fn       a ``mempo.losses.AdvantageEstimator``: (inputs, memory, advantage) ->
                                            [N, T] token advantages; ``fn.needs_memory_scores`` if it reads R^M

or ``path/to/file.py:name`` for a script that is not installed. ``register_plugins`` (run by
``mempo.stages.config.validate_config``, so on every rank of a multi-process run) imports each one, checks that it can
be called as its registry calls it and that a call on a probe input returns the right type, and registers it under the
import path itself, so the code that reads the registries runs it as a built-in. Anything wrong is a ValueError naming
the key before any model loads. ``code_provenance`` gives each one's resolved file and the hash of its bytes for the
run's saved config (``mempo.stages.reuse``): a run resumed or reused under edited code is refused like a changed key.
"""

from __future__ import annotations

import inspect
import math
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from mempo.core.plugins import is_import_path, load_object, source_of
from mempo.losses import ADVANTAGE_ESTIMATORS, AdvantageConfig, AdvantageInputs, MemoryConfig
from mempo.rollout.retrievers import RETRIEVERS, Passage
from mempo.rollout.rewards import REWARD_KINDS

PLUGIN_KEYS = ("reward.kind", "env.retriever", "advantage.estimator")


def plugin_specs(cfg: DictConfig) -> dict[str, str]:
    """key -> import path for each of ``PLUGIN_KEYS`` that ``cfg`` sets to one."""
    values = {key: OmegaConf.select(cfg, key) for key in PLUGIN_KEYS}
    return {key: v for key, v in values.items() if is_import_path(v)}


def _callable_as(obj: Any, where: str, expected: str, *args: Any, **kwargs: Any) -> None:
    """A ValueError naming ``where`` unless ``obj`` is callable and its signature takes these arguments."""
    if not callable(obj):
        raise ValueError(f"{where}: {obj!r} is not callable; expected {expected}")
    try:
        inspect.signature(obj).bind(*args, **kwargs)
    except TypeError as e:
        raise ValueError(f"{where}: {getattr(obj, '__name__', obj)}{inspect.signature(obj)} cannot be called as "
                         f"{expected} ({e})") from None  # fmt: skip
    except ValueError:  # no signature to read (a builtin): the probe call below decides
        pass


def _probe(where: str, call: Callable[[], Any]) -> Any:
    try:
        return call()
    except Exception as e:
        raise ValueError(f"{where}: a call on a probe input raised {type(e).__name__}: {e}") from e


def check_reward(fn: Any, where: str) -> None:
    """``fn`` can be called as a ``RewardFn`` and returns a finite real number on a probe."""
    _callable_as(fn, where, "fn(answer, gold_answers) -> float", "Paris", [["Paris"]])
    value = _probe(where, lambda: fn("Paris", [["Paris"]]))
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{where}: returned {value!r} ({type(value).__name__}) for answer 'Paris', gold [['Paris']]; "
                         "a reward returns a finite float")  # fmt: skip


def check_retriever(factory: Any, where: str) -> None:
    """``factory(corpus=PATH)`` builds an object whose ``retrieve(queries, topk)`` returns a list per query of
    ``Passage``s, on a one-passage probe corpus."""
    _callable_as(factory, where, "Factory(corpus=PATH)", corpus="corpus.jsonl")
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "probe.jsonl"
        corpus.write_text('{"id": "p0", "contents": "\\"Probe\\"\\nThe probe passage."}\n')
        retriever = _probe(where, lambda: factory(corpus=str(corpus)))
        if not callable(getattr(retriever, "retrieve", None)):
            raise ValueError(f"{where}: Factory(corpus=...) returned {type(retriever).__name__}, which has no "
                             "retrieve(queries, topk) method")  # fmt: skip
        got = _probe(where, lambda: retriever.retrieve(["probe"], 1))
    ok = isinstance(got, list) and len(got) == 1 and isinstance(got[0], list)
    if not ok or not all(isinstance(p, Passage) for p in got[0]):
        raise ValueError(f"{where}: retrieve(['probe'], 1) returned {got!r}; expected one list of "
                         "mempo.rollout.retrievers.Passage per query")  # fmt: skip


def probe_inputs() -> AdvantageInputs:
    """Two trajectories of one task (rewards 1 and 0), one turn each, 3 response tokens, the last a memory token; the
    dtypes of a real batch (``mempo.rollout.agent.RolloutBatch.to_tensors``: int ids, bool masks)."""
    mask = torch.ones(2, 3, dtype=torch.bool)  # bool masks, as RolloutBatch.to_tensors places them
    return AdvantageInputs(
        rewards=torch.tensor([1.0, 0.0]),
        group_ids=torch.tensor([0, 0]),
        traj_ids=torch.tensor([0, 1]),
        turn_ids=torch.tensor([0, 0]),
        mem_rewards=torch.tensor([0.5, 0.25]),
        mem_valid=torch.tensor([True, True]),
        response_mask=mask,
        mem_mask=torch.tensor([[False, False, True], [False, False, True]]),
    )


def check_estimator(fn: Any, where: str, memory: MemoryConfig, advantage: AdvantageConfig) -> None:
    """``fn(inputs, memory, advantage)`` returns a finite float tensor shaped like ``response_mask`` on a probe."""
    x = probe_inputs()
    _callable_as(fn, where, "fn(inputs, memory, advantage) -> Tensor [N, T]", x, memory, advantage)
    out = _probe(where, lambda: fn(x, memory, advantage))
    if not isinstance(out, torch.Tensor) or out.shape != x.response_mask.shape or not out.is_floating_point():
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"{where}: returned {shape} for a probe of 2 turns x 3 tokens; expected a float Tensor "
                         "[N, T] shaped like inputs.response_mask")  # fmt: skip
    if not torch.isfinite(out).all():
        raise ValueError(f"{where}: returned non-finite advantages on a probe")


def register_plugins(cfg: DictConfig) -> dict[str, Any]:
    """Import, check and register every import path ``cfg`` sets in ``PLUGIN_KEYS`` (see the module docstring) ->
    key -> the object registered."""
    out: dict[str, Any] = {}
    for key, spec in plugin_specs(cfg).items():
        obj = load_object(spec, key=key)
        where = f"{key}={spec!r}"
        if key == "reward.kind":
            check_reward(obj, where)
            REWARD_KINDS[spec] = obj
        elif key == "env.retriever":
            check_retriever(obj, where)
            RETRIEVERS[spec] = obj
        else:
            memory = MemoryConfig(**OmegaConf.to_container(cfg.memory))
            advantage = AdvantageConfig(**OmegaConf.to_container(cfg.advantage))
            check_estimator(obj, where, memory, advantage)
            if not hasattr(obj, "needs_memory_scores"):
                obj.needs_memory_scores = False
            ADVANTAGE_ESTIMATORS[spec] = obj
        out[key] = obj
    return out


PROVENANCE_NAMES = {"reward.kind": "reward", "env.retriever": "retriever", "advantage.estimator": "advantage"}


def code_provenance(cfg: DictConfig) -> dict[str, dict[str, str]]:
    """reward | retriever | advantage -> {"resolved": "<file>:<name>", "sha256": the file's hash} for each import
    path ``cfg`` sets (``source_of``: the file is hashed, not run)."""
    out = {}
    for key, spec in plugin_specs(cfg).items():
        path, digest = source_of(spec)
        out[PROVENANCE_NAMES[key]] = {"resolved": f"{path}:{spec.rpartition(':')[2]}", "sha256": digest}
    return out
