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

DATA_SOURCES = ("synthetic", "qa_files")


@dataclass(frozen=True)
class DataConfig:
    """Config group ``data``: where RL's tasks come from and the shape of a step.

    source: synthetic (the embedded world) | qa_files (Search-R1-style jsonl/parquet in train_files, val_files).
    objectives: questions per task; batch_size: tasks per RL step (the paper: 128); group_size: G rollouts per task
    (the paper: 16); world_seed: the synthetic world; num_val_tasks: in-training validation tasks.
    """

    source: str = "synthetic"
    train_files: list[str] = field(default_factory=list)
    val_files: list[str] = field(default_factory=list)
    objectives: int = 2
    batch_size: int = 2
    group_size: int = 4
    world_seed: int = 0
    num_val_tasks: int = 16
    num_workers: int = 0

    def __post_init__(self) -> None:
        require(
            "data",
            self,
            [
                ("source", self.source in DATA_SOURCES, one_of(DATA_SOURCES)),
                ("train_files", self.source != "qa_files" or len(self.train_files) > 0, "is required (qa_files)"),
                ("objectives", self.objectives >= 1, "must be >= 1"),
                ("batch_size", self.batch_size >= 1, "must be >= 1"),
                ("group_size", self.group_size >= 2, "must be >= 2 (GRPO needs a group)"),
                ("num_val_tasks", self.num_val_tasks >= 1, "must be >= 1"),
                ("num_workers", self.num_workers >= 0, "must be >= 0"),
            ],
        )


def _identity(batch: list[Task]) -> list[Task]:
    return batch


class TaskStream(IterableDataset):
    """Yields lists of ``batch_size`` tasks, starting at batch ``start``; each rank of ``world_size`` takes every
    ``world_size``-th batch of the global stream."""

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
        while True:
            yield self.batch(k * self.world_size + self.rank)
            k += 1


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
