"""A scripted agent for tests of the loop and of evaluation bookkeeping.

``ScriptedSampler`` answers each prompt with a chosen turn text: a real model cannot be made to write specific
well-formed (or malformed) turns on cue, and what those tests check is the loop and its accounting, not the model.
The real SmolLM2 through vLLM runs the same loop in the slow tests.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from mempo.core.format import format_turn
from mempo.core.tasks import Question, Task
from mempo.rollout.retrievers import Passage
from mempo.rollout.sampler import Generation, SamplingConfig

CORPUS = [
    Passage("1", '"Velorin Oskatu"\nVelorin Oskatu works for Brask Holdings.'),
    Passage("2", '"Brask Holdings"\nBrask Holdings was founded in 1931 in Lisbara.'),
    Passage("3", '"Ometh Works"\nOmeth Works is based in Raitukrum.'),
]
# Two objectives, two searches.
TASK = Task(
    "t0",
    (Question("Who employs Velorin Oskatu?", ("Brask Holdings",)), Question("Where is Ometh Works?", ("Raitukrum",))),
)
# One objective, one search.
TASK_B = Task("t1", (Question("When was Brask Holdings founded?", ("1931",)),))


def oracle_script(text: str) -> str:
    """A correct agent: answers TASK after two searches and TASK_B after one."""
    if "When was Brask" in text:
        if "(Title:" not in text:  # no tool result yet
            return format_turn("Q1: need Brask Holdings.", "search it", "search", "Brask Holdings")
        return format_turn("Q1: 1931.", "done", "answer", "1931")
    if "Ometh Works is based" in text:
        return format_turn("Q1: Brask Holdings. Q2: Raitukrum.", "done", "answer", "Brask Holdings; Raitukrum")
    if "works for Brask" in text:
        return format_turn("Q1: Brask Holdings. Q2: need Ometh Works.", "next Q2", "search", "Ometh Works")
    return format_turn("Q1: need Velorin Oskatu.", "search Q1", "search", "Velorin Oskatu")


class ScriptedSampler:
    """Answers every prompt with ``script(prompt_text)`` tokenized; log-probs are -0.5 per token so tests can
    check they pass through. Records each generate call's batch size, each prompt's text, and each turn's
    (prompt length, generation length)."""

    def __init__(self, tokenizer, script: Callable[[str], str] = oracle_script) -> None:
        self.tokenizer, self.script = tokenizer, script
        self.calls: list[int] = []
        self.prompts: list[str] = []
        self.turns: list[tuple[int, int]] = []

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingConfig) -> list[list[Generation]]:
        self.calls.append(len(prompts))
        out = []
        for p in prompts:
            text = self.tokenizer.decode(list(p))
            self.prompts.append(text)
            ids = self.tokenizer(self.script(text), add_special_tokens=False)["input_ids"]
            self.turns.append((len(p), len(ids)))
            out.append([Generation(token_ids=ids, logprobs=[-0.5] * len(ids), text="")])
        return out

    def push_weights(self, state_dict) -> None:
        for _ in state_dict:  # an engine reads the whole stream (SamplerCallback checks the names it streamed)
            pass

    def sleep(self) -> None: ...
    def wake(self) -> None: ...
    def shutdown(self) -> None: ...
