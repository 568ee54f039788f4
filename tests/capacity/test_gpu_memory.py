"""The memory plan (mempo.capacity.gpu_memory): exact parameter counts, the sharding arithmetic worked out by hand, the
activation formula, the fits line, and the shipped GPU experiments' verdicts."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, Qwen2Config

from mempo.capacity.gpu_memory import (
    GIB,
    KNOWN_CONFIGS,
    EngineInputs,
    ModelShape,
    PlanInputs,
    fits_line,
    layer_activation_bytes,
    memory_plan,
    model_shape,
    plan_memory,
    render,
)
from mempo.lm.loading import load_policy, train_top_layers
from mempo.stages.config import compose_config

ROOT = Path(__file__).resolve().parents[2]

# A small Qwen2-style shape whose figures are worked out by hand below.
# h = 64, heads 4 x 16 (q = 64), kv heads 2 (kv = 32), i = 128, V = 1000, untied head, q/k/v biases.
SMALL = ModelShape.from_config(
    {
        "model_type": "qwen2",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 1000,
        "tie_word_embeddings": False,
        "max_position_embeddings": 512,
    }
)
# One layer: q 64*64 + k, v 2*64*32 + o 64*64 + biases 64+32+32 = 12,416; MLP 3*64*128 = 24,576; norms 128 -> 37,120.
LAYER = 37_120
# Embedding 64,000 + head 64,000 + final norm 64 + 2 layers -> 202,304.
TOTAL = 202_304


def small_inputs(**changes: object) -> PlanInputs:
    """fsdp2 over 4 GPUs, fp32 parameters, bf16 compute, no engine, no reference; 1 row x 10 tokens, 4 scored."""
    base = PlanInputs(
        strategy="fsdp2",
        sharded=True,
        world_size=4,
        on_gpu=True,
        precision="bf16-mixed",
        param_bytes=4,
        compute_bytes=2,
        residual_bytes=2,
        train_top_layers=None,
        gradient_checkpointing=False,
        reference=False,
        micro_batch_size=1,
        seq_len=10,
        seq_len_from="agent.max_context_tokens",
        scored_per_row=4,
        engine=None,
        gpu_gib=80.0,
        overhead_gib=0.0,
    )
    return dataclasses.replace(base, **changes)


def numel(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_the_small_shape_counts_as_worked_out():
    assert (SMALL.layer_params, SMALL.total_params) == (LAYER, TOTAL)
    assert SMALL.trainable_params(1) == LAYER + 64  # the top layer and the final norm


def test_parameter_count_of_the_tiny_model_is_exact(tiny_path):
    model, _ = load_policy(tiny_path)
    shape = model_shape(str(tiny_path))
    assert shape.total_params == numel(model)
    assert model_shape("tiny").total_params == numel(model)  # the embedded name reads the built folder
    train_top_layers(model, 1)
    assert shape.trainable_params(1) == sum(p.numel() for p in model.parameters() if p.requires_grad)


@pytest.mark.slow
def test_parameter_count_of_smollm2_is_exact(smollm2_path):
    model, _ = load_policy(smollm2_path)
    shape = model_shape(str(smollm2_path))
    assert shape.total_params == numel(model) == 134_515_008
    table = ModelShape.from_config(KNOWN_CONFIGS["HuggingFaceTB/SmolLM2-135M-Instruct"])
    assert dataclasses.replace(table, source=shape.source) == shape  # the table is the folder's config.json


@pytest.mark.parametrize("name", sorted(KNOWN_CONFIGS))
def test_known_configs_count_as_transformers_builds_them(name):
    """The formula (Qwen2's q/k/v biases, untied heads) against the module transformers builds, on the meta device."""
    config = KNOWN_CONFIGS[name]
    cls = Qwen2Config if config["model_type"] == "qwen2" else LlamaConfig
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cls(**{k: v for k, v in config.items() if k != "model_type"}))
    assert model_shape(name).total_params == numel(model)


def test_published_totals_of_the_qwen_models():
    totals = {n: model_shape(f"Qwen/Qwen2.5-{n}-Instruct").total_params for n in ("7B", "3B", "1.5B")}
    assert totals == {"7B": 7_615_616_512, "3B": 3_085_938_688, "1.5B": 1_543_714_304}


def test_a_folder_config_is_read(tmp_path):
    config = {**KNOWN_CONFIGS["Qwen/Qwen2.5-1.5B-Instruct"], "num_hidden_layers": 2}
    (tmp_path / "config.json").write_text(json.dumps(config))
    cfg = AutoConfig.for_model(**config)
    with torch.device("meta"):
        assert model_shape(str(tmp_path)).total_params == numel(AutoModelForCausalLM.from_config(cfg))


def test_fsdp2_divides_the_states_by_the_world_size():
    p = memory_plan(SMALL, small_inputs())
    assert (p.params, p.grads, p.optimizer) == (TOTAL, TOTAL, 2 * TOTAL)  # 4 bytes x TOTAL / 4 GPUs
    # two layers and the root unit (embedding, head, final norm: 128,064) in bf16, one layer's gradient in fp32
    assert p.unsharded == (2 * LAYER + 128_064) * 2 + LAYER * 4 == 553_088
    assert p.ddp_buckets == p.weight_casts == 0  # fsdp2 computes on its unsharded bf16 copies: no autocast casts
    assert p.optimizer_step == TOTAL  # foreach AdamW: one buffer the size of the local shard
    ref = memory_plan(SMALL, small_inputs(reference=True))
    assert ref.reference == TOTAL


def test_ddp_holds_everything_on_every_gpu():
    p = memory_plan(SMALL, small_inputs(strategy="ddp", sharded=False, residual_bytes=4))
    assert (p.params, p.grads, p.ddp_buckets, p.optimizer) == (4 * TOTAL, 4 * TOTAL, 4 * TOTAL, 8 * TOTAL)
    assert p.unsharded == 0
    top = memory_plan(SMALL, small_inputs(strategy="ddp", sharded=False, residual_bytes=4, train_top_layers=1))
    assert (top.params, top.grads, top.optimizer) == (4 * TOTAL, 4 * (LAYER + 64), 8 * (LAYER + 64))


# One SMALL layer's projection weights: q and o 2 x 64*64, k and v 2 x 64*32, gate/up/down 3 x 64*128 -> 36,864.
SMALL_LINEARS = 36_864


def test_weight_casts_are_the_saved_casts_of_the_recorded_layers_and_the_heads():
    """bf16-mixed over fp32 weights, replicated: Lightning's autocast caches nothing; without checkpointing each
    layer's bf16 casts are saved for its backward, with it only the recomputed layer's; the head's per chunk."""
    replicated = dict(strategy="ddp", sharded=False, residual_bytes=4)
    head = 1000 * 64 * 2
    off = memory_plan(SMALL, small_inputs(**replicated))
    assert off.weight_casts == 2 * SMALL_LINEARS * 2 + head == 275_456
    on = memory_plan(SMALL, small_inputs(**replicated, gradient_checkpointing=True))
    assert on.weight_casts == SMALL_LINEARS * 2 + head == 201_728
    top = memory_plan(SMALL, small_inputs(**replicated, train_top_layers=1))
    assert top.weight_casts == SMALL_LINEARS * 2 + head  # autograd records only the top layer
    assert memory_plan(SMALL, small_inputs(**replicated, precision="32-true", compute_bytes=4)).weight_casts == 0
    bf16 = small_inputs(**{**replicated, "residual_bytes": 2}, precision="bf16-true", param_bytes=2)
    assert memory_plan(SMALL, bf16).weight_casts == 0
    # LoRA rank 4 over a bf16 base: only the fp32 adapters are cast. Per layer r*(d_in + d_out): q 128, k 96, v 96,
    # o 128, gate 192, up 192, down 192 -> 4 x 1,024 = 4,096; no head cast (the head is bf16).
    lora = dataclasses.replace(bf16, precision="bf16-mixed", lora_rank=4)
    assert memory_plan(SMALL, lora).weight_casts == 2 * 4_096 * 2
    assert memory_plan(SMALL, dataclasses.replace(lora, gradient_checkpointing=True)).weight_casts == 4_096 * 2
    # ... over an fp32 base: the frozen base's casts are saved too (the layers' inputs require grad), and the head's.
    lora32 = dataclasses.replace(lora, param_bytes=4, residual_bytes=4)
    assert memory_plan(SMALL, lora32).weight_casts == 2 * (SMALL_LINEARS + 4_096) * 2 + head


def test_the_gpu_recipes_weight_casts_and_lora_state_by_hand():
    # Qwen2.5-1.5B, fp32 under bf16-mixed, checkpointing on: one layer's projections, q and o 2 x 1536^2 = 4,718,592,
    # k and v 2 x 1536*256 = 786,432, MLP 3 x 1536*8960 = 41,287,680 -> 46,792,704 x 2 bytes = 93,585,408; the tied
    # head 151,936 x 1536 x 2 = 466,747,392.
    full = plan_memory(compose_config("+exp=mempo_1gpu"))
    assert full.weight_casts == 93_585_408 + 466_747_392
    # Qwen2.5-7B + rank 32 on all seven projections of 28 layers: per layer 32 x (inputs 5 x 3584 + 3584 + 18944
    # = 40,448, outputs 3584 + 512 + 512 + 3584 + 2 x 18944 + 3584 = 49,664) = 2,883,584 adapters, 80,740,352 in all.
    lora = plan_memory(compose_config("+exp=mempo_1gpu_lora"))
    assert lora.trainable == 28 * 2_883_584 == 80_740_352
    assert lora.weight_casts == 2_883_584 * 2  # the recomputed layer's adapters in bf16; base and head are bf16
    assert (lora.grads, lora.optimizer, lora.optimizer_step) == (4 * 80_740_352, 8 * 80_740_352, 4 * 80_740_352)


def _saved_casts(model: torch.nn.Module, checkpointing: bool) -> dict[str, int]:
    """Train-mode ``token_logprobs`` of 2 x 24 tokens under Lightning's bf16-mixed region on the CPU, as
    ``MemPOModule._update`` runs under the trainer: {parameter name: bytes} of the bf16 copies of parameters that
    autograd saved for backward in the forward (a new storage holding exactly the parameter cast to bf16)."""
    from lightning.pytorch.plugins.precision import MixedPrecision

    from mempo.lm.logprobs import token_logprobs

    params = {n: p for n, p in model.named_parameters() if p.dtype == torch.float32}
    own = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, torch.UntypedStorage] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.dtype == torch.bfloat16 and t.untyped_storage().data_ptr() not in own:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage()
        return t

    if checkpointing:
        model.gradient_checkpointing_enable()
    model.train()
    ids = torch.randint(0, 1000, (2, 24), generator=torch.Generator().manual_seed(0))
    with MixedPrecision("bf16-mixed", "cpu").forward_context():
        assert not torch.is_autocast_cache_enabled()  # Lightning's region: autocast caches no cast weight
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            logp = token_logprobs(model, ids, torch.ones_like(ids))
        logp.sum().backward()
    found: dict[str, int] = {}
    for storage in saved.values():
        flat = torch.empty(0, dtype=torch.bfloat16).set_(storage)
        for name, p in params.items():
            if flat.numel() == p.numel() and torch.equal(flat, p.detach().to(torch.bfloat16).flatten()):
                found[name] = storage.nbytes()
    return found


def _replicated_plan(shape: ModelShape, **changes: object) -> int:
    """The plan's weight casts for ``shape`` on one device under bf16-mixed, less the head's (its chunks are
    checkpointed: its cast lives only inside a chunk, which the hooks above do not see)."""
    inputs = small_inputs(strategy="auto", sharded=False, world_size=1, residual_bytes=4, **changes)
    head = shape.vocab_size * shape.hidden_size * 2 if inputs.param_bytes == 4 else 0
    return memory_plan(shape, inputs).weight_casts - head


def test_the_weight_casts_are_what_autograd_saves_under_lightnings_autocast(tiny_path):
    """Measured on the tiny model: without checkpointing, every decoder projection's bf16 cast is saved for backward
    (and nothing else cast from a parameter); with it the forward saves none (the recompute casts one layer at a
    time). Summed from the tensors themselves, against the plan's term."""
    model, _ = load_policy(tiny_path)
    shape = model_shape(str(tiny_path))
    found = _saved_casts(model, checkpointing=False)
    projections = {n for n, m in model.model.layers.named_modules() if isinstance(m, torch.nn.Linear)}
    assert {n.removeprefix("model.layers.").removesuffix(".weight") for n in found} == projections
    assert sum(found.values()) == _replicated_plan(shape) == 2 * 147_456 * 2  # 2 layers, 147,456 weights each
    model, _ = load_policy(tiny_path)
    assert _saved_casts(model, checkpointing=True) == {}


def test_a_lora_policy_over_a_bf16_base_casts_only_its_adapters(tiny_path):
    from mempo.lm.lora import LoRAConfig, apply_lora

    base, _ = load_policy(tiny_path, dtype="bfloat16")
    model = apply_lora(base, LoRAConfig(rank=4))
    found = _saved_casts(model, checkpointing=False)
    adapters = {n: p for n, p in model.named_parameters() if p.requires_grad}
    # The first layer's q, k and v read the frozen embeddings' output, which needs no gradient: autograd keeps their
    # lora_A's input for the weight's gradient but not the cast weight. The plan counts those three too.
    first = {n for n in adapters if ".layers.0.self_attn." in n and ".lora_A." in n and n.split(".")[-4] != "o_proj"}
    assert len(first) == 3 and set(found) == set(adapters) - first
    plan = _replicated_plan(model_shape(str(tiny_path)), param_bytes=2, lora_rank=4)
    assert sum(found.values()) + sum(2 * adapters[n].numel() for n in first) == plan
    assert plan == 2 * sum(p.numel() for p in adapters.values())


def test_adamw_holds_exactly_the_planned_gradients_and_moments(tiny_path):
    """The foreach implementation (the one GPUs get) after a step of a LoRA policy: two fp32 moments per adapter,
    host scalars for the step counts, and the gradients: the plan's grads + optimizer terms, byte for byte."""
    from mempo.lm.lora import LoRAConfig, apply_lora

    base, _ = load_policy(tiny_path, dtype="bfloat16")
    model = apply_lora(base, LoRAConfig(rank=4))
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=1e-3, foreach=True)
    for p in trainable:
        p.grad = torch.ones_like(p)
    opt.step()
    state = [t for s in opt.state.values() for t in s.values()]
    moments = sum(t.nbytes for t in state if t.dim() > 0)
    assert all(t.dim() == 0 and t.device.type == "cpu" for t in state if t.dim() == 0)
    assert len([t for t in state if t.dim() == 0]) == len(trainable)
    plan = memory_plan(model_shape(str(tiny_path)), small_inputs(param_bytes=2, lora_rank=4, sharded=False))
    assert (sum(p.grad.nbytes for p in trainable), moments) == (plan.grads, plan.optimizer)


def test_one_device_without_ddp_has_no_buckets():
    p = memory_plan(SMALL, small_inputs(strategy="auto", sharded=False, world_size=1, residual_bytes=4))
    assert p.ddp_buckets == 0 and p.grads == 4 * TOTAL


def test_layer_activations_as_worked_out():
    # bf16 residual and compute, per token: norms 2 x (4h + 2h) = 768; projection inputs 2h twice = 256;
    # q and repeated k, v 3 x 2q = 384; sdpa output and o_proj input 2 x 2q = 256; SwiGLU 4 x 2i = 1,024 -> 2,688
    assert layer_activation_bytes(SMALL, 10, residual_bytes=2, compute_bytes=2) == 26_880
    # fp32 residual under autocast: norms 2 x 8h = 1,024; casts per projection 5 x 2h = 640; 384 + 256 + 1,024 -> 3,328
    assert layer_activation_bytes(SMALL, 10, residual_bytes=4, compute_bytes=2) == 33_280


def test_activations_count_the_trainable_layers_and_checkpointing_keeps_layer_inputs():
    p = memory_plan(SMALL, small_inputs())
    layer = 26_880
    # final norm 10 x 6h = 3,840; head input rows 4 x 2h = 512; padding mask 10 x 10 = 100
    around = 3_840 + 512 + 100
    assert p.activations_full == 2 * layer + around
    assert p.activations_checkpointed == 2 * 10 * 2 * 64 + layer + around
    top = memory_plan(SMALL, small_inputs(train_top_layers=1))
    assert top.activations_full == layer + around
    on = memory_plan(SMALL, small_inputs(gradient_checkpointing=True))
    assert on.activations == p.activations_checkpointed and p.activations == p.activations_full


def test_logits_are_one_chunk_of_the_head():
    # 4 scored positions: one [4, 1000] chunk, 20 + 2 bytes per element; the trainable head's chunk gradient in bf16
    # and the unsharded gradient it accumulates into
    p = memory_plan(SMALL, small_inputs())
    assert p.logits == 4 * 1000 * 22 + 1000 * 64 * 4
    assert memory_plan(SMALL, small_inputs(train_top_layers=1)).logits == 4 * 1000 * 22


def test_sleep_mode_takes_the_engine_out_of_the_update():
    engine = EngineInputs(2, 1, 0.5, True, None, 256)
    asleep = memory_plan(SMALL, small_inputs(engine=engine, gpu_gib=1.0))
    awake = memory_plan(SMALL, small_inputs(engine=dataclasses.replace(engine, sleep=False), gpu_gib=1.0))
    assert asleep.engine == awake.engine == GIB // 2  # the engine holds gpu_memory_utilization x GPU
    assert asleep.engine_weights == TOTAL * 2
    assert awake.update == asleep.update + awake.engine
    assert asleep.peak == max(asleep.generation, asleep.update, asleep.step)


def test_fits_lines():
    assert fits_line(memory_plan(SMALL, small_inputs())) == "fits: yes"
    big = dataclasses.replace(SMALL, num_layers=2000)
    p = memory_plan(big, small_inputs(world_size=1, gpu_gib=0.5))
    assert not p.fits
    assert fits_line(p) == f"fits: no (needs {p.needs / GIB:.1f} GiB, has 0.5 GiB)"
    assert render(p).splitlines()[-1] == fits_line(p)


def test_an_engine_without_room_for_one_sequence_does_not_fit():
    engine = EngineInputs(2, 1, 0.001, True, None, 100_000)
    p = memory_plan(SMALL, small_inputs(engine=engine, gpu_gib=1.0))
    assert p.peak < p.gpu and not p.fits and "vLLM would not start" in render(p)


def test_the_paper_setting_fits_8_gpus_and_not_one_small_one():
    assert render(plan_memory(compose_config("+exp=mempo"))).splitlines()[-1] == "fits: yes"
    small = plan_memory(compose_config("+exp=mempo", "trainer.devices=1", "plan.gpu_gib=24"))
    assert re.fullmatch(r"fits: no \(needs \d+\.\d GiB, has 24\.0 GiB\)", render(small).splitlines()[-1])
    p = plan_memory(compose_config("+exp=mempo"))
    assert (p.inputs.sharded, p.inputs.world_size, p.inputs.param_bytes, p.inputs.engine.sleep) == (True, 8, 4, True)


def test_the_one_gpu_experiment_fits_one_80_gb_gpu():
    p = plan_memory(compose_config("+exp=mempo_1gpu"))
    assert p.fits and p.inputs.world_size == 1 and not p.inputs.sharded


def test_the_sequence_bound():
    tiny = plan_memory(compose_config("model=tiny", "agent.max_context_tokens=8000")).inputs
    assert (tiny.seq_len, tiny.seq_len_from) == (2048, "the model's max_position_embeddings")
    qwen = ("model.name_or_path=Qwen/Qwen2.5-1.5B-Instruct", "agent.max_context_tokens=8000")
    assert plan_memory(compose_config(*qwen, "sampler.max_model_len=4096")).inputs.seq_len == 4096
    assert plan_memory(compose_config(*qwen, "sampler=hf")).inputs.seq_len == 8000  # no engine to stop at 4096


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (("trainer.strategy=ddp_spawn",), "trainer.strategy"),
        (("trainer=fsdp",), "trainer.devices"),
        (("model.name_or_path=someone/unknown-model",), "model.name_or_path"),
        (("trainer.precision=64-true",), "trainer.precision"),
        (("sampler.enable_sleep_mode=true",), "sampler.enable_sleep_mode"),
    ],
)
def test_what_the_plan_does_not_model_is_an_error_naming_the_key(overrides, key):
    with pytest.raises(ValueError, match=re.escape(key)):
        plan_memory(compose_config(*overrides))


def test_plan_gpu_gib_is_validated():
    with pytest.raises(ValueError, match=r"plan\.gpu_gib"):
        compose_config("plan.gpu_gib=0")


def test_the_cli_prints_the_plan_and_writes_nothing(tmp_path):
    cmd = [sys.executable, str(ROOT / "experiments" / "plan.py"), "+exp=mempo", "trainer.devices=1", "plan.gpu_gib=24"]
    out = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1].startswith("fits: no (needs ")
    assert list(tmp_path.iterdir()) == []  # no run folder, .hydra copy or log file


def test_the_plan_states_the_global_batch_and_refuses_one_the_ranks_cannot_share():
    text = render(plan_memory(compose_config("+exp=mempo")))
    assert "  data      tasks per step: 128 (16 per rank x 8 ranks)" in text.splitlines()
    with pytest.raises(ValueError, match=r"data\.batch_size=100 .*world size 8"):
        plan_memory(compose_config("+exp=mempo", "data.batch_size=100"))
