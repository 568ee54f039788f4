from __future__ import annotations

import pytest
import torch

from mempo.lm.loading import random_tiny_model
from mempo.rollout.hf_sampler import HFSampler
from mempo.rollout.sampler import Sampler, SamplingConfig


@pytest.fixture
def setup(tiny_policy, prompt_texts):
    model, tokenizer = tiny_policy
    prompts = [tokenizer(t).input_ids for t in prompt_texts]
    return HFSampler(model, tokenizer), model, tokenizer, prompts


def test_is_a_sampler(setup) -> None:
    sampler, *_ = setup
    assert isinstance(sampler, Sampler)


def test_shapes_and_logprobs_match_a_plain_forward(setup, plain_logprobs) -> None:
    sampler, model, _, prompts = setup
    out = sampler.generate(prompts, SamplingConfig(n=3, max_new_tokens=6, temperature=1.0, seed=0))
    assert len(out) == 3 and all(len(samples) == 3 for samples in out)
    for prompt, samples in zip(prompts, out, strict=True):
        for gen in samples:
            assert 1 <= len(gen.token_ids) <= 6 and len(gen.logprobs) == len(gen.token_ids)
            assert gen.finish_reason in ("stop", "length")
            torch.testing.assert_close(torch.tensor(gen.logprobs), plain_logprobs(model, prompt, gen))
        assert len({tuple(g.token_ids) for g in samples}) == 3, "n samples of one prompt should differ"


def test_length_finish(setup) -> None:
    sampler, _, tokenizer, prompts = setup
    out = sampler.generate(prompts, SamplingConfig(n=2, max_new_tokens=5, seed=1))
    gens = [g for samples in out for g in samples]
    assert all(len(g.token_ids) == 5 and g.finish_reason == "length" for g in gens)
    assert all(g.text == tokenizer.decode(g.token_ids, skip_special_tokens=True) for g in gens)


def test_greedy_is_argmax_and_reproducible(setup, greedy_reference) -> None:
    sampler, model, _, prompts = setup
    params = SamplingConfig(n=2, max_new_tokens=8, temperature=0.0)
    first, second = sampler.generate(prompts, params), sampler.generate(prompts, params)
    for prompt, a, b in zip(prompts, first, second, strict=True):
        assert a[0].token_ids == a[1].token_ids == b[0].token_ids == greedy_reference(model, prompt, 8)


def test_tiny_top_p_is_greedy(setup, greedy_reference) -> None:
    sampler, model, _, prompts = setup
    out = sampler.generate(prompts, SamplingConfig(n=2, max_new_tokens=6, temperature=1.0, top_p=1e-6, seed=3))
    for prompt, samples in zip(prompts, out, strict=True):
        assert all(g.token_ids == greedy_reference(model, prompt, 6) for g in samples)


def test_seed_reproducible_and_batching_consistent(setup) -> None:
    sampler, model, tokenizer, prompts = setup
    params = SamplingConfig(n=2, max_new_tokens=6, seed=7)
    a, b = sampler.generate(prompts, params), sampler.generate(prompts, params)
    c = sampler.generate(prompts, SamplingConfig(n=2, max_new_tokens=6, seed=8))
    ids = lambda out: [g.token_ids for samples in out for g in samples]  # noqa: E731
    assert ids(a) == ids(b) and ids(a) != ids(c)
    assert torch.equal(
        torch.tensor([g.logprobs for s in a for g in s]), torch.tensor([g.logprobs for s in b for g in s])
    )

    one_by_one = HFSampler(model, tokenizer, batch_size=1).generate(
        prompts, SamplingConfig(n=2, max_new_tokens=6, temperature=0)
    )
    together = sampler.generate(prompts, SamplingConfig(n=2, max_new_tokens=6, temperature=0))
    assert ids(one_by_one) == ids(together)


def test_stop_strings_end_and_are_included(setup, plain_logprobs) -> None:
    sampler, model, tokenizer, prompts = setup
    stop = ("y", "k", "w")  # each in 4-9% of the vocabulary: most samples stop, after a few tokens
    out = sampler.generate(prompts, SamplingConfig(n=4, max_new_tokens=12, seed=0, stop=stop))
    lengths = []
    for prompt, samples in zip(prompts, out, strict=True):
        for gen in samples:
            full = tokenizer.decode(gen.token_ids, skip_special_tokens=True)
            before = tokenizer.decode(gen.token_ids[:-1], skip_special_tokens=True)
            assert not any(s in before for s in stop), "generation ran past a stop string"
            if gen.finish_reason == "stop" and gen.token_ids[-1] not in sampler.eos_token_ids:
                lengths.append(len(gen.token_ids))
                assert any(s in full for s in stop)
                assert gen.text.endswith(stop) and full.startswith(gen.text)
            torch.testing.assert_close(torch.tensor(gen.logprobs), plain_logprobs(model, prompt, gen))
    assert len(lengths) >= 6 and max(lengths) > 1, "too few stop-string endings for this test to mean anything"


def test_eos_ends_and_is_kept_trailing_pads_dropped(setup) -> None:
    sampler, _, tokenizer, _ = setup
    eos = tokenizer.eos_token_id
    params = SamplingConfig(max_new_tokens=6)
    assert sampler._finish([5, 6, eos, eos, eos], params) == ([5, 6, eos], "stop")
    assert sampler._finish([5, 6, 7, 8, 9, 10], params) == ([5, 6, 7, 8, 9, 10], "length")


def test_push_weights(setup, greedy_reference) -> None:
    sampler, model, tokenizer, prompts = setup
    params = SamplingConfig(max_new_tokens=6, temperature=0.0)
    old = sampler.generate(prompts, params)
    sampler.push_weights(model.state_dict())  # its own tensors: nothing to copy
    assert sampler.generate(prompts, params) == old

    old_weights = {k: v.clone() for k, v in model.state_dict().items()}
    other = random_tiny_model(tokenizer, seed=1)
    new_weights = {k: v for k, v in other.state_dict().items() if k != "lm_head.weight"}  # tied: may be left out
    sampler.push_weights(new_weights)
    new = sampler.generate(prompts, params)
    assert new != old
    for prompt, samples in zip(prompts, new, strict=True):
        assert samples[0].token_ids == greedy_reference(other, prompt, 6)
    sampler.push_weights(old_weights)
    assert sampler.generate(prompts, params) == old
    with pytest.raises(KeyError, match="unexpected"):
        sampler.push_weights({"model.no_such.weight": torch.zeros(1)})


def test_keeps_training_mode_and_shutdown(setup) -> None:
    sampler, model, _, prompts = setup
    model.train()
    sampler.generate(prompts[:1], SamplingConfig(max_new_tokens=2, seed=0))
    assert model.training
    sampler.sleep()
    sampler.wake()
    sampler.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        sampler.generate(prompts, SamplingConfig(max_new_tokens=2))
