"""The RL update's decoder layers compiled with ``torch.compile`` (``optim.compile_update``), only while it runs.

On a 2-core CPU the update's forward and backward spend about a third of their time in small element-wise kernels
(RMSNorm, rotary embeddings, SiLU, dtype casts under bf16 autocast) that run one after another in eager mode;
inductor fuses them. The compiled layers are the same modules with the same parameters (state dicts, checkpoints
and weight pushes see nothing), switched on inside ``CompiledLayers.active()`` and off outside it, so every other
forward of the policy (memory scoring, the weight canary, the HF export) stays eager. Fused kernels round
differently from eager ones: a compiled forward's log-probs are not bit-identical to an eager one's, which is why
the switch is for the path whose old log-probs come from this same compiled forward (``optim.old_logp=recompute``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


class CompiledLayers:
    """Compiles each decoder layer of ``model`` once (``dynamic=True``: one graph for every batch and sequence
    length) and installs the compiled call only inside ``active()``."""

    def __init__(self, model: torch.nn.Module) -> None:
        layers = getattr(model.get_decoder(), "layers", None)
        if layers is None:
            raise ValueError(f"optim.compile_update: {type(model).__name__} has no decoder .layers to compile")
        self.layers = list(layers)
        # What nn.Module.compile installs, built once per layer and kept while the switch is off.
        self.calls = [torch.compile(layer._call_impl, dynamic=True) for layer in self.layers]

    @contextmanager
    def active(self) -> Iterator[None]:
        for layer, call in zip(self.layers, self.calls):
            layer._compiled_call_impl = call
        try:
            yield
        finally:
            for layer in self.layers:
                layer._compiled_call_impl = None
