from __future__ import annotations

import pytest
import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint
from transformers import PreTrainedModel

from mempo.lm.logprobs import head_logprobs, token_logprobs, token_logprobs_and_entropy


def naive_logprobs(model: PreTrainedModel, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
    """The textbook version: full [N, T, V] float32 log-softmax, then gather. Same masking convention."""
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    logsm = logits[:, :-1].log_softmax(-1)  # [N, T-1, V]
    logp = logsm.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    entropy = -(logsm.exp() * logsm).sum(-1)
    scored = (attention_mask[:, 1:] * attention_mask[:, :-1]).bool()
    pad = torch.nn.functional.pad
    return pad(logp * scored, (1, 0)), pad(entropy * scored, (1, 0))


def batch(seed: int = 0) -> tuple[Tensor, Tensor]:
    """3 rows of 12 tokens: full, right-padded (7 real), left-padded (5 real)."""
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, 49152, (3, 12), generator=gen)
    attention_mask = torch.ones(3, 12, dtype=torch.long)
    attention_mask[1, 7:] = 0
    attention_mask[2, :7] = 0
    input_ids[attention_mask == 0] = 2  # pad id; must not influence anything
    return input_ids, attention_mask


@pytest.mark.parametrize("chunk_size", [1, 5, 1024])
def test_chunked_equals_naive(tiny_policy, chunk_size: int) -> None:
    model, _ = tiny_policy
    input_ids, attention_mask = batch()
    with torch.no_grad():
        logp, entropy = token_logprobs_and_entropy(model, input_ids, attention_mask, chunk_size=chunk_size)
        ref_logp, ref_entropy = naive_logprobs(model, input_ids, attention_mask)
    assert logp.shape == (3, 12) and logp.dtype == torch.float32
    torch.testing.assert_close(logp, ref_logp)
    torch.testing.assert_close(entropy, ref_entropy)


@pytest.mark.parametrize("chunk_size", [1, 5, 1024])
def test_chunked_gradients_equal_naive(tiny_policy, chunk_size: int) -> None:
    """In float64: in float32 the two orders of summing the embedding gradient differ by roundoff (1e-5
    relative to its largest entry), which says nothing about the chunking; float64 shows the math agrees."""
    model, _ = tiny_policy
    model.double()
    input_ids, attention_mask = batch()

    logp, entropy = token_logprobs_and_entropy(model, input_ids, attention_mask, chunk_size=chunk_size)
    (logp.sum() + 0.1 * entropy.sum()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()

    ref_logp, ref_entropy = naive_logprobs(model, input_ids, attention_mask)
    (ref_logp.sum() + 0.1 * ref_entropy.sum()).backward()

    torch.testing.assert_close(logp, ref_logp)
    torch.testing.assert_close(entropy, ref_entropy)
    assert all(p.grad.abs().max() > 0 for p in model.parameters())
    for name, param in model.named_parameters():
        torch.testing.assert_close(grads[name], param.grad, msg=name)


def test_padding_does_not_change_real_tokens(tiny_policy) -> None:
    """Each padded row scores its real tokens exactly as the row alone would, on either padding side."""
    model, _ = tiny_policy
    input_ids, attention_mask = batch()
    with torch.no_grad():
        logp = token_logprobs(model, input_ids, attention_mask)
        for row in range(3):
            real = attention_mask[row].bool()
            alone = token_logprobs(model, input_ids[row, real][None], torch.ones(1, int(real.sum())))
            torch.testing.assert_close(logp[row, real], alone[0])
    assert (logp[attention_mask == 0] == 0).all()
    assert logp[0, 0] == 0 and logp[2, 7] == 0  # nothing precedes a row's first real token
    assert (logp[attention_mask.bool() & (torch.arange(12) > 0) & (torch.arange(12) != 7)] < 0).all()


def test_temperature_scales_logits(tiny_policy) -> None:
    model, _ = tiny_policy
    input_ids, attention_mask = batch(1)
    with torch.no_grad():
        hot = token_logprobs(model, input_ids, attention_mask, temperature=2.0)
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
        expected = (logits[:, :-1] / 2.0).log_softmax(-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    scored = (attention_mask[:, 1:] * attention_mask[:, :-1]).bool()
    torch.testing.assert_close(hot[:, 1:][scored], expected[scored])


def test_no_grad_needs_no_graph(tiny_policy) -> None:
    model, _ = tiny_policy
    input_ids, attention_mask = batch()
    with torch.no_grad():
        logp = token_logprobs(model, input_ids, attention_mask, chunk_size=4)
    assert not logp.requires_grad


def test_bad_input_is_refused(tiny_policy) -> None:
    model, _ = tiny_policy
    input_ids, attention_mask = batch()
    with pytest.raises(ValueError, match="must both be"):
        token_logprobs(model, input_ids, attention_mask[:, :5])
    with pytest.raises(ValueError, match="chunk_size"):
        token_logprobs(model, input_ids, attention_mask, chunk_size=0)
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(model, input_ids, attention_mask, temperature=0.0)


def test_head_never_sees_more_than_a_chunk(tiny_policy) -> None:
    """The [rows, V] logits exist one chunk at a time, in forward and in the recomputing backward."""
    model, _ = tiny_policy
    input_ids, attention_mask = batch()
    rows_seen: list[int] = []
    hook = model.get_output_embeddings().register_forward_hook(lambda m, i, out: rows_seen.append(out.shape[0]))
    try:
        token_logprobs(model, input_ids, attention_mask, chunk_size=4).sum().backward()
    finally:
        hook.remove()
    scored = int((attention_mask[:, 1:] * attention_mask[:, :-1]).sum())  # 11 + 6 + 4 = 21 scored tokens
    assert max(rows_seen) == 4
    assert sum(rows_seen) == 2 * scored  # once in forward, once recomputed in backward


def test_score_mask_scores_only_its_positions(tiny_policy) -> None:
    """A response mask: the same log-probs (and gradients) where scored, 0 elsewhere, and the head runs only
    over the scored positions."""
    model, _ = tiny_policy
    input_ids, attention_mask = batch()
    score_mask = torch.zeros_like(attention_mask, dtype=torch.bool)
    score_mask[0, 6:] = True  # the "response" of each row: its last real tokens
    score_mask[1, 4:7] = True
    score_mask[2, 9:] = True
    rows_seen: list[int] = []
    hook = model.get_output_embeddings().register_forward_hook(lambda m, i, out: rows_seen.append(out.shape[0]))
    try:
        with torch.no_grad():
            masked = token_logprobs(model, input_ids, attention_mask, score_mask=score_mask)
    finally:
        hook.remove()
    with torch.no_grad():
        full = token_logprobs(model, input_ids, attention_mask)
    torch.testing.assert_close(masked[score_mask], full[score_mask])
    assert (masked[~score_mask] == 0).all()
    assert sum(rows_seen) == int(score_mask.sum()) == 12

    masked = token_logprobs(model, input_ids, attention_mask, score_mask=score_mask)
    masked.sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    (token_logprobs(model, input_ids, attention_mask) * score_mask).sum().backward()
    for name, param in model.named_parameters():
        torch.testing.assert_close(grads[name], param.grad, msg=name)
    model.zero_grad()
    with pytest.raises(ValueError, match="score_mask"):
        token_logprobs(model, input_ids, attention_mask, score_mask=score_mask[:, :5])


def checkpointed_head_logprobs(head: torch.nn.Linear, h: Tensor, y: Tensor, temperature: float, chunk: int) -> Tensor:
    """The head's log-probs as autograd computes them through a checkpoint per chunk: the path the fused backward
    replaces (``LinearHeadLogProb``), written out here."""

    def chunk_logp(hc: Tensor, yc: Tensor) -> Tensor:
        x = head(hc)
        x = x.to(torch.promote_types(x.dtype, torch.float32))
        if temperature != 1.0:
            x = x / temperature
        return x.gather(-1, yc[:, None]).squeeze(-1) - x.logsumexp(-1)

    parts = [
        checkpoint(chunk_logp, h[i : i + chunk], y[i : i + chunk], use_reentrant=False) for i in range(0, len(h), chunk)
    ]
    return torch.cat(parts)


@pytest.mark.parametrize("autocast", [False, "cached", "uncached"])  # uncached: Lightning's (cache_enabled=False)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize(("head_trains", "bias"), [(False, False), (True, False), (True, True)])
def test_the_fused_head_backward_is_the_checkpointed_one_bit_for_bit(autocast, temperature, head_trains, bias) -> None:
    gen = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(48, 500, bias=bias)
    head.requires_grad_(head_trains)
    h0 = torch.randn(37, 48, generator=gen)
    y = torch.randint(0, 500, (37,), generator=gen)
    weights = torch.randn(37, generator=gen)  # a loss with signed per-token weights, as an advantage gives
    results = []
    for fused in (True, False):
        head.zero_grad()
        h = h0.clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bool(autocast), cache_enabled=autocast == "cached"):
            if fused:
                logp, _ = head_logprobs(head, h, y, chunk_size=16, temperature=temperature, fused=True)
            else:
                logp = checkpointed_head_logprobs(head, h, y, temperature, chunk=16)
            (weights * logp).sum().backward()
        grads = [p.grad.clone() for p in head.parameters() if p.requires_grad]
        results.append((logp.detach(), h.grad, *grads))
    assert len(results[0]) == 2 + head_trains * (1 + bias)
    for fused_value, checkpointed_value in zip(*results, strict=True):
        assert torch.equal(fused_value, checkpointed_value)


@pytest.mark.parametrize("autocast", [False, "cached", "uncached"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("bias", [False, True])
def test_a_frozen_head_s_gradient_computed_in_forward_is_the_recomputed_one(autocast, temperature, bias) -> None:
    """grad_in_forward against the checkpointed path (autograd's own backward) and against float64 autograd: the same
    log-probs bit for bit, the same hidden-state gradient up to the matmul dtype's rounding."""
    gen = torch.Generator().manual_seed(1)
    head = torch.nn.Linear(48, 500, bias=bias).requires_grad_(False)
    h0 = torch.randn(37, 48, generator=gen)
    y = torch.randint(0, 500, (37,), generator=gen)
    weights = torch.randn(37, generator=gen)
    out = {}
    for path in ("in_forward", "checkpointed"):
        h = h0.clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bool(autocast), cache_enabled=autocast == "cached"):
            if path == "in_forward":
                logp, _ = head_logprobs(head, h, y, chunk_size=16, temperature=temperature, grad_in_forward=True)
            else:
                logp = checkpointed_head_logprobs(head, h, y, temperature, chunk=16)
            (weights * logp).sum().backward()
        out[path] = (logp.detach(), h.grad)
    assert torch.equal(out["in_forward"][0], out["checkpointed"][0])
    head64 = torch.nn.Linear(48, 500, bias=bias).double().requires_grad_(False)
    head64.load_state_dict({k: v.double() for k, v in head.state_dict().items()})
    h64 = h0.double().requires_grad_(True)
    (weights.double() * (head64(h64) / temperature).log_softmax(-1).gather(-1, y[:, None]).squeeze(-1)).sum().backward()
    exact = h64.grad.float()
    if autocast:  # bf16 matmuls: both paths round the gradient to bf16 (8 bits of mantissa), in another order
        tol = {"rtol": 1.6e-2, "atol": 2e-3}
        torch.testing.assert_close(out["in_forward"][1], out["checkpointed"][1], **tol)
        err_new = (out["in_forward"][1] - exact).abs().max()
        err_old = (out["checkpointed"][1] - exact).abs().max()
        assert err_new <= 2 * err_old, (err_new, err_old)
    else:
        torch.testing.assert_close(out["in_forward"][1], out["checkpointed"][1])
        torch.testing.assert_close(out["in_forward"][1], exact)


def test_the_gradient_in_forward_refuses_a_trained_head() -> None:
    head = torch.nn.Linear(8, 20)
    h = torch.randn(4, 8, requires_grad=True)
    with pytest.raises(ValueError, match="frozen output head"):
        head_logprobs(head, h, torch.zeros(4, dtype=torch.long), grad_in_forward=True)


def test_token_logprobs_with_the_head_gradient_in_forward_trains_the_decoder_alike(tiny_policy) -> None:
    """Through the whole model (tied, frozen embeddings and head; the decoder trains): the same log-probs and the
    same decoder gradients. In float64: in float32 the gradient's two orders of rounding (the per-row weight before or
    after the head's matmul) differ by 1e-5 relative to the largest entry, which says nothing about the math."""
    model, _ = tiny_policy
    model.double().get_input_embeddings().requires_grad_(False)
    input_ids, attention_mask = batch()
    weights = torch.randn(3, 12, generator=torch.Generator().manual_seed(2))
    grads = []
    for in_forward in (True, False):
        model.zero_grad()
        logp = token_logprobs(model, input_ids, attention_mask, chunk_size=5, head_grad_in_forward=in_forward)
        (weights * logp).sum().backward()
        grads.append((logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}))
    assert torch.equal(grads[0][0], grads[1][0])
    assert grads[0][1].keys() == grads[1][1].keys() and len(grads[0][1]) > 0
    for name in grads[0][1]:
        torch.testing.assert_close(grads[0][1][name], grads[1][1][name], msg=name)
