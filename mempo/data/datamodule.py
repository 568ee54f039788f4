"""``TaskDataModule``: an endless, deterministic stream of task batches for RL, and a fixed validation set.

Batch k of the stream is a pure function of (tasks, seed, k, rank): epoch e = a fresh seeded permutation of the
task pool, so a resumed run starts the stream at the number of batches already trained on and sees exactly the
batches an uninterrupted run would have (``MemPOModule.batches_done`` is saved in every checkpoint).
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import lightning as L
from torch.utils.data import DataLoader, IterableDataset

from mempo.core.base import one_of, require
from mempo.core.tasks import Task
from mempo.data.compose import COMPOSE_MODES

DATA_SOURCES = ("synthetic", "qa_files")
MAX_REDRAW_ROUNDS = 7  # a round's sampling seeds are offset within its step's (mempo.models.module.ROUND_SEED_STRIDE)


@dataclass(frozen=True)
class DataConfig:
    """Config group ``data``: where RL's tasks come from and the shape of a step.

    source: synthetic (the embedded world) | qa_files (Search-R1-style jsonl/parquet in train_files, val_files and
    test_files: eval.split=test reads test_files, refused when one of its questions is in the train or val files;
    a file of pre-composed tasks, e.g. MEM1's, is taken as it is; a row without data_source takes its file's
    dataset name: the stem, or the folder in FlashRAG's ``<dataset>/<split>.jsonl``). compose: how question files
    become tasks, pooled (every file's questions shuffled together with ``seed``) | by_source (MEM1's: consecutive
    questions of one data_source, remainder dropped). Fewer validation or evaluation tasks than pre-composed (or
    by_source) tasks a split holds are drawn in proportion to their sources with ``seed``, not the file's first.
    objectives: questions per task; batch_size: tasks per RL step across all data-parallel ranks (the paper: 128;
    each of W ranks takes batch_size / W of them, and W must divide it); group_size: G rollouts per task (the paper:
    16); world_seed: the synthetic world; num_val_tasks: in-training validation tasks.
    dynamic_sampling: DAPO's dynamic sampling (off by default): a group without signal is dropped and up to
    redraw_rounds rounds of extra tasks (``RedrawStream``) are rolled out until each rank has its share of the batch
    in groups with signal (``mempo.rollout.dynamic``).
    """

    source: str = "synthetic"
    train_files: list[str] = field(default_factory=list)
    val_files: list[str] = field(default_factory=list)
    test_files: list[str] = field(default_factory=list)
    compose: str = "pooled"
    objectives: int = 2
    batch_size: int = 2
    group_size: int = 4
    world_seed: int = 0
    num_val_tasks: int = 16
    num_workers: int = 0
    dynamic_sampling: bool = False
    redraw_rounds: int = 3

    def __post_init__(self) -> None:
        require(
            "data",
            self,
            [
                ("source", self.source in DATA_SOURCES, one_of(DATA_SOURCES)),
                ("train_files", self.source != "qa_files" or len(self.train_files) > 0, "is required (qa_files)"),
                ("compose", self.compose in COMPOSE_MODES, one_of(COMPOSE_MODES)),
                ("objectives", self.objectives >= 1, "must be >= 1"),
                ("batch_size", self.batch_size >= 1, "must be >= 1"),
                ("group_size", self.group_size >= 2, "must be >= 2 (GRPO needs a group)"),
                ("num_val_tasks", self.num_val_tasks >= 1, "must be >= 1"),
                ("num_workers", self.num_workers >= 0, "must be >= 0"),
                ("redraw_rounds", 1 <= self.redraw_rounds <= MAX_REDRAW_ROUNDS, f"must be in 1..{MAX_REDRAW_ROUNDS}"),
            ],
        )


def _identity(batch: list[Task]) -> list[Task]:
    return batch


def per_rank_batch(batch_size: int, world_size: int) -> int:
    """Tasks each rank takes of a step's ``data.batch_size`` (tasks per step across all ranks); an error naming the
    key and the world size when the ranks cannot take equal shares."""
    if world_size < 1:
        raise ValueError(f"world size must be >= 1, got {world_size}")
    if batch_size % world_size != 0:
        raise ValueError(
            f"data.batch_size={batch_size} (tasks per step across all ranks) is not divisible by the world size "
            f"{world_size}: each rank takes an equal share; use a multiple of {world_size}"
        )
    return batch_size // world_size


def tasks_per_step_line(batch_size: int, world_size: int) -> str:
    """E.g. "tasks per step: 128 (16 per rank x 8 ranks)"; one process: "tasks per step: 2"."""
    if world_size == 1:
        return f"tasks per step: {batch_size}"
    return f"tasks per step: {batch_size} ({per_rank_batch(batch_size, world_size)} per rank x {world_size} ranks)"


class TaskStream(IterableDataset):
    """Yields this rank's share of each global batch of ``batch_size`` tasks, starting at batch ``start``: rank r of
    ``world_size`` takes the r-th contiguous slice of ``batch_size / world_size`` tasks, so the ranks' tasks at step
    k together are exactly batch k of one process."""

    def __init__(
        self,
        tasks: Sequence[Task],
        batch_size: int,
        *,
        seed: int = 0,
        start: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if not tasks:
            raise ValueError("TaskStream: the task pool is empty")
        if batch_size < 1:
            raise ValueError(f"data.batch_size must be >= 1, got {batch_size}")
        self.per_rank = per_rank_batch(batch_size, world_size)
        self.tasks, self.batch_size, self.seed = list(tasks), batch_size, seed
        self.start, self.rank, self.world_size = start, rank, world_size
        self._perms: dict[int, list[int]] = {}

    def _order(self, epoch: int) -> list[int]:
        if epoch not in self._perms:
            perm = list(range(len(self.tasks)))
            random.Random(self.seed * 1_000_003 + epoch).shuffle(perm)
            self._perms = {epoch: perm}  # keep one epoch: the stream only moves forward
        return self._perms[epoch]

    def batch(self, k: int) -> list[Task]:
        """Global batch k."""
        out = []
        for j in range(k * self.batch_size, (k + 1) * self.batch_size):
            epoch, pos = divmod(j, len(self.tasks))
            out.append(self.tasks[self._order(epoch)[pos]])
        return out

    def __iter__(self) -> Iterator[list[Task]]:
        k = self.start
        lo = self.rank * self.per_rank
        while True:
            yield self.batch(k)[lo : lo + self.per_rank]
            k += 1


class RedrawStream:
    """Dynamic sampling's extra tasks: ``stream(step, round, rank, n)`` is n tasks of the training pool drawn without
    replacement (with it past the pool's size), a pure function of (seed, step, round, rank), so a resumed run
    redraws exactly what an uninterrupted one did and ranks draw apart."""

    def __init__(self, tasks: Sequence[Task], *, seed: int = 0) -> None:
        if not tasks:
            raise ValueError("RedrawStream: the task pool is empty")
        self.tasks, self.seed = list(tasks), seed

    def __call__(self, step: int, round: int, rank: int, n: int) -> list[Task]:
        rng = random.Random(f"redraw/{self.seed}/{step}/{round}/{rank}")  # str seeds hash deterministically
        k = len(self.tasks)
        picks = rng.sample(range(k), n) if n <= k else rng.choices(range(k), k=n)
        return [self.tasks[i] for i in picks]


class TaskDataModule(L.LightningDataModule):
    def __init__(self, train_tasks: Sequence[Task], val_tasks: Sequence[Task], *, batch_size: int, seed: int = 0):
        super().__init__()
        if not train_tasks:
            raise ValueError("no training tasks: check data.source and data.train_files")
        self.train_tasks, self.val_tasks = list(train_tasks), list(val_tasks)
        self.batch_size, self.seed = batch_size, seed

    def train_dataloader(self) -> DataLoader:
        start, rank, world = 0, 0, 1
        if self.trainer is not None:
            start = int(getattr(self.trainer.lightning_module, "batches_done", 0))
            rank, world = self.trainer.global_rank, self.trainer.world_size
        stream = TaskStream(self.train_tasks, self.batch_size, seed=self.seed, start=start, rank=rank, world_size=world)
        return DataLoader(stream, batch_size=None, collate_fn=_identity)
