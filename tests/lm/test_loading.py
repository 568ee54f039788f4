from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from transformers import LlamaForCausalLM

from mempo.lm.loading import (
    TINY,
    _materialize,
    cache_root,
    load_policy,
    load_tokenizer,
    random_tiny_model,
    resolve_model_path,
)


def test_cache_root_prefers_argument_then_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMPO_CACHE", str(tmp_path / "env"))
    assert cache_root() == tmp_path / "env"
    assert cache_root(tmp_path / "arg") == tmp_path / "arg"
    monkeypatch.delenv("MEMPO_CACHE")
    assert cache_root() == Path.home() / ".cache" / "mempo"


def test_tiny_materializes_into_cache_and_loads(tiny_path: Path, mempo_cache: Path) -> None:
    assert tiny_path == mempo_cache / TINY
    names = set(os.listdir(tiny_path))
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= names
    assert not [n for n in os.listdir(mempo_cache) if n.startswith(".")], "a temporary build folder was left behind"

    model, tokenizer = load_policy(TINY)  # resolved through $MEMPO_CACHE, set by conftest
    assert isinstance(model, LlamaForCausalLM)
    assert model.config.num_hidden_layers == 2 and model.config.tie_word_embeddings
    assert model.config.vocab_size == len(tokenizer) == 49152
    assert model.dtype == torch.float32
    assert tokenizer.pad_token == tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.chat_template is not None and "<|im_start|>" in tokenizer.chat_template


def test_tiny_folder_holds_the_seeded_model(tiny_path: Path) -> None:
    model, tokenizer = load_policy(tiny_path)
    expected = random_tiny_model(tokenizer, seed=0)
    for (name, saved), (_, fresh) in zip(model.state_dict().items(), expected.state_dict().items(), strict=True):
        torch.testing.assert_close(saved, fresh, msg=name)
    other = random_tiny_model(tokenizer, seed=1)
    assert not torch.equal(other.model.embed_tokens.weight, expected.model.embed_tokens.weight)


def test_materialized_folder_is_reused(tiny_path: Path, mempo_cache: Path) -> None:
    stamp = (tiny_path / "model.safetensors").stat().st_mtime_ns
    assert resolve_model_path(TINY, cache_dir=mempo_cache) == tiny_path
    assert (tiny_path / "model.safetensors").stat().st_mtime_ns == stamp


def test_local_folder_is_returned_as_is(tiny_path: Path) -> None:
    assert resolve_model_path(str(tiny_path)) == tiny_path
    assert load_tokenizer(tiny_path).pad_token_id is not None


def test_hub_id_passes_through() -> None:
    assert resolve_model_path("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_bad_paths_error_clearly(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no-such-model"):
        resolve_model_path(tmp_path / "no-such-model")
    with pytest.raises(FileNotFoundError, match="embedded name"):
        resolve_model_path("smollm9")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no config.json"):
        resolve_model_path(tmp_path / "empty")
    (tmp_path / "file.bin").write_bytes(b"")
    with pytest.raises(ValueError, match="is a file"):
        resolve_model_path(tmp_path / "file.bin")
    with pytest.raises(ValueError, match="dtype"):
        load_policy(TINY, dtype="fp8")


@pytest.mark.slow
def test_smollm2_answers_paris(smollm2_path: Path) -> None:
    model, tokenizer = load_policy(smollm2_path)
    assert isinstance(model, LlamaForCausalLM)
    assert 134e6 < model.num_parameters() < 135e6
    assert not hasattr(model.config, "quantization_config")
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True, tokenize=False
    )
    ids = tokenizer(prompt, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=16, do_sample=False)
    answer = tokenizer.decode(out[0, ids.input_ids.shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer


def test_racing_builders_end_with_one_complete_copy(tmp_path: Path) -> None:
    dest = tmp_path / "model"

    def build_and_lose_the_race(tmp: Path) -> None:
        (tmp / "config.json").write_text("ours")
        dest.mkdir()  # another process renames its complete copy into place while we build
        (dest / "config.json").write_text("theirs")

    assert _materialize(dest, build_and_lose_the_race) == dest
    assert (dest / "config.json").read_text() == "theirs"
    assert os.listdir(tmp_path) == ["model"]


def test_failed_build_leaves_nothing(tmp_path: Path) -> None:
    def build_fails(tmp: Path) -> None:
        (tmp / "config.json").write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        _materialize(tmp_path / "model", build_fails)
    assert os.listdir(tmp_path) == []
