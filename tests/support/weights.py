"""Test helper: change a saved policy's weights in place, as a warm start trained again into its folder leaves it."""

from __future__ import annotations

from pathlib import Path


def retrain_in_place(hf: Path) -> None:
    """Other weights in the same HF folder (one tensor of model.safetensors moved by 0.01), its config untouched."""
    from safetensors.torch import load_file, save_file

    path = Path(hf) / "model.safetensors"
    tensors = load_file(path)
    name = sorted(tensors)[-1]
    tensors[name] = tensors[name] + 0.01
    save_file(tensors, path, metadata={"format": "pt"})
