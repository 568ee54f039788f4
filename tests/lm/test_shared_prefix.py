"""``mempo.lm.shared_prefix``: a micro-batch whose rows begin with the same tokens, those tokens computed once. The
repacked layout is checked against the original one position by position (which token, which position id, which
keys a query reads), and the log-probs and gradients against the unshared forward's."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters
from transformers import LlamaConfig, LlamaForCausalLM

from mempo.lm.compiled import CompiledLayers
from mempo.lm.logprobs import token_logprobs
from mempo.lm.shared_prefix import (
    common_prefix_len,
    computed_positions,
    shared_prefix_attention,
    shared_prefix_layout,
    unpack,
)


def batch(lengths: list[int], prefix: int, seed: int = 0, vocab: int = 101) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded rows of ``lengths`` whose first ``prefix`` tokens agree (and, by chance, rarely one more)."""
    g = torch.Generator().manual_seed(seed)
    head = torch.randint(1, vocab, (prefix,), generator=g)
    ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    mask = torch.zeros_like(ids, dtype=torch.bool)
    for i, n in enumerate(lengths):
        ids[i, :prefix] = head
        ids[i, prefix:n] = torch.randint(1, vocab, (n - prefix,), generator=g)
        ids[i, prefix] = (head[0] + i) % (vocab - 1) + 1  # the rows part right after the prefix
        mask[i, :n] = True
    return ids, mask


def tiny_llama(dtype: torch.dtype = torch.float32, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=101, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=True, attn_implementation="sdpa")  # fmt: skip
    return LlamaForCausalLM(cfg).to(dtype).train()


def test_the_repacked_rows_hold_every_original_token_position_and_context() -> None:
    ids, mask = batch([30, 25, 22, 19, 14], prefix=12)
    layout = shared_prefix_layout(ids, mask)
    assert layout is not None and layout.prefix_len == 12
    n, t = ids.shape
    t2 = layout.input_ids.shape[1]
    assert t2 == 30 - 12 and layout.computed == 6 * 18 < n * t
    assert computed_positions(ids, mask, True) == 6 * 18 and computed_positions(ids, mask, False) == n * t
    real = mask.bool()
    tokens = unpack(layout.input_ids[..., None].float(), layout, n, t)[..., 0].long()
    assert torch.equal(tokens[real], ids[real])
    positions = unpack(layout.position_ids[..., None].float(), layout, n, t)[..., 0].long()
    assert torch.equal(positions[real], torch.arange(t).expand(n, t)[real])
    # Which original positions each query reads: key column c < p is row 0's position c; own column k is position k
    # in row 0 and p + k elsewhere. Every real query must read exactly the positions up to its own, no more.
    p = layout.prefix_len
    for i in range(n):
        for j in range(int(mask[i].sum())):
            row, col = (0, j) if j < p else (i + 1, j - p)
            seen = layout.mask[row, 0, col]
            own = torch.nonzero(seen[p:]).flatten() + (0 if row == 0 else p)
            read = sorted(torch.nonzero(seen[:p]).flatten().tolist() + own.tolist())
            assert read == list(range(j + 1)), (i, j)


@pytest.mark.parametrize(
    ("lengths", "prefix", "why"),
    [
        ([30], 12, "one row"),
        ([30, 25], 4, "a prefix shorter than MIN_PREFIX"),
        ([40, 12], 11, "the repacked rows would be as long as the original ones"),
    ],
)
def test_no_repacking_where_it_would_not_compute_fewer_positions(lengths, prefix, why) -> None:
    ids, mask = batch(lengths, prefix)
    assert shared_prefix_layout(ids, mask) is None, why
    assert computed_positions(ids, mask, True) == ids.numel()


def test_a_prefix_longer_than_half_the_rows_is_shared_up_to_half() -> None:
    ids, mask = batch([40, 40, 38], prefix=30)  # rows of 10 own tokens after 30 shared: 4 x 30 > 3 x 40
    layout = shared_prefix_layout(ids, mask)
    assert layout is not None and layout.prefix_len == 20 and layout.computed == 4 * 20
    assert computed_positions(ids, mask, True) == 4 * 20


def test_left_padding_is_not_repacked() -> None:
    ids, mask = batch([20, 20, 20], prefix=12)
    mask[0, :3] = False  # row 0 left-padded
    assert shared_prefix_layout(ids, mask) is None
    assert common_prefix_len(ids, mask) == 0  # its first positions are not real tokens in every row


def grads_of(model: torch.nn.Module, ids, mask, score, *, shared: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad()
    logp = token_logprobs(model, ids, mask, score_mask=score, shared_prefix=shared)
    w = torch.randn(logp.shape, generator=torch.Generator().manual_seed(1), dtype=logp.dtype)
    (logp * w).sum().backward()
    return logp.detach(), [p.grad.clone() for p in model.parameters()]


def assert_same(got: tuple, want: tuple, *, rtol: float, scale: float) -> None:
    """The prefix's gradient is one sum over rows instead of N separate ones: the same terms added in another order.
    Gradient entries near 0 carry absolute rounding of the largest terms, hence an atol relative to each tensor's
    largest entry."""
    torch.testing.assert_close(got[0], want[0], rtol=rtol, atol=scale)
    for g, w in zip(got[1], want[1]):
        torch.testing.assert_close(g, w, rtol=rtol, atol=scale * float(w.abs().max()))


def test_logprobs_and_gradients_are_the_unshared_forwards() -> None:
    model = tiny_llama(torch.float64)
    ids, mask = batch([30, 25, 22, 19, 14], prefix=12)
    score = mask.clone()
    score[:, :10] = False  # some scored positions inside the prefix too (a hidden state of row 0)
    want = grads_of(model, ids, mask, score, shared=False)
    got = grads_of(model, ids, mask, score, shared=True)
    # float64, but transformers' RMSNorm computes in float32 whatever the model's dtype: float32 rounding.
    assert_same(got, want, rtol=1e-6, scale=1e-6)
    assert float(want[0].abs().sum()) > 0


def test_a_compiled_forward_repacks_without_recompiling_per_layer_or_batch() -> None:
    model = tiny_llama()
    compiled = CompiledLayers(model)
    counters.clear()
    for seed, lengths, prefix in ((0, [30, 25, 22, 19, 14], 12), (1, [40, 33, 31], 20)):
        ids, mask = batch(lengths, prefix, seed=seed)
        want = grads_of(model, ids, mask, mask, shared=False)
        with compiled.active():
            got = grads_of(model, ids, mask, mask, shared=True)
        assert_same(got, want, rtol=1.3e-6, scale=1e-5)  # float32, fused kernels: float32 rounding
    # One graph for the repacked layers (every layer, both batches) and one for the plain call the first batch of a
    # dynamic-shape compile may take: not one per layer (3) or per batch.
    assert counters["stats"]["unique_graphs"] <= 2


def test_with_the_switch_held_a_batch_not_repacked_is_plain_sdpa_bit_for_bit() -> None:
    """The RL update holds the switch across its whole pass, so micro-batches that are not repacked (here: left
    padding) run under it too."""
    model = tiny_llama()
    ids, mask = batch([20, 20, 16], prefix=12)
    ids, mask = ids.flip(1), mask.flip(1)  # left padding: not repacked
    want = token_logprobs(model, ids, mask)
    with shared_prefix_attention(model):
        got = token_logprobs(model, ids, mask, shared_prefix=True)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_gradient_checkpointing_needs_the_switch_held_across_the_backward() -> None:
    model = tiny_llama()
    ids, mask = batch([30, 25, 22, 19, 14], prefix=12)
    want = grads_of(model, ids, mask, mask, shared=False)
    model.gradient_checkpointing_enable()
    with pytest.raises(ValueError, match="hold mempo.lm.shared_prefix.shared_prefix_attention"):
        grads_of(model, ids, mask, mask, shared=True)
    with shared_prefix_attention(model):  # as the RL update holds it: the layers' recompute in backward repacks too
        got = grads_of(model, ids, mask, mask, shared=True)
    assert_same(got, want, rtol=1.3e-6, scale=1e-5)
