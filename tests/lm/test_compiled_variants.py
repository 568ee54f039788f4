"""Every variant of the compiled decoder layers compiles (``mempo.lm.compiled.RECOMPILE_LIMIT``): frozen, first
trainable and trainable layers, with and without gradients, with a padding mask or none, one row or several. Under
dynamo's default limit of 8 graphs per code object the later variants ran eager from about RL step 5 of a run
(planted: the limit left at 8 -> dynamo's hard failure below).

Dynamo's guards, not the backend, decide what recompiles, so the layers compile with the ``eager`` backend here
(seconds, not inductor's minutes)."""

from __future__ import annotations

import functools

import pytest
import torch
from transformers import LlamaForCausalLM

from mempo.lm.compiled import CompiledLayers
from mempo.lm.loading import tiny_config
from mempo.lm.logprobs import token_logprobs


def test_every_variant_of_a_partly_trained_model_compiles(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_config(300, num_hidden_layers=4, pad_token_id=0)).train()
    model.requires_grad_(False)
    for layer in model.model.layers[2:]:  # the top 2 of 4 train, as model.train_top_layers does
        layer.requires_grad_(True)
    compiled = CompiledLayers(model)
    before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True), compiled.active():
        for rows in (3, 1):
            for padded in (True, False):
                ids = torch.randint(1, 300, (rows, 12))
                mask = torch.ones_like(ids)
                if padded:
                    mask[0, :3] = 0
                token_logprobs(model, ids, mask).sum().backward()
                with torch.no_grad():
                    token_logprobs(model, ids, mask)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"] - before
    assert graphs > 8  # the variants outnumber dynamo's default limit: the test would fail under it
    torch._dynamo.reset()
