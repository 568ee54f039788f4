"""A retrieval server that goes down mid-run: the fit stops with a clear error after saving the last completed step,
and ``resume=true`` (server back) continues at the right step. Real local HTTP server, real tiny-model fit."""

import csv
import json

import pytest
import torch

from mempo.core.format import format_turn
from mempo.rollout.retrieval_server import RetrievalServer
from mempo.rollout.retrievers import BM25Retriever, Passage, RetrieverError
from mempo.rollout.sampler import Generation
from mempo.stages.train import fit_rl

PASSAGES = [Passage("0", '"Velorin Oskatu"\nVelorin Oskatu works for Brask Holdings.'), Passage("1", "Ometh\nOmeth.")]


class SearchingSampler:
    """Every turn searches (so every rollout calls the retriever); after ``stop_after`` weight pushes (one per
    finished RL step) it stops ``server``: the next step's first search finds it down."""

    def __init__(self, tokenizer, server: RetrievalServer | None = None, stop_after: int = 1) -> None:
        self.ids = tokenizer(format_turn("need Q1", "search it", "search", "Velorin Oskatu"), add_special_tokens=False)[
            "input_ids"
        ]
        self.server, self.stop_after, self.pushes = server, stop_after, 0

    def generate(self, prompts, params) -> list[list[Generation]]:
        return [[Generation(token_ids=list(self.ids), logprobs=[-0.5] * len(self.ids), text="")] for _ in prompts]

    def push_weights(self, state_dict) -> None:
        for _ in state_dict:  # an engine reads the whole stream (SamplerCallback checks the names it streamed)
            pass
        self.pushes += 1
        if self.server is not None and self.pushes == self.stop_after:
            self.server.stop()

    def sleep(self) -> None: ...
    def wake(self) -> None: ...
    def shutdown(self) -> None: ...


def test_retriever_down_saves_then_stops_and_resume_continues(make_cfg, tmp_path):
    server = RetrievalServer(BM25Retriever(PASSAGES), default_topk=1).start()
    port = int(server.url.split(":")[2].split("/")[0])
    args = [
        "model=tiny", "sampler=hf", "env=http", f"env.url={server.url}", "env.max_retries=2", "env.backoff_s=0.01",
        "env.timeout_s=2", "data.batch_size=2", "data.group_size=2", "agent.max_turns=2", "optim.old_logp=recompute",
        "advantage.estimator=test_signed", "loss.kl_coef=0", "optim.lr=1e-3",
        "sampler.canary_every=0",  # the scripted engine's log-probs are not the policy's: no weight canary
        "ckpt.every_n_steps=5",  # no periodic save before the fault: the checkpoint must come from the fault path
        f"run_dir={tmp_path}",
    ]  # fmt: skip
    cfg = make_cfg(*args, "trainer.max_steps=3")
    try:
        with pytest.raises(RetrieverError) as err:
            fit_rl(cfg, make_sampler=lambda mod: SearchingSampler(mod.tokenizer, server, stop_after=1))
    finally:
        server.stop()
    msg = str(err.value)
    assert "run stopped at step 2" in msg and server.url in msg and "3 attempt(s)" in msg and "resume=true" in msg
    assert "step 1 is saved in" in msg and err.value.url == server.url and err.value.attempts == 3
    ckpt_path = tmp_path / "checkpoints" / "last.ckpt"
    ckpt = torch.load(ckpt_path, weights_only=False)
    assert ckpt["mempo"]["batches_done"] == 1
    assert {int(s["step"]) for s in ckpt["optimizer_states"][0]["state"].values()} == {1}
    assert [int(r["step"]) for r in csv.DictReader((tmp_path / "metrics.csv").open())] == [1]
    assert not (tmp_path / "summary.json").exists()

    with RetrievalServer(BM25Retriever(PASSAGES), port=port, default_topk=1):  # back on the same URL
        module, summary = fit_rl(
            make_cfg(*args, "trainer.max_steps=3", "resume=true"),
            make_sampler=lambda mod: SearchingSampler(mod.tokenizer),
        )
    assert module.batches_done == 3 == summary["steps"] == json.loads((tmp_path / "summary.json").read_text())["steps"]
    assert [int(r["step"]) for r in csv.DictReader((tmp_path / "metrics.csv").open())] == [1, 2, 3]
    assert float(next(csv.DictReader((tmp_path / "metrics.csv").open()))["rollout/turns_mean"]) == 2.0  # searched
    ckpt = torch.load(ckpt_path, weights_only=False)
    assert ckpt["mempo"]["batches_done"] == 3
    assert {int(s["step"]) for s in ckpt["optimizer_states"][0]["state"].values()} == {3}
