"""``HFSampler``: the ``Sampler`` protocol over transformers ``generate``.

The reference implementation (what ``VLLMSampler`` is tested against) and the fallback where vLLM is absent.
Semantics, shared with ``VLLMSampler``:

- a generation ends at the first eos token (kept in ``token_ids``) or at the first token whose decoded text
  completes a stop string (kept; ``text`` is cut right after the stop string), else after max_new_tokens;
- temperature 0 is greedy; otherwise plain temperature + top-p sampling (no top-k, no penalties);
- ``logprobs`` are the raw policy's (no temperature or top-p), or with ``logprobs="tempered"`` those of
  softmax(logits / temperature) for a sampled call (greedy calls stay raw), from one float32 forward of prompt +
  generation after sampling, so they equal a plain forward of the same weights by construction.

Under FSDP2 (a sharded policy, ``mempo.lm.sharding``) every forward is a collective, so ranks generate in lock
step: each call pads its prompts with one-token dummy rows to the largest count of any rank (so all run the same
batches) and decodes with transformers' ``synced_gpus`` (a finished rank keeps stepping until every rank is done);
``any_rank`` lets the agent loop keep turning until every rank's rollouts are done.

Departure from vLLM: with a seed, draws are reproducible for the same call (same prompts, n, batch_size), but
the random stream is shared across the batch, so a prompt's samples depend on its batch neighbours.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterable, Iterator, Mapping, Sequence

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase, StoppingCriteria, StoppingCriteriaList

from mempo.lm.logprobs import token_logprobs
from mempo.lm.sharding import any_rank, is_sharded, lockstep_count
from mempo.rollout.sampler import Generation, SamplingConfig


class HFSampler:
    """Generate with a transformers causal LM (usually the policy module itself, so pushes are free).

    batch_size: sequences (prompts x n) per ``generate`` call; None = all at once.
    logprob_chunk_size: positions per chunk of the log-prob forward (see ``token_logprobs``).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        batch_size: int | None = None,
        logprob_chunk_size: int = 256,
        logprobs: str = "raw",
    ) -> None:
        if logprobs not in ("raw", "tempered"):
            raise ValueError(f"sampler.logprobs must be 'raw' or 'tempered', got {logprobs!r}")
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"sampler.batch_size must be >= 1 or None, got {batch_size}")
        if tokenizer.pad_token_id is None:
            raise ValueError("HFSampler needs a tokenizer with a pad token (load_tokenizer sets one)")
        self.model: PreTrainedModel | None = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.logprob_chunk_size = logprob_chunk_size
        self.logprobs = logprobs
        eos = model.generation_config.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        if tokenizer.eos_token_id is not None:
            eos_ids.add(tokenizer.eos_token_id)
        self.eos_token_ids = sorted(eos_ids)

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingConfig) -> list[list[Generation]]:
        """prompts: B lists of prompt token ids -> [B][params.n] generations."""
        model = self._live_model()
        if any(len(p) == 0 for p in prompts):
            raise ValueError("HFSampler.generate: every prompt needs at least one token")
        rows = [list(p) for p in prompts for _ in range(params.n)]  # prompt i's samples are rows i*n .. i*n+n-1
        sharded = is_sharded(model)
        if sharded:  # every rank the same number of rows, hence of batches and forwards
            dummy = [self.eos_token_ids[0] if self.eos_token_ids else self.tokenizer.pad_token_id]
            rows += [dummy] * (lockstep_count(len(rows), model) - len(rows))
        step = self.batch_size or max(len(rows), 1)
        out: list[Generation] = []
        rng = torch.random.fork_rng(devices=[]) if params.seed is not None else contextlib.nullcontext()
        with rng, _eval_mode(model), torch.no_grad():
            if params.seed is not None:
                torch.manual_seed(params.seed)
            for start in range(0, len(rows), step):
                out.extend(self._generate_batch(model, rows[start : start + step], params, synced=sharded))
        return [out[i * params.n : (i + 1) * params.n] for i in range(len(prompts))]

    def push_weights(self, state_dict: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy ``state_dict`` (HF names; a mapping or (name, tensor) pairs) into the model; a no-op copy when it
        is the model's own tensors."""
        model = self._live_model()
        state_dict = dict(state_dict)
        own = model.state_dict()
        if all(k in own and own[k].data_ptr() == v.data_ptr() for k, v in state_dict.items()):
            return  # the sampler shares the policy module: it already has these weights
        missing, unexpected = model.load_state_dict(dict(state_dict), strict=False)
        tied = {"lm_head.weight"} if model.config.tie_word_embeddings else set()
        if unexpected or set(missing) - tied:
            raise KeyError(f"HFSampler.push_weights: missing keys {sorted(missing)}, unexpected {sorted(unexpected)}")

    def any_rank(self, flag: bool) -> bool:
        """Whether ``flag`` holds on any rank (a collective when the policy is sharded, else ``flag``)."""
        return any_rank(flag, self._live_model())

    def sleep(self) -> None:
        """Nothing to release: the model is the caller's."""

    def wake(self) -> None:
        """Nothing to restore."""

    def shutdown(self) -> None:
        """Drop the sampler's reference to the model; later calls raise."""
        self.model = None
        gc.collect()

    def _live_model(self) -> PreTrainedModel:
        if self.model is None:
            raise RuntimeError("HFSampler was shut down")
        return self.model

    def _generate_batch(
        self, model: PreTrainedModel, rows: list[list[int]], params: SamplingConfig, *, synced: bool = False
    ) -> list[Generation]:
        pad = self.tokenizer.pad_token_id
        prompt_len = max(len(r) for r in rows)
        # Left padding: every row's next token is at column prompt_len.
        input_ids = torch.tensor([[pad] * (prompt_len - len(r)) + r for r in rows], device=model.device)
        prompt_mask = torch.tensor([[0] * (prompt_len - len(r)) + [1] * len(r) for r in rows], device=model.device)
        sampling = dict(temperature=params.temperature, top_p=params.top_p) if params.temperature > 0 else {}
        stops = StoppingCriteriaList([_StopOnStrings(self.tokenizer, params.stop, prompt_len)] if params.stop else [])
        sequences = model.generate(
            input_ids=input_ids,
            attention_mask=prompt_mask,
            max_new_tokens=params.max_new_tokens,
            do_sample=params.temperature > 0,
            top_k=0,  # transformers would otherwise default to 50, vLLM to none
            repetition_penalty=1.0,
            num_beams=1,
            eos_token_id=self.eos_token_ids,
            pad_token_id=pad,
            stopping_criteria=stops,
            synced_gpus=synced,
            **sampling,
        )  # [b, prompt_len + L]
        new_tokens = sequences[:, prompt_len:].tolist()
        kept = [self._finish(tokens, params) for tokens in new_tokens]

        lengths = torch.tensor([len(ids) for ids, _ in kept], device=model.device)
        gen_mask = torch.arange(sequences.shape[1] - prompt_len, device=model.device)[None] < lengths[:, None]
        mask = torch.cat([prompt_mask, gen_mask.long()], dim=1)  # [b, prompt_len + L]
        tempered = self.logprobs == "tempered" and params.temperature > 0
        temperature = params.temperature if tempered else 1.0
        logp = token_logprobs(model, sequences, mask, chunk_size=self.logprob_chunk_size, temperature=temperature)
        logp = logp[:, prompt_len:]
        return [
            Generation(
                token_ids=ids,
                logprobs=logp[row, : len(ids)].tolist(),
                text=self._text(ids, params.stop, reason),
                finish_reason=reason,
            )
            for row, (ids, reason) in enumerate(kept)
        ]

    def _finish(self, tokens: list[int], params: SamplingConfig) -> tuple[list[int], str]:
        """Generated tokens (with trailing pads) -> (kept tokens, finish reason)."""
        end, reason = len(tokens), "length"
        eos_at = next((i for i, t in enumerate(tokens) if t in self.eos_token_ids), None)
        if eos_at is not None:
            end, reason = eos_at + 1, "stop"
        stop_end = _first_stop_end(self.tokenizer, tokens[:end], params.stop)
        if stop_end is not None:
            end, reason = stop_end, "stop"
        return tokens[:end], reason

    def _text(self, ids: list[int], stop: tuple[str, ...], reason: str) -> str:
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        if reason == "stop" and stop:
            ends = [text.find(s) + len(s) for s in stop if s in text]
            if ends:
                text = text[: min(ends)]  # as vLLM: the stop string is the end of the text
        return text


class _StopOnStrings(StoppingCriteria):
    """Stops a row once the tail of its generated text contains a stop string (``_finish`` then cuts exactly)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, stop: tuple[str, ...], prompt_len: int) -> None:
        self.tokenizer = tokenizer
        self.stop = stop
        self.prompt_len = prompt_len
        # Every token decodes to at least one character, so this window covers any stop string's tokens.
        self.window = max(len(s) for s in stop) + 8

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: object) -> torch.BoolTensor:
        tails = input_ids[:, max(self.prompt_len, input_ids.shape[1] - self.window) :].tolist()
        texts = self.tokenizer.batch_decode(tails, skip_special_tokens=True)
        done = [any(s in text for s in self.stop) for text in texts]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


def _first_stop_end(tokenizer: PreTrainedTokenizerBase, tokens: list[int], stop: tuple[str, ...]) -> int | None:
    """The smallest k such that decode(tokens[:k]) contains a stop string, or None."""

    def contains(k: int) -> bool:
        text = tokenizer.decode(tokens[:k], skip_special_tokens=True)
        return any(s in text for s in stop)

    if not stop or not contains(len(tokens)):
        return None
    lo, hi = 1, len(tokens)  # contains(hi) holds; once a prefix contains a stop string, longer ones do too
    while lo < hi:
        mid = (lo + hi) // 2
        if contains(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


@contextlib.contextmanager
def _eval_mode(model: PreTrainedModel) -> Iterator[None]:
    """Sample without dropout, then give the module back in the mode the trainer left it."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)
