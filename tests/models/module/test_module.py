"""MemPOModule end to end on the tiny model through the HF sampler (fast), and the advantage switches on one batch."""

import csv
import json

import pytest
import torch
from replay import oracle_batch, replay_batch
from torch.testing import assert_close

from mempo.losses import AdvantageConfig, AdvantageInputs, MemoryConfig, register_advantage
from mempo.stages.builders import build_module, build_tasks
from mempo.stages.train import fit_rl

SMOKE = [
    "model=tiny",
    "sampler=hf",
    "data.batch_size=2",
    "data.group_size=2",
    "agent.max_turns=2",
    "sampler.max_new_tokens=12",
    "optim.lr=1e-3",
    "loss.kl_coef=0.01",
    "ckpt.every_n_steps=1",
]


def _credit_steps(path):
    return [json.loads(line)["step"] for line in path.read_text().splitlines()] if path.exists() else []


def _params(module):
    return {k: v.detach().clone() for k, v in module.named_parameters()}


def test_two_step_fit_moves_the_policy_not_the_reference(make_cfg, tmp_path):
    cfg = make_cfg(*SMOKE, "advantage.estimator=test_signed", "trainer.max_steps=2", f"run_dir={tmp_path}")
    initial, _ = build_module(cfg)
    before_policy, before_ref = _params(initial.policy), _params(initial.reference)
    module, summary = fit_rl(cfg)
    after_policy, after_ref = _params(module.policy), _params(module.reference)
    assert summary["steps"] == 2 == module.batches_done
    assert any(not torch.equal(before_policy[k], after_policy[k]) for k in before_policy)
    for k in before_ref:
        assert torch.equal(before_ref[k], after_ref[k]), f"reference parameter {k} changed"
    rows = list(csv.DictReader((tmp_path / "metrics.csv").open()))
    assert [int(r["step"]) for r in rows] == [1, 2]
    for key in (
        "train/loss", "train/clip_frac", "train/kl", "train/grad_norm", "rollout/reward_mean", "rollout/format_ok",
        "rollout/turns_mean", "memory/p_ans_mean", "memory/adv_std", "memory/tokens_mean", "perf/gen_tok_per_s",
        "perf/generate_s", "perf/score_s", "perf/logp_s", "perf/update_s", "perf/push_s",
    ):  # fmt: skip
        assert key in rows[0], key
    assert float(rows[1]["train/kl"]) > 0  # the policy moved away from the reference after step 1
    for key in ("memory/adv_share", "memory/adv_corr", "memory/complete_frac", "rollout/early_answer_rate"):
        assert key in rows[0], key
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == 2
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()
    assert (tmp_path / "hf" / "config.json").is_file()


def test_resume_continues_at_the_same_step_with_the_same_data(make_cfg, tmp_path):
    """Parameters after 3 uninterrupted steps equal those after 2 steps, a resume and 1 step. Warmup is on, so a
    scheduler restarted from scratch would change step 3's learning rate; test_signed gives nonzero advantages
    (a random model's rewards are all 0: GRPO alone would give no gradient, and equal parameters would prove
    nothing)."""
    base = [*SMOKE, "advantage.estimator=test_signed", "agent.max_turns=1", "optim.warmup_steps=5"]
    straight, _ = fit_rl(make_cfg(*base, "trainer.max_steps=3", f"run_dir={tmp_path / 'straight'}"))
    first, _ = fit_rl(make_cfg(*base, "trainer.max_steps=2", f"run_dir={tmp_path / 'split'}"))
    assert first.batches_done == 2
    after_two = _params(first.policy)
    credit = tmp_path / "split" / "memory_credit.jsonl"
    with credit.open("a") as f:  # a step-3 record written after the checkpoint, before a crash
        f.write(json.dumps({"step": 3, "memory": "stale"}) + "\n")
    resumed, _ = fit_rl(make_cfg(*base, "trainer.max_steps=3", "resume=true", f"run_dir={tmp_path / 'split'}"))
    assert resumed.batches_done == 3
    assert resumed.last_task_ids == straight.last_task_ids  # batch 3 is the same batch
    assert resumed.last_metrics["train/lr"] == straight.last_metrics["train/lr"] < 1e-3  # still warming up
    assert any(not torch.equal(after_two[k], v) for k, v in _params(resumed.policy).items())  # step 3 moved it
    for k, v in _params(straight.policy).items():
        assert_close(_params(resumed.policy)[k], v, msg=k)
    rows = list(csv.DictReader((tmp_path / "split" / "metrics.csv").open()))
    assert [int(r["step"]) for r in rows] == [1, 2, 3]  # appended, no duplicated or missing step
    assert "stale" not in credit.read_text()  # MemoryCreditFile dropped the record of the step after the checkpoint
    assert _credit_steps(credit) == _credit_steps(tmp_path / "straight" / "memory_credit.jsonl")
    ckpt = torch.load(tmp_path / "split" / "checkpoints" / "last.ckpt", weights_only=False)
    assert ckpt["mempo"]["batches_done"] == 3
    adam_steps = {int(s["step"]) for s in ckpt["optimizer_states"][0]["state"].values()}
    assert adam_steps == {3}  # optimizer state carried over the restart (a fresh one would count 1)


def test_ablation_nomem_gives_exactly_the_grpo_advantages(make_cfg):
    nomem, _ = build_module(make_cfg("model=tiny", "+exp=ablation_nomem"))
    grpo, _ = build_module(make_cfg("model=tiny", "advantage.estimator=grpo"))
    mempo, _ = build_module(make_cfg("model=tiny"))
    batch = oracle_batch(mempo, make_cfg("model=tiny"), rewards=[1.0, 0.0])
    assert all(s.parsed.ok for s in batch.samples) and any(any(s.mem_mask) for s in batch.samples)
    x = batch.to_tensors(mempo.pad_id)
    mem_r, valid, p_mem = mempo.memory_rewards(batch)
    assert valid.all() and ((p_mem > 0) & (p_mem < 1)).all()
    a_nomem = nomem.advantages(x, mem_r, valid)
    a_grpo = grpo.advantages(x, mem_r, valid)
    a_mempo = mempo.advantages(x, mem_r, valid)
    assert torch.equal(a_nomem, a_grpo)
    assert_close(a_grpo[x.response_mask].abs(), torch.full_like(a_grpo[x.response_mask], 1 / (2**0.5 + 1e-6)))
    on_mem = x.mem_mask & x.response_mask
    assert not torch.equal(a_mempo[on_mem], a_grpo[on_mem])  # the memory advantage is really on in MemPO
    assert torch.equal(a_mempo[~on_mem], a_grpo[~on_mem])
    # Without the memory advantage the scoring forward is skipped, and the advantages do not change.
    assert mempo.uses_memory_rewards and not nomem.uses_memory_rewards and not grpo.uses_memory_rewards
    zero_r, zero_valid, zero_p = nomem.memory_rewards(batch)
    assert not zero_r.any() and not zero_p.any()  # no scoring forward ran
    assert torch.equal(zero_valid, valid)
    assert torch.equal(nomem.advantages(x, zero_r, zero_valid), a_nomem)


def test_memory_credit_records_line_up_with_the_token_advantages(make_cfg):
    """Each record's A^M and A^T, read back from the [N, T] advantages the update uses (A^T on every response token,
    A^T + alpha * A^M on memory tokens), so a record attached to the wrong sample or trajectory fails. Rollouts 1
    and 3 stop after 2 and 1 of the oracle's turns (of 3 or more) but say they answered: answered early."""
    cfg = make_cfg("model=tiny", "memory.alpha=0.5", "memory.normalize=per_turn", "memory.std_floor=0.05")
    module, _ = build_module(cfg)
    batch = replay_batch(module.tokenizer, cfg, [(0, 1.0, None), (0, 0.0, 2), (1, 0.5, None), (1, 0.0, 1)])
    x = batch.to_tensors(module.pad_id)
    mem_r, valid, p_mem = module.memory_rewards(batch)
    adv = module.advantages(x, mem_r, valid)
    metrics = module.memory_credit(batch, x, adv, mem_r, valid, p_mem)
    records = module.last_credit
    assert len(records) == int(valid.sum()) == len(batch.samples)  # every oracle turn writes a memory
    index = {(s.traj_id, s.turn_id): i for i, s in enumerate(batch.samples)}
    for r in records:
        i = index[(r["rollout"], r["turn"])]
        resp, mem = x.response_mask[i], x.mem_mask[i] & x.response_mask[i]
        assert_close(adv[i][resp & ~mem], torch.full_like(adv[i][resp & ~mem], r["traj_adv"]))
        assert_close(adv[i][mem], torch.full_like(adv[i][mem], r["traj_adv"] + 0.5 * r["mem_adv"]))
        assert r["p_ans"] == float(p_mem[i]) and r["traj_reward"] == batch.trajectories[r["rollout"]].reward
        assert r["complete"] == (r["action"].startswith("answer"))  # only the oracle's last memory holds both
    on_mem = (x.mem_mask & x.response_mask).bool()
    assert_close(metrics["memory/adv_share"], float(adv[on_mem].abs().sum() / adv[x.response_mask].abs().sum()))
    assert metrics["rollout/early_answer_rate"] == 0.5
    assert metrics["memory/complete_frac"] == 2 / len(records)


@pytest.mark.parametrize("baseline", ["previous_memory", "question_only", "none"])
def test_memory_rewards_follow_the_baseline_switch(make_cfg, baseline):
    module, _ = build_module(make_cfg("model=tiny", f"memory.baseline={baseline}"))
    batch = oracle_batch(module, make_cfg("model=tiny"), rewards=[1.0, 0.0])
    mem_r, valid, p_mem = module.memory_rewards(batch)
    turns = torch.tensor([s.turn_id for s in batch.samples])
    first = turns == 1
    if baseline == "none":
        assert_close(mem_r, p_mem)
    elif baseline == "previous_memory":
        later = ~first
        prev = torch.tensor([p_mem[i - 1] for i in range(len(turns)) if later[i]])
        assert_close(mem_r[later], p_mem[later] - prev)
    else:
        assert_close(mem_r[first], mem_r[first][:1].expand(int(first.sum())) * 0 + mem_r[first][0])
        assert_close(p_mem - mem_r, (p_mem - mem_r)[:1].expand(len(p_mem)))  # one eps per task


@register_advantage("test_nan", needs_memory_scores=True)  # memories scored, as for MemPO
def _nan_advantage(x: AdvantageInputs, memory: MemoryConfig, advantage: AdvantageConfig) -> torch.Tensor:
    """Test estimator: a NaN advantage on every token (a numerics fault injected into the loss)."""
    return torch.full(x.response_mask.shape, float("nan"))


def test_non_finite_gradients_skip_the_step_then_stop_the_run(make_cfg, tmp_path):
    cfg = make_cfg(
        *SMOKE, "advantage.estimator=test_nan", "trainer.max_steps=5", "optim.max_nonfinite=2", "agent.max_turns=1",
        f"run_dir={tmp_path}",
    )  # fmt: skip
    initial, _ = build_module(cfg)
    before = _params(initial.policy)
    with pytest.raises(FloatingPointError, match="non-finite loss or gradient in 2 steps in a row"):
        fit_rl(cfg)
    # The run stopped before any corrupted update reached the weights it exports or checkpoints.
    assert not (tmp_path / "hf").exists()
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    for k, v in before.items():
        torch.testing.assert_close(
            ckpt["state_dict"][f"policy.{k}"], v, rtol=0, atol=0
        )  # bit-identical: no step was taken
    rows = list(csv.DictReader((tmp_path / "metrics.csv").open()))
    assert [int(r["step"]) for r in rows] == [1]  # step 1 was skipped and logged; step 2 raised
    assert float(rows[0]["train/skipped_steps"]) == 1.0


def test_rollout_samples_outside_the_trainers_autocast(make_cfg):
    """Regression: with trainer.precision=bf16-mixed, training_step runs under bf16 autocast, and the rollout inside
    it sampled (and scored its sampler log-probs) in bf16 too, so the "old" log-probs were not the fp32 behaviour
    policy's. The rollout now runs with autocast disabled."""
    from mempo.lm.logprobs import token_logprobs
    from mempo.rollout.hf_sampler import HFSampler

    module, _ = build_module(make_cfg("model=tiny", "agent.max_turns=1", "sampler.max_new_tokens=8"))
    module.sampler = HFSampler(module.policy, module.tokenizer)
    tasks = build_tasks(make_cfg("model=tiny"), "train")[:2]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        batch = module.rollout(tasks)
    for s in batch.samples:
        ids = torch.tensor([s.prompt_ids + s.response_ids])
        with torch.no_grad():
            ref = token_logprobs(module.policy, ids, torch.ones_like(ids, dtype=torch.bool))[0, len(s.prompt_ids) :]
        assert_close(torch.tensor(s.sampler_logp), ref)


@pytest.mark.parametrize("skip", [True, False])
def test_a_step_without_signal_leaves_the_weights_alone(make_cfg, tmp_path, skip):
    """Step 1 has signal (test_signed); before step 2 the estimator becomes GRPO, whose advantages on the tiny random
    model are all 0 (every reward is 0), and there is no KL term. With optim.skip_no_signal step 2 must leave every
    weight bit-identical; without it AdamW's first moment alone moves them (the drift that collapsed a CPU run)."""
    from dataclasses import replace

    from lightning.pytorch.callbacks import Callback

    class ZeroAfterFirst(Callback):
        after_one: dict = {}

        def on_train_batch_end(self, trainer, module, *args) -> None:
            if module.batches_done == 1:
                ZeroAfterFirst.after_one = _params(module.policy)
                module.advantage_cfg = replace(module.advantage_cfg, estimator="grpo")
                module.memory_cfg = replace(module.memory_cfg, alpha=0.0)

    cfg = make_cfg(
        *SMOKE, "advantage.estimator=test_signed", "loss.kl_coef=0", "agent.max_turns=1", "trainer.max_steps=2",
        # without skip_zero_adv_rows every row of the no-signal step is computed (its gradient is exactly 0)
        f"optim.skip_no_signal={skip}", f"optim.skip_zero_adv_rows={skip}", f"run_dir={tmp_path}",
    )  # fmt: skip
    module, summary = fit_rl(cfg, callbacks=[ZeroAfterFirst()])
    assert summary["steps"] == 2 == module.trainer.global_step  # the skipped step still counts as an RL step
    rows = list(csv.DictReader((tmp_path / "metrics.csv").open()))
    assert [float(r["train/no_signal"]) for r in rows] == [0.0, 1.0 if skip else 0.0]
    assert float(rows[1]["rollout/reward_mean"]) == 0.0
    after_two = _params(module.policy)
    if skip:
        for k, v in ZeroAfterFirst.after_one.items():
            torch.testing.assert_close(after_two[k], v, rtol=0, atol=0, msg=k)  # bit-identical: no update
    else:
        assert any(not torch.equal(after_two[k], v) for k, v in ZeroAfterFirst.after_one.items())


@pytest.mark.parametrize("skip_rows", [True, False])
def test_without_skip_no_signal_a_no_signal_step_is_adams_step_on_a_zero_gradient(make_cfg, tmp_path, skip_rows):
    """``optim.skip_no_signal=false`` says: update on a step without signal too. Under ``skip_zero_adv_rows`` (the
    default) such a step left every row out, so one process ran no backward, every gradient stayed None and AdamW
    moved nothing, while under DDP/FSDP the idle rank's zero-weighted backward made AdamW move the weights with its
    moments: the two diverged. Now both: step 2's weights are AdamW's step on a zero gradient from step 1's state,
    computed here by hand (p -= lr / (1 - b1^2) * b1 m / (sqrt(b2 v / (1 - b2^2)) + eps), weight decay 0)."""
    from dataclasses import replace

    from lightning.pytorch.callbacks import Callback

    class ZeroAfterFirst(Callback):
        after_one: dict = {}
        state: dict = {}

        def on_train_batch_end(self, trainer, module, *args) -> None:
            if module.batches_done == 1:
                ZeroAfterFirst.after_one = _params(module.policy)
                opt = trainer.optimizers[0]
                ZeroAfterFirst.state = {
                    n: {k: v.detach().clone() for k, v in opt.state[p].items()}
                    for n, p in module.policy.named_parameters()
                    if opt.state.get(p)
                }
                module.advantage_cfg = replace(module.advantage_cfg, estimator="grpo")
                module.memory_cfg = replace(module.memory_cfg, alpha=0.0)

    cfg = make_cfg(
        *SMOKE, "advantage.estimator=test_signed", "loss.kl_coef=0", "agent.max_turns=1", "trainer.max_steps=2",
        "optim.skip_no_signal=false", f"optim.skip_zero_adv_rows={skip_rows}", f"run_dir={tmp_path}",
    )  # fmt: skip
    module, _ = fit_rl(cfg, callbacks=[ZeroAfterFirst()])
    rows = list(csv.DictReader((tmp_path / "metrics.csv").open()))
    assert [float(r["train/no_signal"]) for r in rows] == [0.0, 0.0]
    assert float(rows[1]["rollout/reward_mean"]) == 0.0 and float(rows[1]["train/grad_norm"]) == 0.0
    b1, b2, eps, lr = 0.9, 0.999, 1e-8, cfg.optim.lr  # torch.optim.AdamW's defaults; configure_optimizers sets lr
    assert ZeroAfterFirst.state and all(float(st["step"]) == 1 for st in ZeroAfterFirst.state.values())
    after_two = _params(module.policy)
    for name, p1 in ZeroAfterFirst.after_one.items():
        st = ZeroAfterFirst.state.get(name)
        if st is None:  # no gradient at step 1: no AdamW state, nothing to move
            assert_close(after_two[name], p1, rtol=0, atol=0, msg=name)
            continue
        m, v = b1 * st["exp_avg"].double(), b2 * st["exp_avg_sq"].double()
        want = p1.double() - lr / (1 - b1**2) * m / ((v / (1 - b2**2)).sqrt() + eps)
        assert_close(after_two[name], want.float(), msg=lambda text, name=name: f"{name}: {text}")
    assert any(not torch.equal(after_two[k], v) for k, v in ZeroAfterFirst.after_one.items())


def test_train_top_layers_updates_only_the_last_layers(make_cfg, tmp_path):
    """model.train_top_layers=1 on the 2-layer tiny model: after two RL steps with signal the last layer and the final
    norm moved, while the embeddings (and so the tied head) and layer 0 are bit-identical; AdamW holds only the
    trainable tensors."""
    cfg = make_cfg(
        *SMOKE, "advantage.estimator=test_signed", "loss.kl_coef=0", "trainer.max_steps=2",
        "model.train_top_layers=1", f"run_dir={tmp_path}",
    )  # fmt: skip
    initial, _ = build_module(cfg)
    before = _params(initial.policy)
    module, _ = fit_rl(cfg)
    after = _params(module.policy)
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert moved, "nothing trained"
    assert all(k.startswith(("model.layers.1.", "model.norm.")) for k in moved), sorted(moved)
    assert any(k.startswith("model.layers.1.") for k in moved)
    trainable = [p for p in module.policy.parameters() if p.requires_grad]
    held = [p for group in module.optimizers().optimizer.param_groups for p in group["params"]]
    assert len(held) == len(trainable) == sum(1 for k in before if k.startswith(("model.layers.1.", "model.norm.")))


@pytest.mark.parametrize("k", [0, 3])
def test_train_top_layers_outside_the_model_is_an_error(make_cfg, k):
    cfg = make_cfg(*SMOKE, f"model.train_top_layers={k}")
    with pytest.raises(ValueError, match=r"model.train_top_layers must be null or in \[1, 2\]"):
        build_module(cfg)


def test_require_traj_signal_reaches_the_update(make_cfg):
    """memory.require_traj_signal from the config: task 1's two rollouts have equal rewards (0.5, 0.5), so its
    samples carry no advantage at all with the gate, while without it their memory tokens carry A^M; task 0 (1, 0)
    is the same either way."""
    rollouts = [(0, 1.0, None), (0, 0.0, 2), (1, 0.5, None), (1, 0.5, 1)]
    adv = {}
    for gate in (False, True):
        cfg = make_cfg("model=tiny", f"memory.require_traj_signal={str(gate).lower()}")
        module, _ = build_module(cfg)
        batch = replay_batch(module.tokenizer, cfg, rollouts)
        x = batch.to_tensors(module.pad_id)
        mem_r, valid, _ = module.memory_rewards(batch)
        adv[gate] = module.advantages(x, mem_r, valid)
    task1 = torch.tensor([batch.trajectories[s.traj_id].group_id == 1 for s in batch.samples])
    assert adv[False][task1].abs().sum() > 0  # A^M on task 1's memory tokens without the gate
    assert_close(adv[True][task1], torch.zeros_like(adv[True][task1]))
    assert_close(adv[True][~task1], adv[False][~task1])
