"""The trainer's callbacks, one line each (the algorithm stays in ``MemPOModule``; these own what surrounds it):

    SamplerCallback      the generation engine's life: create, push the policy's weights, weight canary, free
    HostMemory           host memory over a long run: free pages handed back every step, a warning on growth
    StepCheckpoint       a full Lightning checkpoint every ``every_n_steps`` RL steps and at the end, written atomically
    StepTimer            the wall time since this step's batch started (the base of the three below)
    MetricsFile          one row per RL step of the module's metrics in ``metrics.csv`` (resume drops later rows)
    MemoryCreditFile     each RL step's memory-credit records in a JSONL file (and a W&B table)
    ValidationCallback   greedy rollouts of a fixed val set every ``every_n_steps`` RL steps (``val/em``, ``val/f1``)
    PhaseProgress        a phase's progress bar and a console line per step (the base of the two below)
    RLProgress           RL steps: ``[mempo] RL step 3/6: reward 0.562, EM 0.500, 51.8 s``
    SFTProgress          warm-start steps: the bar with the loss

``SamplerCallback`` in full. Fit start: create the engine (and push the policy's weights if they differ from the
folder it loaded, i.e. on resume); after every ``sync_every``-th optimizer step: push the policy's weights (the engine
then samples from the updated policy); fit end or an exception: free. With sleep mode (GPU), the module sleeps the
engine after its rollout, so the update has the accelerator's memory, and this callback wakes it before the push.

Weight canary: after every ``canary_every``-th push, the engine greedily continues a fixed probe prompt for
``canary_tokens`` tokens and the trainer scores the same tokens; a mean absolute log-prob difference above
``canary_tol`` stops the run with an error naming the step. A push that silently did not land (a renamed
parameter skipped, a prefix cache serving old weights) otherwise leaves the engine sampling from a stale policy
while every metric looks plausible. The canary sees a stale engine once the policy has drifted from it by more than
the tolerance, so a push that never lands is caught within the few steps such drift takes at small learning rates.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.strategies import ModelParallelStrategy

from mempo.core.base import temp_sibling, timed, write_csv
from mempo.core.console import progress, say
from mempo.core.hardware import release_free_memory, resident_gb
from mempo.core.tasks import Task
from mempo.eval.evaluate import evaluate_agent
from mempo.lm.logprobs import token_logprobs
from mempo.lm.lora import base_names, is_lora, merged_tensors
from mempo.lm.sharding import full_tensors
from mempo.rollout.retrievers import RetrieverError
from mempo.rollout.sampler import Sampler, SamplingConfig

CANARY_PROBE = "Question:\nWho founded the company that built the first lighthouse?\n\n<mem>"


def rl_step(trainer: L.Trainer, pl_module: L.LightningModule) -> int:
    """The RL steps completed (``MemPOModule.batches_done``; Lightning's optimizer steps for another module)."""
    return int(getattr(pl_module, "batches_done", trainer.global_step))


class WeightCanaryError(RuntimeError):
    """The engine's log-probs of the probe disagree with the trainer's after a weight push."""


def _recording(pairs: Iterable[tuple[str, torch.Tensor]], names: list[str]) -> Iterator[tuple[str, torch.Tensor]]:
    """``pairs`` as they are consumed, each name appended to ``names``."""
    for name, tensor in pairs:
        names.append(name)
        yield name, tensor


def check_streamed_names(streamed: Sequence[str], state: Any, *, tied: bool) -> None:
    """The names a push streamed must be the policy's state-dict keys, each once; a tied ``lm_head.weight`` may be
    left out (it is the embedding, which the engine has under its own name). Raises naming what differs."""
    want, got = set(state), set(streamed)
    missing = sorted(want - got - ({"lm_head.weight"} if tied else set()))
    extra = sorted(got - want)
    twice = sorted({k for k in streamed if streamed.count(k) > 1}) if len(got) != len(streamed) else []
    if missing or extra or twice:
        raise RuntimeError(
            f"weight push: the streamed names are not the policy's state-dict keys: missing {missing[:8]}, "
            f"unexpected {extra[:8]}, streamed twice {twice[:8]} ({len(missing)}, {len(extra)}, {len(twice)} in all)"
        )


def check_logprob_reading(sampler: Any, pl_module: L.LightningModule) -> None:
    """The engine's log-probs of sampled tokens (``sampler.logprobs``: tempered or raw) must be the ones the trainer
    computes (``pl_module.logp_temperature``): otherwise the ratio of the update is off-policy by the temperature
    while every metric looks plausible (the canary's greedy log-probs are raw either way)."""
    reading = getattr(sampler, "logprobs", None)
    temperature = getattr(getattr(pl_module, "sampling", None), "temperature", 1.0)
    if reading is None or temperature in (0.0, 1.0):
        return  # a scripted engine; or tempered and raw coincide
    trainer_tempered = getattr(pl_module, "logp_temperature", 1.0) != 1.0
    if (reading == "tempered") != trainer_tempered:
        raise ValueError(
            f"the engine returns {reading} log-probs but the trainer computes "
            f"{'tempered' if trainer_tempered else 'raw'} ones (sampling temperature {temperature}): build the "
            "sampler with the run's sampler.logprobs"
        )


class SamplerCallback(L.Callback):
    def __init__(
        self,
        make_sampler: Callable[[L.LightningModule], Sampler],
        *,
        sync_every: int = 1,
        canary_every: int = 1,
        canary_tol: float = 1e-3,
        canary_tokens: int = 8,
    ) -> None:
        if sync_every < 1:
            raise ValueError(f"sampler.sync_every must be >= 1, got {sync_every}")
        if canary_every < 0:
            raise ValueError(f"sampler.canary_every must be >= 0 (0 = off), got {canary_every}")
        if canary_tol <= 0 or canary_tokens < 1:
            raise ValueError(f"sampler.canary_tol must be > 0, canary_tokens >= 1; got {canary_tol}, {canary_tokens}")
        self.make_sampler = make_sampler
        self.sync_every = sync_every
        self.canary_every, self.canary_tol, self.canary_tokens = canary_every, canary_tol, canary_tokens
        self.sampler: Sampler | None = None
        self.last_push_s = 0.0
        self.pushes = 0
        self.last_canary_s = 0.0
        self.last_canary_diff: float | None = None

    def check_weights(self, pl_module: L.LightningModule, step: int) -> float:
        """The weight canary (module docstring) -> the mean absolute log-prob difference; raises
        ``WeightCanaryError`` naming ``step`` above ``canary_tol``."""
        t0 = time.perf_counter()
        prompt = list(pl_module.tokenizer(CANARY_PROBE, add_special_tokens=False)["input_ids"])
        params = SamplingConfig(max_new_tokens=self.canary_tokens, temperature=0.0, seed=0)
        gen = self.sampler.generate([prompt], params)[0][0]
        policy = pl_module.policy
        ids = torch.tensor([prompt + list(gen.token_ids)], device=policy.device)
        was_training = policy.training
        policy.eval()
        with torch.no_grad(), torch.autocast(policy.device.type, enabled=False):
            trainer_logp = token_logprobs(policy, ids, torch.ones_like(ids, dtype=torch.bool))[0, len(prompt) :]
        policy.train(was_training)
        engine_logp = torch.tensor(gen.logprobs, dtype=torch.float32)
        diff = float((trainer_logp.float().cpu() - engine_logp).abs().mean()) if gen.token_ids else 0.0
        self.last_canary_s = time.perf_counter() - t0
        self.last_canary_diff = diff
        if not diff <= self.canary_tol:  # also catches NaN
            raise WeightCanaryError(
                f"weight canary failed after the weight push of step {step}: the engine's log-probs of a fixed probe "
                f"differ from the trainer's by {diff:.3g} nats per token on average (tolerance "
                f"sampler.canary_tol={self.canary_tol}); the engine is not sampling from the trained policy"
            )
        return diff

    def _push(self, pl_module: L.LightningModule) -> None:
        """The policy's weights into the engine, streamed: one full tensor at a time (gathered by every rank when
        the policy is sharded, each rank pushing into its own colocated engine). A LoRA policy pushes the base's
        weights with the adapter merged in (``mempo.lm.lora.merged_tensors``: float32, out of place, base names).
        A sampler that generates with the policy itself (``HFSampler``) already has them."""
        t0 = time.perf_counter()
        policy = pl_module.policy
        if getattr(self.sampler, "model", None) is not policy:
            if is_lora(policy):
                names, pairs = base_names(policy), merged_tensors(policy)
            else:
                state = policy.state_dict()
                names, pairs = state, full_tensors(state)
            streamed: list[str] = []
            self.sampler.push_weights(_recording(pairs, streamed))
            check_streamed_names(streamed, names, tied=bool(getattr(policy.config, "tie_word_embeddings", 0)))
        self.last_push_s = time.perf_counter() - t0

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.sampler = self.make_sampler(pl_module)
        pl_module.sampler = self.sampler
        check_logprob_reading(self.sampler, pl_module)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # After the checkpoint is restored (ModelParallelStrategy restores after on_fit_start, DDP before it).
        if getattr(pl_module, "batches_done", 0) > 0:  # resumed: the engine loaded the starting weights
            self._push(pl_module)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        # The module put the engine to sleep after its rollout (a no-op without sleep mode); weights are pushed
        # into an awake engine, which then stays awake for the next rollout.
        self.sampler.wake()
        done = getattr(pl_module, "batches_done", batch_idx + 1)
        if done % self.sync_every == 0:
            self._push(pl_module)
            self.pushes += 1
            pl_module.log("perf/push_s", self.last_push_s, on_step=True, batch_size=1)
            pl_module.last_metrics["perf/push_s"] = self.last_push_s
            if self.canary_every > 0 and self.pushes % self.canary_every == 0:
                diff = self.check_weights(pl_module, done)
                canary = {"perf/canary_s": self.last_canary_s, "train/canary_logp_diff": diff}
                pl_module.log_dict(canary, on_step=True, batch_size=1)
                pl_module.last_metrics.update(canary)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.teardown_sampler(pl_module)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self.teardown_sampler(pl_module)

    def teardown_sampler(self, pl_module: L.LightningModule) -> None:
        if self.sampler is not None:
            self.sampler.shutdown()
            self.sampler = None
            pl_module.sampler = None


class HostMemory(L.Callback):
    """The process's host memory over a long run (docs/performance.md, "Long runs"). After every
    ``release_every``-th RL step (0 = never): a garbage collection and ``malloc_trim(0)``
    (``mempo.core.hardware.release_free_memory``), which hand back the pages glibc's malloc arenas hold free; without
    it those pages pile up step after step. Then the RSS, logged as ``perf/rss_kept_gb`` (what the run keeps between
    steps; ``perf/rss_gb`` is read inside the step, after the update), and once per process a console warning when it
    has grown by more than ``warn_growth`` (a share; 0 = off) since the second RL step this process ran."""

    def __init__(self, release_every: int = 1, warn_growth: float = 0.5) -> None:
        if release_every < 0 or warn_growth < 0:
            raise ValueError(f"host.release_every and host.rss_warn_growth must be >= 0, got {release_every}, "
                             f"{warn_growth}")  # fmt: skip
        self.release_every, self.warn_growth = release_every, warn_growth
        self.seen = 0
        self.base: tuple[int, float] | None = None  # (RL step, RSS in GB) at this process's second step
        self.warned = False

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = rl_step(trainer, pl_module)
        if self.release_every and step % self.release_every == 0:
            release_free_memory()
        rss = resident_gb()
        if hasattr(pl_module, "last_metrics"):  # before MetricsFile writes the step's row
            pl_module.log("perf/rss_kept_gb", rss, on_step=True, batch_size=1)
            pl_module.last_metrics["perf/rss_kept_gb"] = rss
        self.seen += 1
        if self.seen == 2:
            self.base = (step, rss)
        if self.base is None or self.warned or not self.warn_growth or step <= self.base[0]:
            return
        base_step, base_rss = self.base
        if rss > base_rss * (1 + self.warn_growth):
            self.warned = True
            rank = f"rank {trainer.global_rank}: " if trainer.world_size > 1 else ""
            say(
                f"[mempo] warning: {rank}resident memory grew from {base_rss:.2f} GB at RL step {base_step} to "
                f"{rss:.2f} GB at step {step} ({(rss - base_rss) / (step - base_step):+.3f} GB a step, over "
                f"host.rss_warn_growth={self.warn_growth}); a long run may run out of memory: see "
                "docs/performance.md#long-runs"
            )


class StepCheckpoint(L.Callback):
    """Saves a full Lightning checkpoint (weights, optimizer, loops, module state) to ``dirpath/last.ckpt`` every
    ``every_n_steps`` RL steps and at the end of training, atomically: a crash mid-save leaves the previous one.

    One process or DDP: a file, written by rank 0 to a temporary name and renamed. FSDP2 (``FSDP2Strategy``): a
    sharded checkpoint, a folder ``step-<k>`` that every rank writes its shards into (rank 0 the metadata); once
    all are done, rank 0 points the symlink ``last.ckpt`` at it (a rename, atomic) and deletes the older folder."""

    def __init__(self, dirpath: str | Path, every_n_steps: int) -> None:
        if every_n_steps < 1:
            raise ValueError(f"ckpt.every_n_steps must be >= 1, got {every_n_steps}")
        self.dirpath = Path(dirpath)
        self.every_n_steps = every_n_steps
        self.saved_at = -1

    @property
    def last_path(self) -> Path:
        return self.dirpath / "last.ckpt"

    def save(self, trainer: L.Trainer, step: int) -> None:
        if step == self.saved_at:
            return
        self.dirpath.mkdir(parents=True, exist_ok=True)
        if isinstance(trainer.strategy, ModelParallelStrategy):
            self._save_sharded(trainer, step)
        else:
            tmp = temp_sibling(self.last_path)
            trainer.save_checkpoint(tmp)
            if trainer.is_global_zero:
                os.replace(tmp, self.last_path)
        self.saved_at = step

    def _save_sharded(self, trainer: L.Trainer, step: int) -> None:
        folder = self.dirpath / f"step-{step:06d}"
        if self.last_path.is_symlink() and self.last_path.resolve() == folder.resolve():
            return  # resumed from this very step: the checkpoint is already there
        if trainer.is_global_zero and folder.exists():
            shutil.rmtree(folder)  # a half-written folder of a crashed save of this step
        trainer.strategy.barrier()
        trainer.save_checkpoint(folder)  # every rank writes its shards
        trainer.strategy.barrier()
        if trainer.is_global_zero:
            link = temp_sibling(self.last_path)
            link.unlink(missing_ok=True)
            os.symlink(folder.name, link)
            os.replace(link, self.last_path)
            self._drop_unlinked()
        trainer.strategy.barrier()

    def _drop_unlinked(self) -> None:
        """Sharded-checkpoint folders ``last.ckpt`` does not point at (older steps, or a crashed save)."""
        current = self.last_path.resolve() if self.last_path.exists() else None
        for folder in self.dirpath.glob("step-*"):
            if folder.resolve() != current:
                shutil.rmtree(folder, ignore_errors=True)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # A process killed mid-save leaves its half-written temporary file (as large as a checkpoint) or shard
        # folder; neither is ever read.
        if trainer.is_global_zero and self.dirpath.is_dir():
            for stale in self.dirpath.glob(".last.ckpt.tmp*"):
                stale.unlink(missing_ok=True)
            self._drop_unlinked()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = rl_step(trainer, pl_module)
        if step % self.every_n_steps == 0:
            self.save(trainer, step)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.save(trainer, rl_step(trainer, pl_module))

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        """An unreachable retriever stops the run: keep the last completed step. A retriever fails during the
        rollout, before the step touches the weights or the optimizer, so the state is that step's. Only on a
        single process: a save is collective under DDP and would hang if one rank alone failed (the periodic
        checkpoint stands there)."""
        if isinstance(exception, RetrieverError) and trainer.world_size == 1:
            self.save(trainer, rl_step(trainer, pl_module))


class HFSnapshots(L.Callback):
    """Every ``every_n_steps`` RL steps: the policy as a Hugging Face folder ``dirpath/step-<k>`` (six digits), made
    by ``export(folder, write)`` (the RL stage's export: every rank calls it, so that a sharded policy is gathered;
    rank 0 writes). Kept, unlike ``last.ckpt``: the checkpoints of a learning curve, each one evaluable on its own."""

    def __init__(self, dirpath: str | Path, every_n_steps: int, export: Callable[[Path, bool], Any]) -> None:
        if every_n_steps < 1:
            raise ValueError(f"ckpt.hf_every_n_steps must be >= 1 for snapshots, got {every_n_steps}")
        self.dirpath = Path(dirpath)
        self.every_n_steps = every_n_steps
        self.export = export

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = rl_step(trainer, pl_module)
        if step % self.every_n_steps == 0:
            self.export(self.dirpath / f"step-{step:06d}", trainer.is_global_zero)


class StepTimer(L.Callback):
    """``step_seconds()``: the wall time since this step's batch started (callbacks run in their list order)."""

    step_start = 0.0

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self.step_start = time.perf_counter()

    def step_seconds(self) -> float:
        return time.perf_counter() - self.step_start


class MetricsFile(StepTimer):
    """Appends one row per RL step (``pl_module.last_metrics`` plus ``step`` and ``perf/step_s``, the step's wall
    time from batch start to the end of the callbacks placed before this one: rollout, update, weight push,
    validation) to ``metrics.csv``. On resume, rows of steps after the checkpoint (written before a crash) are
    dropped, so no step appears twice or goes missing. Rows are appended; the file is rewritten only when a new
    column appears (e.g. val/* on the first validation step).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # on_train_start: after a resumed checkpoint is restored under every strategy (FSDP2 restores after
        # on_fit_start), so batches_done is the checkpoint's.
        if not trainer.is_global_zero or not self.path.exists():
            return
        done = int(getattr(pl_module, "batches_done", 0))
        rows = self._read()
        kept = [r for r in rows if int(r["step"]) <= done]
        if len(kept) != len(rows):
            self._rewrite(kept)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not trainer.is_global_zero:
            return
        row = {"step": rl_step(trainer, pl_module), **pl_module.last_metrics}
        row["perf/step_s"] = self.step_seconds()
        header = self._header()
        if header is not None and all(k in header for k in row):
            with self.path.open("a", newline="") as f:
                csv.DictWriter(f, fieldnames=header).writerow(row)
        else:  # a new file, or a new column: rewrite with the grown header
            self._rewrite(self._read() + [row])

    def _header(self) -> list[str] | None:
        if not self.path.exists():
            return None
        with self.path.open(newline="") as f:
            return next(csv.reader(f), None)

    def _read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        with self.path.open(newline="") as f:
            return list(csv.DictReader(f))

    def _rewrite(self, rows: list[dict[str, Any]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_csv(self.path, rows, list(dict.fromkeys(k for r in rows for k in r)))


class MemoryCreditFile(L.Callback):
    """Appends each RL step's memory-credit records (``pl_module.last_credit``, ``mempo.eval.memory_credit``) to a
    JSONL file, and with a W&B logger logs them as a table (the first ``table_rows`` of each step). On resume,
    records of steps after the checkpoint are dropped, as ``MetricsFile`` drops its rows."""

    def __init__(self, path: str | Path, table_rows: int = 64) -> None:
        self.path = Path(path)
        self.table_rows = table_rows

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # on_train_start: after a resumed checkpoint is restored under every strategy (FSDP2 restores after
        # on_fit_start), so batches_done is the checkpoint's.
        if not trainer.is_global_zero or not self.path.exists():
            return
        done = int(getattr(pl_module, "batches_done", 0))
        lines = self.path.read_text().splitlines()
        kept = [ln for ln in lines if ln.strip() and int(json.loads(ln)["step"]) <= done]
        if len(kept) != len(lines):
            self.path.write_text("".join(f"{ln}\n" for ln in kept))

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        records = getattr(pl_module, "last_credit", [])
        if not trainer.is_global_zero or not records:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                cols = list(records[0])
                rows = [[r[c] for c in cols] for r in records[: self.table_rows]]
                logger.log_table(key="memory/credit", columns=cols, data=rows, step=trainer.global_step)


class ValidationCallback(L.Callback):
    """Every ``every_n_steps`` RL steps: one greedy rollout per task of a fixed val set through the module's own
    sampler (after SamplerCallback pushed the new weights), logged as val/em, val/f1, val/tt, val/pt, ... and its
    wall time as perf/validation_s, merged into ``pl_module.last_metrics`` (so MetricsFile writes them; place this
    callback before it)."""

    def __init__(self, tasks: Sequence[Task], every_n_steps: int, *, reward_kind: str = "all_em") -> None:
        if every_n_steps < 1:
            raise ValueError(f"eval.every_n_steps must be >= 1 for validation, got {every_n_steps}")
        if not tasks:
            raise ValueError("validation needs at least one task (data.num_val_tasks)")
        self.tasks = list(tasks)
        self.every_n_steps = every_n_steps
        self.reward_kind = reward_kind

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = rl_step(trainer, pl_module)
        if step % self.every_n_steps != 0:
            return
        timings: dict[str, float] = {}
        with timed(timings, "validation"):
            metrics, _ = evaluate_agent(
                pl_module.sampler,
                pl_module.env,
                self.tasks,
                pl_module.builder,
                pl_module.agent,
                sampling=pl_module.sampling,
                include_tags=pl_module.memory_cfg.include_tags,
                reward_kind=self.reward_kind,
                greedy=True,
            )
        metrics["perf/validation_s"] = timings["validation"]
        pl_module.last_metrics.update(metrics)
        pl_module.log_dict(metrics, on_step=True, batch_size=len(self.tasks))


class PhaseProgress(StepTimer):
    """A phase's progress bar over its steps (``mempo.core.console.progress``: drawn on a terminal only) and the console
    line ``line`` returns after each step (None: no line). Rank zero only."""

    desc = "steps"

    def __init__(self, total: int) -> None:
        self.total = total
        self.bar: Any = None

    def done(self, trainer: L.Trainer, pl_module: L.LightningModule) -> int:
        return trainer.global_step

    def line(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int, seconds: float) -> str | None:
        return None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.is_global_zero:
            self.bar = progress(self.desc, self.total, initial=self.done(trainer, pl_module))

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.bar is None:
            return
        seconds = self.step_seconds()
        step = self.done(trainer, pl_module)
        text = self.line(trainer, pl_module, step, seconds)  # before the update, which redraws a postfix it sets
        self.bar.update(step - self.bar.n)
        if text is not None:
            say(text)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.close()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self.close()


class RLProgress(PhaseProgress):
    """RL steps: the bar and one line per step, e.g. ``[mempo] RL step 3/6: reward 0.562, EM 0.500, 51.8 s``
    (``rollout/reward_mean``, ``rollout/em_mean`` of the step's rollouts, ``val EM`` (``val/em``) on validation
    steps, and the step's wall time up to this callback: place it after StepCheckpoint to include the save, which
    metrics.csv's ``perf/step_s`` leaves out)."""

    desc = "RL"

    def done(self, trainer: L.Trainer, pl_module: L.LightningModule) -> int:
        return rl_step(trainer, pl_module)

    def line(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int, seconds: float) -> str:
        m = getattr(pl_module, "last_metrics", {})
        parts = [f"reward {m.get('rollout/reward_mean', float('nan')):.3f}"]
        parts.append(f"EM {m.get('rollout/em_mean', float('nan')):.3f}")
        if "val/em" in m:
            parts.append(f"val EM {m['val/em']:.3f}")
        return f"[mempo] RL step {step}/{self.total}: {', '.join(parts)}, {seconds:.1f} s"


class SFTProgress(PhaseProgress):
    """Warm-start steps: the bar with the loss (``sft/loss``); when no bar is drawn (output redirected), a line
    every tenth of the steps instead, e.g. ``[mempo] warm start step 9/30: loss 0.214``."""

    desc = "warm start"

    def line(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int, seconds: float) -> str | None:
        loss = trainer.callback_metrics.get("sft/loss")
        if loss is None:
            return None
        self.bar.set_postfix_str(f"loss {float(loss):.3f}", refresh=False)
        if not self.bar.disable or (step % max(self.total // 10, 1) != 0 and step != self.total):
            return None
        return f"[mempo] warm start step {step}/{self.total}: loss {float(loss):.3f}"
