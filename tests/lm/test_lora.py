"""LoRA (``model.lora``, ``mempo.lm.lora``) against values computed independently: the base model loaded on its own,
peft's own ``merge_and_unload``, parameter counts from the layers' shapes, a straight run against a stopped and resumed
one; planted bugs (a peft name leaked into the push) fail before the engine sees them. The vLLM push and the
two-process runs are in tests/lm/test_lora_slow.py."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
import torch
from torch import nn

pytest.importorskip("peft")

from mempo.lm import lora  # noqa: E402
from mempo.lm.loading import ModelConfig, load_policy  # noqa: E402
from mempo.lm.logprobs import token_logprobs  # noqa: E402
from mempo.lm.lora import LoRAConfig, adapter_disabled, apply_lora, base_names, merged_tensors  # noqa: E402
from mempo.models.callbacks import SamplerCallback  # noqa: E402
from mempo.stages.builders import check_lora_run, trainable_policy  # noqa: E402
from mempo.stages.train import fit_rl  # noqa: E402

RANK = 4
RUN = [
    "model=tiny", "model.lora.rank=4", "sampler=hf", "data.batch_size=1", "data.group_size=2", "agent.max_turns=1",
    "sampler.max_new_tokens=8", "advantage.estimator=test_signed", "loss.kl_coef=0.1", "optim.lr=1e-2",
    "ckpt.every_n_steps=1", "eval.every_n_steps=0",
]  # fmt: skip


def _ids() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, 2000, (2, 16), generator=torch.Generator().manual_seed(0))
    return ids, torch.ones_like(ids)


def _perturbed(tiny_path: Path) -> nn.Module:
    """A LoRA policy whose B matrices are no longer 0 (as after some updates)."""
    policy = apply_lora(load_policy(tiny_path)[0], LoRAConfig(rank=RANK))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.copy_(0.05 * torch.randn(p.shape, generator=gen))
    return policy


def test_zero_b_policy_is_the_base_exactly(tiny_path: Path) -> None:
    base, _ = load_policy(tiny_path)
    policy = apply_lora(load_policy(tiny_path)[0], LoRAConfig(rank=RANK))
    ids, mask = _ids()
    assert torch.equal(token_logprobs(policy, ids, mask), token_logprobs(base, ids, mask))


def test_disabled_adapter_is_a_separately_loaded_base(tiny_path: Path) -> None:
    base, _ = load_policy(tiny_path)
    policy = _perturbed(tiny_path)
    ids, mask = _ids()
    adapted = token_logprobs(policy, ids, mask)
    assert not torch.allclose(adapted, token_logprobs(base, ids, mask), atol=1e-3)  # the adapter matters
    with adapter_disabled(policy):
        assert torch.equal(token_logprobs(policy, ids, mask), token_logprobs(base, ids, mask))
    assert torch.equal(token_logprobs(policy, ids, mask), adapted)  # re-enabled afterwards
    assert all(p.requires_grad == ("lora_" in n) for n, p in policy.named_parameters())


def test_merged_tensors_equal_peft_merge_and_unload(tiny_path: Path) -> None:
    policy = _perturbed(tiny_path)
    merged = dict(merged_tensors(policy))
    want = copy.deepcopy(policy).merge_and_unload().state_dict()  # peft's own merge
    base_keys = set(load_policy(tiny_path)[0].state_dict())
    assert set(merged) == set(want) == base_keys == set(base_names(policy))
    assert not [k for k in merged if any(m in k for m in lora.PEFT_NAME_MARKERS)]
    for k in merged:
        torch.testing.assert_close(merged[k], want[k])
    with torch.autocast("cpu", dtype=torch.bfloat16):  # a push from inside a bf16 autocast region merges in float32
        assert all(torch.equal(v, merged[k]) for k, v in merged_tensors(policy))
    assert not torch.equal(merged["model.layers.0.mlp.down_proj.weight"], policy.get_base_model().state_dict()[
        "model.layers.0.mlp.down_proj.base_layer.weight"])  # fmt: skip
    # A plain model with the merged weights scores as the adapted policy.
    plain, _ = load_policy(tiny_path)
    plain.load_state_dict(merged)
    ids, mask = _ids()
    torch.testing.assert_close(token_logprobs(plain, ids, mask), token_logprobs(policy, ids, mask))


def test_a_bf16_base_keeps_float32_adapters_and_merges_in_float32(tiny_path: Path) -> None:
    """The 7B recipe's setting (model.dtype=bfloat16): the frozen base stays bf16, the adapters are float32, and the
    merged weight is W + s B A computed in float32 from the bf16 W, checked against a plain product and sum (a bf16
    merge would round the update away:
    https://github.com/NVIDIA-NeMo/RL/issues/3696)."""
    policy = apply_lora(load_policy(tiny_path, dtype="bfloat16")[0], LoRAConfig(rank=RANK))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.copy_(1e-3 * torch.randn(p.shape, generator=gen))
    adapters = {n: p for n, p in policy.named_parameters() if "lora_" in n}
    assert adapters and all(p.dtype == torch.float32 and p.requires_grad for p in adapters.values())
    state = policy.get_base_model().state_dict()
    key = "model.layers.0.mlp.down_proj"
    w = state[f"{key}.base_layer.weight"]
    assert w.dtype == torch.bfloat16
    a, b = state[f"{key}.lora_A.default.weight"], state[f"{key}.lora_B.default.weight"]
    want = w.float() + (lora.LoRAConfig().alpha / RANK) * (b @ a)
    merged = dict(merged_tensors(policy))
    assert merged[f"{key}.weight"].dtype == torch.float32
    torch.testing.assert_close(merged[f"{key}.weight"], want)
    assert not torch.equal(merged[f"{key}.weight"].bfloat16().float(), merged[f"{key}.weight"])  # below bf16's step


def _adapted_linears(model: nn.Module, layers: set[int] | None = None) -> list[nn.Linear]:
    out = []
    for i, layer in enumerate(model.get_decoder().layers):
        if layers is None or i in layers:
            out += [m for m in layer.modules() if isinstance(m, nn.Linear)]
    return out


def test_only_the_adapters_train_and_get_gradients_under_checkpointing(tiny_path: Path) -> None:
    plain, _ = load_policy(tiny_path)
    want = sum(RANK * (m.in_features + m.out_features) for m in _adapted_linears(plain))  # sum r (d_in + d_out)
    m = ModelConfig(name_or_path=str(tiny_path), gradient_checkpointing=True, lora=LoRAConfig(rank=RANK))
    policy = trainable_policy(load_policy(tiny_path)[0], m)
    assert sum(p.numel() for p in policy.parameters() if p.requires_grad) == want  # what configure_optimizers takes
    policy.train()
    ids, mask = _ids()
    token_logprobs(policy, ids, mask).sum().backward()
    grads = {n: p.grad for n, p in policy.named_parameters()}
    # B = 0 at init: A's gradient is 0, B's is not, down to the bottom (checkpointed) layer.
    bottom = [n for n in grads if ".layers.0." in n and "lora_B" in n]
    assert len(bottom) == 7 and all(grads[n] is not None and grads[n].abs().sum() > 0 for n in bottom)
    assert all(g is None for n, g in grads.items() if "lora_" not in n)


def test_train_top_layers_puts_the_adapters_on_the_top_layers_only(tiny_path: Path) -> None:
    m = ModelConfig(name_or_path=str(tiny_path), train_top_layers=1, lora=LoRAConfig(rank=RANK))
    policy = trainable_policy(load_policy(tiny_path)[0], m)
    trained = {n for n, p in policy.named_parameters() if p.requires_grad}
    assert trained and all(".layers.1." in n and "lora_" in n for n in trained)
    plain, _ = load_policy(tiny_path)
    assert sum(p.numel() for p in policy.parameters() if p.requires_grad) == sum(
        RANK * (x.in_features + x.out_features) for x in _adapted_linears(plain, {1})
    )


def test_config_refusals(make_cfg) -> None:
    for bad, what in [
        ("model.lora.rank=-1", "rank"),
        ("model.lora.alpha=0", "alpha"),
        ("model.lora.dropout=1.0", "dropout"),
        ("model.lora.target_modules=[lm_head]", "target_modules"),
    ]:
        with pytest.raises(ValueError, match=f"model.lora.{what}"):
            make_cfg("model=tiny", bad)
    cfg = make_cfg("model=tiny", "model.lora.rank=4", "model.lora.dropout=0.1")
    from mempo.stages.builders import build_optim_config

    with pytest.raises(ValueError, match="model.lora.dropout=0.1: with optim.old_logp=sampler"):
        check_lora_run(cfg, build_optim_config(cfg))  # the CPU default resolves to the (fp32) engine's log-probs
    recompute = make_cfg("model=tiny", "model.lora.rank=4", "model.lora.dropout=0.1", "optim.old_logp=recompute")
    check_lora_run(recompute, build_optim_config(recompute))


class Recording:
    """An engine that records every name it receives (a separate copy: the push must run)."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def push_weights(self, pairs) -> None:
        for name, _ in pairs:
            self.names.append(name)


def test_a_peft_name_never_reaches_the_engine(tiny_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted bug: the renaming forgets to strip ``base_layer``; the push stops before the engine gets that name."""
    policy = _perturbed(tiny_path)
    module = type("Module", (), {"policy": policy})()
    cb = SamplerCallback(lambda m: Recording())
    cb.sampler = Recording()
    cb._push(module)
    assert cb.sampler.names == base_names(policy)
    monkeypatch.setattr(lora, "base_name", lambda key: key)  # the planted bug
    cb.sampler = Recording()
    with pytest.raises(RuntimeError, match=r"peft name 'model\.layers\.0\.self_attn\.q_proj\.base_layer\.weight'"):
        cb._push(module)
    assert not [n for n in cb.sampler.names if "base_layer" in n or "lora_" in n]


def _adapter(module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in module.policy.state_dict().items() if "lora_" in k}


def test_stopped_and_resumed_run_is_bit_identical_and_its_checkpoint_holds_the_adapter(make_cfg, tmp_path) -> None:
    """LoRA with a KL term (the reference: the adapter disabled), the HF sampler: 2 steps straight against 1 step,
    stop, resume, 1 step. Then the exports, and a resume on another base refused."""
    straight, _ = fit_rl(make_cfg(*RUN, "trainer.max_steps=2", f"run_dir={tmp_path / 'a'}"))
    assert straight.reference is None
    fit_rl(make_cfg(*RUN, "trainer.max_steps=1", f"run_dir={tmp_path / 'b'}"))
    ckpt = torch.load(tmp_path / "b" / "checkpoints" / "last.ckpt", weights_only=False)
    keys = list(ckpt["state_dict"])
    assert keys and all("lora_" in k for k in keys)  # no base weight in an adapter checkpoint
    n_params = sum(v.numel() for v in ckpt["state_dict"].values())
    assert n_params == sum(p.numel() for p in straight.policy.parameters() if p.requires_grad)
    assert len(ckpt["optimizer_states"][0]["state"]) == len(keys)  # AdamW moments of the adapters only
    assert ckpt["mempo"]["lora_base"].startswith("tiny:")
    resumed, _ = fit_rl(make_cfg(*RUN, "trainer.max_steps=2", "resume=true", f"run_dir={tmp_path / 'b'}"))
    a, b = _adapter(straight), _adapter(resumed)
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert any(v.abs().sum() > 0 for k, v in a.items() if "lora_B" in k)  # the adapter trained

    # hf/: a plain model that scores as the trained policy; hf_adapter/: peft's adapter over the base.
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    ids, mask = _ids()
    want = token_logprobs(straight.policy.eval(), ids, mask)
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "a" / "hf")
    torch.testing.assert_close(token_logprobs(plain, ids, mask), want)
    assert not any("lora_" in k or "base_layer" in k for k in plain.state_dict())
    adapter_cfg = json.loads((tmp_path / "a" / "hf_adapter" / "adapter_config.json").read_text())
    base, _ = load_policy(adapter_cfg["base_model_name_or_path"])
    torch.testing.assert_close(token_logprobs(PeftModel.from_pretrained(base, tmp_path / "a" / "hf_adapter"), ids,
                                              mask), want)  # fmt: skip

    # Another base (a copy of tiny with another config) refuses the adapter checkpoint, naming both: first the
    # resume's own check of the starting weights (mempo.stages.reuse), and with that accepted the checkpoint's.
    other = tmp_path / "other-base"
    shutil.copytree(adapter_cfg["base_model_name_or_path"], other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 1e-6}))
    resume = [*RUN, f"model.name_or_path={other}", "trainer.max_steps=3", "resume=true", f"run_dir={tmp_path / 'b'}"]
    with pytest.raises(ValueError, match=r"provenance\.model \(tiny:\w+ -> other-base:\w+\)"):
        fit_rl(make_cfg(*resume))
    with pytest.raises(ValueError, match=r"resume refused: the checkpoint's LoRA base is tiny:\w+, this run's is "
                                         r"other-base:\w+"):  # fmt: skip
        fit_rl(make_cfg(*resume, "accept_changes=[provenance.model]"))


def test_the_base_fingerprint_follows_the_files_not_the_folder_name(tiny_path: Path, tmp_path: Path) -> None:
    """The same base copied under another name resumes; another config does not; a hub id is fingerprinted by the
    snapshot in the Hugging Face cache (a new upstream revision is another base), by its name when none is cached."""
    from mempo.lm.lora import base_fingerprint, same_base

    copy_ = shutil.copytree(tiny_path, tmp_path / "renamed")
    assert base_fingerprint(copy_) != base_fingerprint(tiny_path) and same_base(
        base_fingerprint(copy_), base_fingerprint(tiny_path)
    )
    other = shutil.copytree(tiny_path, tmp_path / "other")
    (other / "config.json").write_text(json.dumps({**json.loads((other / "config.json").read_text()), "x": 1}))
    assert not same_base(base_fingerprint(other), base_fingerprint(tiny_path))
    assert same_base(None, None) and not same_base(None, base_fingerprint(tiny_path))

    hub = tmp_path / "hf" / "models--org--base"  # the Hugging Face cache's layout: refs/main -> snapshots/<commit>/
    for rev, src in (("aaa", tiny_path), ("bbb", other)):
        shutil.copytree(src, hub / "snapshots" / rev)
    (hub / "refs").mkdir()
    (hub / "refs" / "main").write_text("aaa")
    first = base_fingerprint("org/base", hf_cache_dir=str(tmp_path / "hf"))
    assert same_base(first, base_fingerprint(tiny_path))
    (hub / "refs" / "main").write_text("bbb")
    assert not same_base(base_fingerprint("org/base", hf_cache_dir=str(tmp_path / "hf")), first)
    assert base_fingerprint("org/not-cached", hf_cache_dir=str(tmp_path / "hf")) == "hub:org/not-cached"


@pytest.mark.parametrize("which", ["every weight", "one layer's down_proj"])
def test_the_base_fingerprint_tells_retrained_weights_of_one_architecture_apart(
    tiny_path: Path, tmp_path: Path, which: str
) -> None:
    """Config and file sizes alone gave the tiny model saved, perturbed and saved again the same fingerprint, so an
    adapter resumed onto a retrained warm start without a word. A retrain of every weight, or of the top layer only
    (``model.train_top_layers``), is another base; the same weights saved again are the same base."""
    from mempo.lm.lora import base_fingerprint, same_base

    model, _ = load_policy(tiny_path)
    model.save_pretrained(tmp_path / "before", safe_serialization=True)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if which == "every weight" or name.endswith("layers.1.mlp.down_proj.weight"):
                p.add_(0.01 * torch.randn(p.shape, generator=gen))
    model.save_pretrained(tmp_path / "after", safe_serialization=True)
    sizes = {f.name: f.stat().st_size for f in (tmp_path / "before").iterdir()}
    assert sizes == {f.name: f.stat().st_size for f in (tmp_path / "after").iterdir()}  # one architecture
    assert not same_base(base_fingerprint(tmp_path / "before"), base_fingerprint(tmp_path / "after"))
    load_policy(tiny_path)[0].save_pretrained(tmp_path / "again", safe_serialization=True)  # the same weights again
    assert same_base(base_fingerprint(tmp_path / "again"), base_fingerprint(tmp_path / "before"))


def test_the_plan_counts_the_adapters_peft_builds(tiny_path: Path, make_cfg) -> None:
    from mempo.capacity.gpu_memory import model_shape, plan_memory

    shape = model_shape(str(tiny_path))
    for top in (None, 1):
        m = ModelConfig(name_or_path=str(tiny_path), train_top_layers=top, lora=LoRAConfig(rank=RANK))
        policy = trainable_policy(load_policy(tiny_path)[0], m)
        assert shape.lora_params(RANK, top) == sum(p.numel() for p in policy.parameters() if p.requires_grad)
    plan = plan_memory(make_cfg("+exp=mempo_1gpu_lora"))
    assert plan.fits and plan.reference == 0 and plan.inputs.param_bytes == 2  # no second model; a bf16 base
    assert not plan_memory(make_cfg("+exp=mempo_1gpu_lora", "plan.gpu_gib=24")).fits


def test_the_sft_stage_trains_the_adapters(make_cfg, tmp_path, tiny_path) -> None:
    """The warm start with model.lora on: only the adapters move; hf/ is the merged model, hf_adapter/ the adapter."""
    from mempo.stages import run_stage

    summary = run_stage(make_cfg("+exp=sft", "+debug=default", "model.lora.rank=4", "sft.lr=1e-2",
                                 f"run_dir={tmp_path}"))  # fmt: skip
    assert summary["steps"] > 0
    trained = load_policy(tmp_path / "hf")[0].state_dict()
    base = load_policy(tiny_path)[0].state_dict()
    assert set(trained) == set(base)
    moved = {k for k in base if not torch.equal(trained[k], base[k])}
    assert moved and all(k.endswith("proj.weight") for k in moved)  # the adapted linears only; norms, embedding kept
    assert (tmp_path / "hf_adapter" / "adapter_config.json").is_file()
