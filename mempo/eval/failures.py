"""Where a memory agent fails on the synthetic world: one verdict per objective, read off the trajectory's turns
against the objective's reasoning chain (``SyntheticQuestion.hops``).

Verdicts, in the order a chain is followed (the first step that went wrong names the failure):
- ``correct``            the objective's answer is an exact match;
- ``format``             the rollout ended on a malformed turn or an overlong context before this objective
                         was answered (its facts may have been fine);
- ``wrong_query``        a hop's entity was never searched, although what the hop needs was known;
- ``fact_not_carried``   a hop's passage was searched, but no later memory holds the fact it states;
- ``memory_lost``        every fact reached a memory, but the last memory before the end no longer holds the
                         objective's answer;
- ``wrong_answer``       the last memory holds the answer, the final answer does not;
- ``no_answer``          the facts were all kept but the agent never answered (max turns).
"Holds" and "searched" are case-insensitive substring tests on the text (the entity name in the query, the
hop's answer in the memory).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from mempo.data.synthetic import SyntheticQuestion
from mempo.rollout.agent import Trajectory

VERDICTS = (
    "correct",
    "format",
    "wrong_query",
    "fact_not_carried",
    "memory_lost",
    "wrong_answer",
    "no_answer",
)


def _has(text: str | None, needle: str) -> bool:
    return bool(text) and needle.lower() in text.lower()


def objective_verdict(traj: Trajectory, index: int, chain: SyntheticQuestion) -> str:
    """The verdict (``VERDICTS``) for objective ``index`` (0-based) of ``traj``."""
    if traj.scores and traj.scores[index][0] >= 1.0:
        return "correct"
    turns = traj.turns
    searches = [(k, t.parsed.argument) for k, t in enumerate(turns) if t.parsed.ok and t.parsed.action == "search"]
    memories = [(k, t.parsed.memory) for k, t in enumerate(turns) if t.parsed.memory]
    for hop in chain.hops:
        searched = [k for k, q in searches if _has(q, hop.entity)]
        if not searched:
            return "format" if not traj.format_ok else "wrong_query"
        # The memory written at turn k + 1 is the first to see what turn k's search returned.
        if not any(k > searched[0] and _has(m, hop.answer) for k, m in memories):
            return "format" if not traj.format_ok else "fact_not_carried"
    if not traj.format_ok:
        return "format"
    last_memory = memories[-1][1] if memories else ""
    if not any(_has(last_memory, a) for a in chain.question.answers):
        return "memory_lost"
    if traj.finish != "answer":
        return "no_answer"
    return "wrong_answer"


def failure_tally(trajectories: Sequence[Trajectory], chains: Mapping[str, SyntheticQuestion]) -> Counter[str]:
    """Verdict counts over every objective of every trajectory; ``chains`` maps a question's qid to its chain."""
    tally: Counter[str] = Counter({v: 0 for v in VERDICTS})
    for traj in trajectories:
        for i, q in enumerate(traj.task.objectives):
            if q.qid not in chains:
                raise KeyError(f"task {traj.task.task_id!r}: no reasoning chain for question {q.qid!r}")
            tally[objective_verdict(traj, i, chains[q.qid])] += 1
    return tally
