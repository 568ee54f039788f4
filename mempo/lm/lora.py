"""LoRA adapters through peft (``model.lora``): wrapping the policy, the merged weights the engine receives, the
reference as the policy with its adapter disabled, the adapter-only checkpoint's base fingerprint and the exports.

Why a merged push: the engine (vLLM, CPU or CUDA) gets plain base-model weights ``W + (alpha / r) B A``, computed out
of place in float32 from the (gathered) base weight and the adapter, through the same in-process push and name check
as full fine-tuning. The trainer's weights are never merged in place (peft's ``merge_adapter``/``unmerge_adapter``
drift a bf16 base a little on every cycle), the engine needs no LoRA support and generates at full speed, and no peft
name (``base_layer``, ``lora_A``) reaches it: ``merged_tensors`` raises before yielding one.
On an fp32 engine (mempo's CPU default) the engine's weights equal the trainer's effective ones to float32 rounding.
On a bf16 engine the merge lands on the bf16 grid of W, which rounds away updates smaller than about 2^-8 |W|: the
canary's difference is logged at every push there, old log-probs are recomputed (``optim.old_logp=auto`` resolves to
recompute for bf16 engines) and ``loss.tis_cap`` corrects for the gap. Pushing the adapter itself into vLLM's LoRA
path (a new adapter id every version) is the later fix for bf16 engines; it is not built.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mempo.core.base import require

PEFT_RANGE = ("0.21.1", "0.22")  # pyproject pins peft>=0.21.1,<0.22 (0.21.1 first needs transformers >= 5.17)
ADAPTER = "default"  # peft's name for the one adapter a policy carries
# Substrings only peft's wrappers put into parameter names; none may reach the engine or the hf/ export.
PEFT_NAME_MARKERS = ("base_layer", "lora_", "base_model.model.", "modules_to_save", "original_module")


@dataclass(frozen=True)
class LoRAConfig:
    """Config ``model.lora``: LoRA adapters on the policy's linear layers (peft); ``rank`` 0 = off (the default).

    rank: r of each adapter ``B [d_out, r] @ A [r, d_in]``; 0 trains the weights themselves (or the top layers).
    alpha: the adapter's scale is alpha / rank. Kept fixed across ranks (32), so the best learning rate carries over
      between ranks ("LoRA Without Regret", 2025); expect it about 10x full fine-tuning's.
    dropout: on the adapter's input. Above 0 the trainer's forward is no longer the engine's (which has no dropout):
      refused with ``optim.old_logp=sampler`` (``check_lora_run``); with recompute the ratio's first pass is then
      not 1.
    target_modules: "all-linear" (every linear layer of the decoder; peft leaves the output head out) or a list of
      module names (q_proj, ..., down_proj). Embeddings and the head are refused: they are not LoRA'd here.
    With ``model.train_top_layers=K`` the adapters go on the top K decoder layers only (peft's layers_to_transform);
    the final norm then stays frozen (only adapters train).
    """

    rank: int = 0
    alpha: float = 32.0
    dropout: float = 0.0
    target_modules: Any = "all-linear"

    def __post_init__(self) -> None:
        targets = [self.target_modules] if isinstance(self.target_modules, str) else list(self.target_modules)
        require(
            "model.lora",
            self,
            [
                ("rank", self.rank >= 0, "must be >= 0 (0 = off)"),
                ("alpha", self.alpha > 0, "must be > 0"),
                ("dropout", 0 <= self.dropout < 1, "must be in [0, 1)"),
                ("target_modules", bool(targets) and all(isinstance(t, str) and t for t in targets),
                 "must be 'all-linear' or a non-empty list of module names"),
                ("target_modules", not {"lm_head", "embed_tokens"} & set(targets),
                 "must not name the output head or the embeddings"),
            ],
        )  # fmt: skip

    @property
    def enabled(self) -> bool:
        return self.rank > 0


def require_peft() -> Any:
    """Import peft, refusing a missing one or a release outside ``PEFT_RANGE`` (scripts/setup.sh installs it)."""
    try:
        import peft
    except ImportError as e:
        raise ImportError(f"model.lora.rank > 0 needs peft>={PEFT_RANGE[0]},<{PEFT_RANGE[1]} (scripts/setup.sh)") from e
    from packaging.version import Version

    if not Version(PEFT_RANGE[0]) <= Version(peft.__version__) < Version(PEFT_RANGE[1]):
        raise ImportError(f"peft {peft.__version__} is installed; mempo needs >={PEFT_RANGE[0]},<{PEFT_RANGE[1]}")
    return peft


def is_lora(model: nn.Module) -> bool:
    """Whether ``model`` is a peft-wrapped policy (``apply_lora``)."""
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def apply_lora(model: nn.Module, cfg: LoRAConfig, *, top_layers: int | None = None) -> nn.Module:
    """``model`` wrapped with LoRA adapters (A: peft's Kaiming-uniform init, B = 0, so the wrapped policy computes
    exactly the base's log-probs until the first update); only the adapters require grad. ``top_layers``: adapt only
    the last K decoder layers (``model.train_top_layers``). Gradient checkpointing keeps working: the embeddings'
    output requires grad (a reentrant checkpoint of a layer whose inputs do not would give its adapters no grad)."""
    require_peft()
    from peft import LoraConfig, get_peft_model

    layers = None
    if top_layers is not None:
        n = len(model.get_decoder().layers)
        if not 1 <= top_layers <= n:
            raise ValueError(f"model.train_top_layers must be null or in [1, {n}] for this model, got {top_layers}")
        layers = list(range(n - top_layers, n))
    targets = cfg.target_modules if isinstance(cfg.target_modules, str) else list(cfg.target_modules)
    if layers is not None and targets == "all-linear":  # peft takes layers_to_transform with a list of names only
        decoder_layers = model.get_decoder().layers
        targets = sorted({n.rpartition(".")[2] for n, m in decoder_layers.named_modules() if isinstance(m, nn.Linear)})
    config = LoraConfig(
        r=cfg.rank,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=targets,
        layers_to_transform=layers,
        bias="none",
        task_type="CAUSAL_LM",
    )
    wrapped = get_peft_model(model, config)
    if getattr(model, "is_gradient_checkpointing", False):
        wrapped.enable_input_require_grads()
    wrapped.eval()
    return wrapped


def adapter_disabled(policy: nn.Module) -> AbstractContextManager:
    """The reference policy: ``policy`` with its adapter bypassed (the base's forward exactly; no second model)."""
    return policy.disable_adapter()


def _lora_layers(base: nn.Module) -> dict[str, Any]:
    from peft.tuners.lora import LoraLayer

    layers = {name: m for name, m in base.named_modules() if isinstance(m, LoraLayer)}
    for name, layer in layers.items():
        if not isinstance(layer.get_base_layer(), nn.Linear) or layer.fan_in_fan_out:
            raise ValueError(f"model.lora: {name} is not a plain nn.Linear; only linear layers are merged")
    return layers


def base_name(key: str) -> str:
    """A peft state-dict key as the base model's (``...q_proj.base_layer.weight`` -> ``...q_proj.weight``)."""
    return key.replace(".base_layer.", ".")


def is_adapter_key(key: str) -> bool:
    return ".lora_" in key


def base_names(policy: nn.Module) -> list[str]:
    """The base model's state-dict keys, as the engine and ``hf/`` know them: what ``merged_tensors`` must yield."""
    return [base_name(k) for k in policy.get_base_model().state_dict() if not is_adapter_key(k)]


def _full(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    t = t.detach()
    return t.full_tensor() if isinstance(t, DTensor) else t


def merged_tensors(policy: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(base name, tensor) for every weight of the base model, in state-dict order; an adapted linear's weight as
    ``W + scaling * B @ A`` computed in float32, out of place, other weights as they are. Under FSDP2 each tensor is
    gathered in turn by every rank (consume the iterator to the end on all). Raises before yielding a peft name."""
    base = policy.get_base_model()
    layers = _lora_layers(base)
    state = base.state_dict()
    for key, value in state.items():
        if is_adapter_key(key):
            continue
        name = base_name(key)
        prefix, _, leaf = name.rpartition(".")
        layer = layers.get(prefix)
        tensor = _full(value)
        if layer is not None and leaf == "weight" and ADAPTER in layer.lora_A:
            a = _full(state[f"{prefix}.lora_A.{ADAPTER}.weight"]).float()  # [r, d_in]
            b = _full(state[f"{prefix}.lora_B.{ADAPTER}.weight"]).float()  # [d_out, r]
            with torch.autocast(tensor.device.type, enabled=False):  # float32 even inside a bf16 autocast region
                tensor = torch.addmm(tensor.float(), b, a, alpha=layer.scaling[ADAPTER])  # W + s B A [d_out, d_in]
        if any(m in name for m in PEFT_NAME_MARKERS):
            raise RuntimeError(f"LoRA push: the peft name {key!r} would reach the engine as {name!r}")
        yield name, tensor


def adapter_state(policy: nn.Module) -> dict[str, torch.Tensor]:
    """The adapter's entries of the policy's state dict (``...lora_A.default.weight``), full tensors on the CPU
    (gathered by every rank under FSDP2)."""
    return {k: _full(v).cpu().clone() for k, v in policy.state_dict().items() if is_adapter_key(k)}


def export_states(policy: nn.Module) -> dict[str, dict[str, torch.Tensor]]:
    """{"merged": the plain model's weights on the CPU (``merged_tensors``: adapted linear weights merged in float32,
    every other weight in the base's dtype), "adapter": peft's adapter state}: what ``save_lora`` writes; every rank
    computes it under FSDP2 (a collective)."""
    return {"merged": {k: v.cpu().clone() for k, v in merged_tensors(policy)}, "adapter": adapter_state(policy)}


def save_lora(policy: nn.Module, merged_dir: Path, adapter_dir: Path, states: dict | None = None) -> None:
    """``merged_dir``: a plain Hugging Face model (the merged weights: the adapted linear weights in float32, the
    others in the base's dtype, as ``merged_tensors`` yields them), what the next stage, vLLM and eval load.
    ``adapter_dir``: peft's adapter folder (``PeftModel.from_pretrained(base, adapter_dir)``), which names the base in
    ``base_model_name_or_path``."""
    states = states if states is not None else export_states(policy)
    base = policy.get_base_model()
    base.save_pretrained(merged_dir, safe_serialization=True, state_dict=states["merged"])
    policy.save_pretrained(adapter_dir, safe_serialization=True, state_dict=states["adapter"])


SAMPLE_BYTES = 4096  # bytes the base fingerprint reads at each sampled position
TENSOR_SAMPLES = 3  # positions per tensor of a safetensors file: its data's start, middle and end
FILE_SAMPLES = 64  # evenly spaced positions in any other weight file (a .bin pickle, read as bytes)


def _sample_spans(start: int, end: int, count: int) -> list[tuple[int, int]]:
    """(offset, length) of ``count`` evenly spaced reads of ``SAMPLE_BYTES`` in ``[start, end)`` (first and last
    included), or the whole range when it is that short."""
    if end - start <= count * SAMPLE_BYTES:
        return [(start, end - start)]
    step = (end - start - SAMPLE_BYTES) / (count - 1)
    return [(start + round(i * step), SAMPLE_BYTES) for i in range(count)]


def _hash_weight_file(path: Path, h: Any) -> None:
    """Feeds ``h`` with a weight file's name, size and sampled bytes: for a safetensors file its header (every
    tensor's name, dtype, shape and offsets) and ``TENSOR_SAMPLES`` reads of each tensor's data, so a retrained tensor
    changes the hash whichever tensors were trained; for any other file ``FILE_SAMPLES`` reads over it."""
    size = path.stat().st_size
    h.update(f"{path.name}:{size}".encode())
    with path.open("rb") as f:
        if path.suffix == ".safetensors":
            n = int.from_bytes(f.read(8), "little")
            raw = f.read(n)
            h.update(raw)
            try:
                header = json.loads(raw)
                offsets = [header[k]["data_offsets"] for k in sorted(header) if k != "__metadata__"]
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{path}: not a safetensors file (its header does not parse: {e})") from e
            spans = [s for a, b in offsets for s in _sample_spans(8 + n + a, 8 + n + b, TENSOR_SAMPLES)]
        else:
            spans = _sample_spans(0, size, FILE_SAMPLES)
        for offset, length in spans:
            f.seek(offset)
            h.update(f.read(length))


def base_fingerprint(model_path: str | Path, hf_cache_dir: str | None = None) -> str:
    """A cheap identity of the base model a LoRA adapter was trained on, ``"<folder>:<hash>"``: a hash of its
    config.json and of its weight files' names, sizes and sampled bytes (``_hash_weight_file``: a few KiB of every
    tensor, about 4 MiB read for a 7B model instead of its 15 GB), so a base retrained in place (another warm start
    of one architecture) is another base. The folder's name is for the reader; ``same_base`` compares the hashes, so
    the same base copied elsewhere still resumes. A hub id is fingerprinted by the snapshot in the Hugging Face cache
    (the revision that was downloaded, so a changed upstream revision is caught), or by its name when nothing is
    cached."""
    path = Path(model_path)
    if not path.is_dir():
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(str(model_path), "config.json", cache_dir=hf_cache_dir)
        if not isinstance(cached, str):  # not cached (None) or cached as missing
            return f"hub:{model_path}"
        path = Path(cached).parent  # snapshots/<commit>/
    h = hashlib.sha256()
    config = json.loads((path / "config.json").read_text())
    config.pop("_name_or_path", None)
    h.update(json.dumps(config, sort_keys=True).encode())
    for f in sorted(path.glob("*.safetensors*")) + sorted(path.glob("*.bin")):
        _hash_weight_file(f, h)
    return f"{path.name}:{h.hexdigest()[:16]}"


def same_base(saved: str | None, mine: str | None) -> bool:
    """Whether two ``base_fingerprint`` values name the same base (None: full weights, no adapter)."""
    if saved is None or mine is None:
        return saved is mine
    return saved.rsplit(":", 1)[-1] == mine.rsplit(":", 1)[-1]
