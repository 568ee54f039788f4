"""The trainer side of a weight push: the names streamed are the policy's state-dict keys (``check_streamed_names``),
checked on every push ``SamplerCallback`` makes."""

from __future__ import annotations

import pytest
import torch

from mempo.models.callbacks import SamplerCallback, check_streamed_names

STATE = {"model.embed_tokens.weight": 0, "model.norm.weight": 0, "lm_head.weight": 0}


def test_the_streamed_names_must_be_the_state_dict_keys() -> None:
    check_streamed_names(list(STATE), STATE, tied=False)
    check_streamed_names(["model.embed_tokens.weight", "model.norm.weight"], STATE, tied=True)  # tied head left out
    with pytest.raises(RuntimeError, match=r"missing \['lm_head\.weight'\]"):
        check_streamed_names(["model.embed_tokens.weight", "model.norm.weight"], STATE, tied=False)
    with pytest.raises(RuntimeError, match=r"unexpected \['model\.layers\.0\.base_layer\.weight'\]"):
        check_streamed_names([*STATE, "model.layers.0.base_layer.weight"], STATE, tied=False)
    with pytest.raises(RuntimeError, match=r"streamed twice \['model\.norm\.weight'\]"):
        check_streamed_names([*STATE, "model.norm.weight"], STATE, tied=False)


class DroppingSampler:
    """An engine whose push consumes the stream and loses nothing, fed by a policy whose gather drops a tensor."""

    def __init__(self) -> None:
        self.got: dict[str, torch.Tensor] = {}

    def push_weights(self, pairs) -> None:
        self.got = dict(pairs)


def test_a_push_whose_stream_lost_a_tensor_stops(monkeypatch: pytest.MonkeyPatch) -> None:
    from mempo.models import callbacks

    policy = torch.nn.Linear(2, 2)
    policy.config = type("Config", (), {"tie_word_embeddings": False})()
    module = type("Module", (), {"policy": policy})()
    cb = SamplerCallback(lambda m: DroppingSampler())
    cb.sampler = DroppingSampler()
    cb._push(module)  # the whole state dict: fine
    assert set(cb.sampler.got) == {"weight", "bias"}
    real = callbacks.full_tensors
    monkeypatch.setattr(callbacks, "full_tensors", lambda state: ((k, v) for k, v in real(state) if k != "bias"))
    with pytest.raises(RuntimeError, match=r"missing \['bias'\]"):
        cb._push(module)
