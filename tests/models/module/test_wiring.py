"""The wiring between the pinned parts (loss math, masks, parser, log-prob kernel) and the model, each checked
against a value computed here, independently of the code under test: memory rewards and token advantages against
plain float32 forwards, the on-policy ratio, gradient accumulation in float64, the update direction, the KL pull,
and the grouping contract of segmented trajectories.

Regressions these tests catch (each planted by hand on 2026-12-01 and seen to fail the named test, then removed):
- P(ans | q, empty memory) taken as 0 in ``MemPOModule.memory_rewards``
  (``test_memory_rewards_and_advantages_match_plain_forwards``);
- the answer window of ``answer_probabilities`` scored one token early (same test);
- sampler log-probs placed one position late in ``RolloutBatch.to_tensors``
  (``test_on_policy_step_has_ratio_one_and_nothing_clipped``).
"""

from __future__ import annotations

import math
from typing import Any

import lightning as L
import pytest
import torch
from replay import replay_batch
from scripted import ScriptedSampler, oracle_script
from torch.testing import assert_close

from mempo.losses import AGG_MODES, AdvantageConfig, AdvantageInputs, MemoryConfig, register_advantage
from mempo.rollout.agent import RolloutBatch
from mempo.rollout.hf_sampler import HFSampler
from mempo.stages.builders import build_module
from mempo.stages.train import fit_rl

TINY = ["model=tiny", "sampler=hf", "sampler.max_new_tokens=12", "ckpt.every_n_steps=1", "trainer.precision=32-true"]

# Three tasks; rollouts of one task end after different numbers of turns (a segmented batch), rewards mixed.
SEGMENTED = [(0, 1.0, None), (0, 0.0, 1), (0, 0.0, 2), (1, 1.0, 2), (1, 0.0, None), (2, 0.0, 1), (2, 0.0, 2)]


# ------------------------------------------------------------------------------------------------- references
def plain_answer_probability(model: torch.nn.Module, prompt: list[int], answer: list[int]) -> float:
    """P(ans | prompt): one unpadded float32 forward over prompt + answer, full log-softmax, geometric mean of the
    answer tokens' probabilities (docs/algorithm.md §3.2, Eq. 4)."""
    ids = torch.tensor([prompt + answer])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()  # [P + A, V]
    logp = logits[len(prompt) - 1 : -1].log_softmax(-1).gather(-1, torch.tensor(answer)[:, None])  # [A, 1]
    return math.exp(float(logp.mean()))


def zscores(values: list[float]) -> list[float]:
    """(v - mean) / (unbiased std + 1e-6), 0 for a group of one or of equal values."""
    n = len(values)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / max(n - 1, 1))
    return [(v - mean) / (std + 1e-6) for v in values]


def reference_memory_rewards(module: Any, batch: RolloutBatch, baseline: str) -> tuple[list[float], list[float]]:
    """(P(ans | q, m) [N], R^M [N]) of every turn sample, by plain forwards and Eq. 5's baselines
    (docs/algorithm.md §3)."""
    builder, policy = module.builder, module.policy
    p, r = [], []
    for traj in batch.trajectories:
        q, gold = traj.task.question, traj.task.gold
        p_empty = plain_answer_probability(policy, builder.scoring_prompt(q, ""), builder.answer_ids(gold))
        previous = p_empty  # the first turn's epsilon under previous_memory
        for s in traj.turns:
            prompt = builder.scoring_prompt(q, s.parsed.memory)
            p_mem = plain_answer_probability(policy, prompt, builder.answer_ids(gold))
            eps = {"previous_memory": previous, "question_only": p_empty, "none": 0.0}[baseline]
            p.append(p_mem)
            r.append(p_mem - eps)
            previous = p_mem
    return p, r


# --------------------------------------------------------------------------------------------- memory rewards
@pytest.mark.parametrize("baseline", ["previous_memory", "question_only", "none"])
def test_memory_rewards_and_advantages_match_plain_forwards(make_cfg, baseline):
    cfg = make_cfg("model=tiny", f"memory.baseline={baseline}", "optim.micro_batch_size=3")
    module, _ = build_module(cfg)
    batch = replay_batch(module.tokenizer, cfg, SEGMENTED)
    samples = batch.samples
    assert all(s.parsed.ok and s.parsed.memory for s in samples)
    p_ref, r_ref = reference_memory_rewards(module, batch, baseline)
    if baseline != "none":  # the baseline matters here: the check below could tell a wrong epsilon from a right one
        assert max(abs(a - b) for a, b in zip(r_ref, p_ref)) > 1e-2 * max(p_ref)

    mem_r, valid, p_mem = module.memory_rewards(batch)
    assert valid.all()
    # The random tiny model's P(ans | q, m) are far below the default atol (1e-5) of float32: compare log P, and
    # R^M in units of the largest P, so the default tolerances are relative to the values' own scale.
    scale = max(p_ref)
    assert_close(p_mem.log(), torch.tensor(p_ref).log())
    assert_close(mem_r / scale, torch.tensor(r_ref) / scale)

    # Token advantages (Eq. 9): A^T of the trajectory on every response token, plus alpha * A^M on <mem> tokens,
    # both z-scored within the task, each trajectory counted once for A^T.
    x = batch.to_tensors(module.pad_id)
    adv = module.advantages(x, mem_r, valid)
    trajs = batch.trajectories
    a_traj = {}
    for g in {t.group_id for t in trajs}:
        members = [t for t in trajs if t.group_id == g]
        a_traj.update(zip((t.traj_id for t in members), zscores([t.reward for t in members])))
    a_mem = [0.0] * len(samples)
    for g in {s.group_id for s in samples}:
        idx = [i for i, s in enumerate(samples) if s.group_id == g]
        for i, z in zip(idx, zscores([r_ref[i] for i in idx])):
            a_mem[i] = z
    expected = torch.zeros_like(adv)
    for i, s in enumerate(samples):
        p = len(s.prompt_ids)
        for k in range(len(s.response_ids)):
            expected[i, p + k] = a_traj[s.traj_id] + (a_mem[i] if s.mem_mask[k] else 0.0)
    assert_close(adv, expected)
    assert not adv[~x.response_mask].any()  # prompt and padding carry no advantage


# ------------------------------------------------------------------------------------------- on-policy ratio
def test_on_policy_step_has_ratio_one_and_nothing_clipped(make_cfg, tmp_path):
    """float32, one PPO epoch, old log-probs from the HF sampler: the first pass's policy is the behaviour policy,
    so every token's ratio is exactly 1 and none is clipped, whatever the advantages."""
    cfg = make_cfg(
        *TINY, "data.batch_size=2", "data.group_size=3", "agent.max_turns=2", "advantage.estimator=test_signed",
        "optim.old_logp=sampler", "optim.ppo_epochs=1", "loss.eps_low=0.01", "loss.eps_high=0.01",
        "trainer.max_steps=2", "optim.lr=1e-3", f"run_dir={tmp_path}",
    )  # fmt: skip
    module, _ = fit_rl(cfg)
    m = module.last_metrics
    assert m["perf/response_tokens"] > 20
    assert m["perf/rss_gb"] > 0.1  # the process holds at least the tiny model and torch
    assert_close(torch.tensor(m["train/ratio_mean"]), torch.tensor(1.0))
    assert m["train/clip_frac"] == 0.0


# ---------------------------------------------------------------------------------------------- accumulation
class Float64AndGrads(L.Callback):
    """Turns policy and reference into float64 before the optimizer is built, and records every parameter's
    gradient (after clipping) at each optimizer step."""

    def __init__(self) -> None:
        self.grads: list[dict[str, torch.Tensor]] = []
        self.norms: list[float] = []

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        pl_module.policy.double()
        if pl_module.reference is not None:
            pl_module.reference.double()

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        grads = {k: p.grad.detach().clone() for k, p in pl_module.policy.named_parameters() if p.grad is not None}
        self.grads.append(grads)
        self.norms.append(float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads.values()]))))


def _accumulation_run(make_cfg, tmp_path, agg: str, micro_batch_size: int) -> tuple[Float64AndGrads, Any]:
    cfg = make_cfg(
        *TINY, "data.batch_size=1", "data.group_size=3", "agent.max_turns=3", "advantage.estimator=test_signed",
        "optim.old_logp=recompute", "optim.ppo_epochs=2", "optim.lr=1e-2", "optim.grad_clip=0.1",
        "loss.kl_coef=0.1", "loss.eps_low=0.05", "loss.eps_high=0.05", f"loss.agg={agg}", "trainer.max_steps=1",
        f"optim.micro_batch_size={micro_batch_size}", f"run_dir={tmp_path / f'{agg}-{micro_batch_size}'}",
        "sampler.canary_every=0",  # the scripted engine's log-probs are not the policy's: no weight canary
    )  # fmt: skip
    hook = Float64AndGrads()
    module, _ = fit_rl(cfg, make_sampler=lambda mod: ScriptedSampler(mod.tokenizer, oracle_script), callbacks=[hook])
    return hook, module


@pytest.mark.parametrize("agg", AGG_MODES)
def test_micro_batches_of_one_give_the_full_batch_gradients(make_cfg, tmp_path, agg):
    """Two PPO epochs over multi-turn rollouts (scripted searches: 3 turns each), gradients clipped at 0.1:
    micro-batches of one turn sample (every trajectory split across micro-batches) reproduce the gradients of one
    micro-batch holding the whole batch, at both epochs, in float64."""
    whole, module = _accumulation_run(make_cfg, tmp_path, agg, 64)
    split, _ = _accumulation_run(make_cfg, tmp_path, agg, 1)
    assert len(whole.grads) == len(split.grads) == 2  # one optimizer step per epoch
    assert all(g.dtype == torch.float64 for g in whole.grads[0].values())
    assert module.last_metrics["perf/samples"] == 9  # 3 rollouts x 3 turns
    assert module.last_metrics["train/grad_norm"] > 0.1 >= whole.norms[-1] - 1e-9  # the clip was active
    for a, b in zip(whole.grads, split.grads):
        assert a.keys() == b.keys()
        for k in a:
            assert_close(b[k], a[k], msg=k)


# ---------------------------------------------------------------------------------------- update direction, KL
@register_advantage("test_zero", needs_memory_scores=True)  # memories scored, as for MemPO
def _zero_advantage(x: AdvantageInputs, memory: MemoryConfig, advantage: AdvantageConfig) -> torch.Tensor:
    """Test estimator: no policy-gradient signal at all (only the KL term moves the policy)."""
    return torch.zeros(x.response_mask.shape)


class Recording:
    """The real HF sampler, recording every (prompt, generation) it returns."""

    def __init__(self, inner: HFSampler) -> None:
        self.inner = inner
        self.seen: list[tuple[list[int], Any]] = []

    def generate(self, prompts, params):
        out = self.inner.generate(prompts, params)
        self.seen += [(list(p), g[0]) for p, g in zip(prompts, out)]
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _recording_fit(cfg: Any, callbacks: tuple = ()) -> tuple[Any, Recording]:
    holder: list[Recording] = []

    def make(mod: Any) -> Recording:
        holder.append(Recording(HFSampler(mod.policy, mod.tokenizer, logprobs=cfg.sampler.logprobs)))
        return holder[0]

    module, _ = fit_rl(cfg, make_sampler=make, callbacks=list(callbacks))
    return module, holder[0]


def test_one_step_raises_positive_and_lowers_negative_advantage_rollouts(make_cfg, tmp_path, plain_logprobs):
    cfg = make_cfg(
        *TINY, "data.batch_size=2", "data.group_size=4", "agent.max_turns=1", "advantage.estimator=test_signed",
        "loss.kl_coef=0", "optim.lr=1e-4", "trainer.max_steps=1", f"run_dir={tmp_path}",
    )  # fmt: skip
    module, rec = _recording_fit(cfg)
    rollouts = rec.seen[:8]  # one turn per rollout: rollout i is the i-th generation (the weight canary's follow)
    assert len({tuple(g.token_ids) for _, g in rollouts}) == 8
    temperature = cfg.sampler.temperature  # sampler.logprobs=tempered: the sampler's log-probs are at T
    assert cfg.sampler.logprobs == "tempered"
    for traj_id, (prompt, gen) in enumerate(rollouts):
        ids = torch.tensor([prompt + gen.token_ids])
        with torch.no_grad():
            logits = module.policy(input_ids=ids).logits[0].float()[len(prompt) - 1 : -1] / temperature
        after = logits.log_softmax(-1).gather(-1, ids[0, len(prompt) :, None]).squeeze(-1)
        delta = float(after.sum() - torch.tensor(gen.logprobs).sum())
        # test_signed: +1 on even rollouts, -1 on odd ones
        assert (delta > 0) == (traj_id % 2 == 0), f"rollout {traj_id}: log-prob moved by {delta:+.3g}"


def _sampled_kl(policy: torch.nn.Module, reference: torch.nn.Module, seen: list, plain_logprobs: Any) -> float:
    """Mean k3 estimate of KL(policy || reference) on the sampled tokens, r - 1 - log r with r = p_ref / p, from
    plain forwards: what the KL term of the loss sees."""
    values = []
    for prompt, gen in seen:
        log_r = plain_logprobs(reference, prompt, gen) - plain_logprobs(policy, prompt, gen)  # [L]
        values.append(log_r.exp() - 1 - log_r)
    return float(torch.cat(values).mean())


class Perturb(L.Callback):
    """Moves the policy away from the reference before the first step, and keeps a copy of where it started."""

    def __init__(self) -> None:
        self.start: dict[str, torch.Tensor] = {}

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in pl_module.policy.parameters():
                p.add_(0.01 * torch.randn(p.shape, generator=gen))
        self.start = {k: v.clone() for k, v in pl_module.policy.state_dict().items()}


def test_kl_term_alone_pulls_the_policy_toward_the_reference(make_cfg, tmp_path, plain_logprobs):
    cfg = make_cfg(
        *TINY, "data.batch_size=1", "data.group_size=4", "agent.max_turns=1", "advantage.estimator=test_zero",
        "loss.kl_coef=1.0", "optim.lr=1e-4", "trainer.max_steps=1", f"run_dir={tmp_path}",
    )  # fmt: skip
    perturb = Perturb()
    module, rec = _recording_fit(cfg, callbacks=(perturb,))
    rollouts = rec.seen[:4]
    after = _sampled_kl(module.policy, module.reference, rollouts, plain_logprobs)
    module.policy.load_state_dict(perturb.start)
    before = _sampled_kl(module.policy, module.reference, rollouts, plain_logprobs)
    assert before > 0.01
    assert after < 0.9 * before


# ---------------------------------------------------------------------------------------------- grouping
def test_segmented_trajectories_count_once_and_groups_follow_the_task(make_cfg):
    """GRPO on a batch whose rollouts have 1 to 5 turns: A^T is the z-score over the task's rollouts (each counted
    once, not once per turn), every turn of a rollout carries it, and the grouping follows the task, not the
    position of the rollout in the batch."""
    cfg = make_cfg("model=tiny", "advantage.estimator=grpo")
    module, _ = build_module(cfg)

    def advantages_by_rollout(spec: list[tuple[int, float, int | None]]) -> dict[tuple, float]:
        batch = replay_batch(module.tokenizer, cfg, spec)
        x = batch.to_tensors(module.pad_id)
        n = len(batch.samples)
        adv = module.advantages(x, torch.zeros(n), torch.zeros(n, dtype=torch.bool))
        out = {}
        for i, s in enumerate(batch.samples):
            values = adv[i][x.response_mask[i]]
            assert_close(values, values[:1].expand_as(values))  # one value on every token of the turn
            key = spec[s.traj_id]  # the entries of SEGMENTED are distinct
            out.setdefault(key, float(values[0]))
            assert out[key] == float(values[0])  # every turn of a rollout carries its rollout's advantage
        return out

    turns = [len(t.turns) for t in replay_batch(module.tokenizer, cfg, SEGMENTED).trajectories]
    assert len(set(turns)) >= 3  # really segmented: 1, 2 and more turns per rollout
    contiguous = advantages_by_rollout(SEGMENTED)
    for (task, reward, _), a in contiguous.items():
        rewards = [r for t, r, _ in SEGMENTED if t == task]
        assert_close(torch.tensor(a), torch.tensor(zscores(rewards)[rewards.index(reward)]))
    interleaved = [SEGMENTED[i] for i in (0, 3, 5, 1, 4, 6, 2)]  # rollouts of one task no longer adjacent
    assert advantages_by_rollout(interleaved).keys() == contiguous.keys()
    for k, a in advantages_by_rollout(interleaved).items():
        assert_close(torch.tensor(a), torch.tensor(contiguous[k]))
