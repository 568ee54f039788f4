"""Task types shared by every data source.

A *question* is one objective with its gold answers; a *task* bundles N questions (docs/algorithm.md §2:
multi-objective QA after MEM1). The agent answers all objectives in one ``<answer>``, separated by ``;``.
"""

from __future__ import annotations

from dataclasses import dataclass

ANSWER_SEPARATOR = "; "


@dataclass(frozen=True)
class Question:
    """One objective: the question text and its gold answers (aliases; the first is canonical). ``source``: the
    dataset it comes from (Search-R1's and MEM1's ``data_source``: nq, hotpotqa, ...; "" when unknown)."""

    question: str
    answers: tuple[str, ...]
    qid: str = ""
    source: str = ""

    def __post_init__(self) -> None:
        if not self.question.strip():
            raise ValueError(f"question {self.qid!r}: empty question text")
        if not self.answers or not all(a.strip() for a in self.answers):
            raise ValueError(f"question {self.qid!r}: needs at least one non-empty gold answer, got {self.answers!r}")


@dataclass(frozen=True)
class Task:
    """N objectives asked together. ``gold`` is the canonical answers joined by ``"; "`` (the teacher-forced
    target of memory scoring, Eq. 4)."""

    task_id: str
    objectives: tuple[Question, ...]

    def __post_init__(self) -> None:
        if not self.objectives:
            raise ValueError(f"task {self.task_id!r}: no objectives")

    @property
    def question(self) -> str:
        """The text the agent sees: one numbered line per objective (a single objective is left unnumbered)."""
        if len(self.objectives) == 1:
            return self.objectives[0].question
        return "\n".join(f"({i}) {q.question}" for i, q in enumerate(self.objectives, start=1))

    @property
    def source(self) -> str:
        """The objectives' ``source`` when they share one, else their distinct sources sorted and joined by "+" (a
        pooled task of an NQ and a HotpotQA question is "hotpotqa+nq" whichever came first)."""
        return "+".join(sorted({q.source for q in self.objectives}))

    @property
    def gold(self) -> str:
        return ANSWER_SEPARATOR.join(q.answers[0] for q in self.objectives)

    @property
    def gold_answers(self) -> tuple[tuple[str, ...], ...]:
        return tuple(q.answers for q in self.objectives)
