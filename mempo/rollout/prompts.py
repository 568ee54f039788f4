"""One prompt builder for training, evaluation and memory scoring (docs/algorithm.md §1).

The instructions a model sees are the same in every phase: the paper's readers describe a terse training prompt
beside a detailed evaluation prompt, which this module avoids by construction.

Memory context (MemPO), turn t:  system + question [+ <mem>m_{t-1}</mem> + <information>i_{t-1}</information>]
Full-history context (ReAct):    system + question + every earlier turn and tool result, appended.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mempo.core.format import Tags, wrap

# Short on purpose: every turn of every phase re-reads it (a 124-token version was 43% of a typical memory
# prompt); the warm start teaches the format, the text only names it.
SYSTEM_TEMPLATE = (
    "Answer by searching. Each turn: <{mem}> facts found and what is still needed </{mem}> <{think}> next step "
    "</{think}> then <{search}> query </{search}> or <{answer}> final answer </{answer}>. Search results come in "
    "<{information}>. Your memory is all you keep of earlier turns. Answer several questions in order, separated "
    "by ';'."
)
SCORING_INSTRUCTION = "Give the final answer now."


@dataclass(frozen=True)
class TurnContext:
    """What a rollout's next prompt is built from."""

    question: str
    memory: str | None = None  # the memory written last turn (None before the first turn)
    information: str | None = None  # the tool result of the last turn, already wrapped in <information>
    previous_turn: str | None = None  # the last turn's text (memory mode keeps it only with keep_previous_turn)
    history: tuple[tuple[str, str], ...] = ()  # full-history mode: (turn text, tool result) of every earlier turn


class PromptBuilder:
    """Renders contexts with the tokenizer's chat template and returns prompt token ids."""

    def __init__(self, tokenizer: Any, tags: Tags = Tags()) -> None:
        self.tokenizer = tokenizer
        self.tags = tags
        self.system = SYSTEM_TEMPLATE.format(
            mem=tags.mem, think=tags.think, search=tags.search, answer=tags.answer, information=tags.information
        )

    def _render(self, messages: list[dict[str, str]]) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def memory_prompt(self, ctx: TurnContext, *, keep_previous_turn: bool = False) -> list[int]:
        """Context reset: only the question, the last memory and the last tool result (and, with
        ``keep_previous_turn``, the last turn's text)."""
        parts = [f"Question:\n{ctx.question}"]
        if ctx.memory is not None:
            parts.append(wrap(self.tags.mem, f" {ctx.memory} "))
        if keep_previous_turn and ctx.previous_turn is not None:
            parts.append(f"Your previous turn:\n{ctx.previous_turn}")
        if ctx.information is not None:
            parts.append(ctx.information)
        return self._render(
            [{"role": "system", "content": self.system}, {"role": "user", "content": "\n\n".join(parts)}]
        )

    def full_history_prompt(self, ctx: TurnContext) -> list[int]:
        """ReAct-style: every earlier turn and tool result stays in context."""
        messages = [
            {"role": "system", "content": self.system},
            {"role": "user", "content": f"Question:\n{ctx.question}"},
        ]
        for turn_text, info in ctx.history:
            messages += [{"role": "assistant", "content": turn_text}, {"role": "user", "content": info}]
        return self._render(messages)

    def prompt(self, ctx: TurnContext, context: str, *, keep_previous_turn: bool = False) -> list[int]:
        """The prompt of the next turn; ``context`` is agent.context (memory | full_history)."""
        if context == "memory":
            return self.memory_prompt(ctx, keep_previous_turn=keep_previous_turn)
        if context == "full_history":
            return self.full_history_prompt(ctx)
        raise ValueError(f"agent.context must be 'memory' or 'full_history', got {context!r}")

    def scoring_prompt(self, question: str, memory: str, *, instruction: bool = True) -> list[int]:
        """The memory-scoring context of Eq. 4: only q and m, then the opening of an answer; the gold answer is
        teacher-forced after it (see ``answer_ids``). ``instruction`` false leaves out "Give the final answer now."
        (``memory.scoring_context=no_instruction``)."""
        user = f"Question:\n{question}\n\n{wrap(self.tags.mem, f' {memory} ')}"
        if instruction:
            user += f"\n\n{SCORING_INSTRUCTION}"
        ids = self._render([{"role": "system", "content": self.system}, {"role": "user", "content": user}])
        return ids + list(self.tokenizer(f"<{self.tags.answer}>", add_special_tokens=False)["input_ids"])

    def answer_ids(self, gold: str) -> list[int]:
        """Token ids of the teacher-forced gold answer (all objectives joined by "; ")."""
        return list(self.tokenizer(f" {gold}", add_special_tokens=False)["input_ids"])

    def answer_objective_ids(self, gold: str) -> list[int]:
        """For each token of ``answer_ids(gold)``, the index of the objective whose answer it spells (the gold
        split at "; "), or -1 for a token of no objective's answer (the separators). Needs a fast tokenizer (its
        offsets mapping)."""
        if not getattr(self.tokenizer, "is_fast", False):
            raise ValueError("memory.scoring=per_objective needs a fast tokenizer (offsets mapping)")
        text = f" {gold}"
        enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        spans, start = [], 1
        for part in gold.split("; "):
            spans.append((start, start + len(part)))
            start += len(part) + 2
        out = []
        for lo, hi in enc["offset_mapping"]:
            hit = [k for k, (a, b) in enumerate(spans) if lo < b and hi > a and text[max(lo, a) : min(hi, b)].strip()]
            out.append(hit[0] if hit else -1)
        return out
