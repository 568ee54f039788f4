"""Where a fit's steps ran, recorded during the fit: a Lightning callback for tests that run ``fit_rl``.

Reading the module's parameters after ``fit`` returns says where they are now, not where the steps ran: Lightning's
strategy teardown (``Strategy.teardown``, single device and DDP) moves the module to the CPU when the fit ends (the
GPU smoke test that read ``next(module.policy.parameters()).device`` after the fit saw ``cpu`` after two steps on
cuda). ``DeviceProbe`` takes its record at the end of every training step, inside the fit.
"""

from __future__ import annotations

from typing import Any

import lightning as L


class DeviceProbe(L.Callback):
    """At the end of every training step: the step (the module's ``batches_done``, else the batch index + 1), the
    device types of all the module's parameters (the policy's and a reference's) and the module's own device.

    ``records``: one dict per step, in order: {"step": int, "param_devices": sorted device types, "device": str}.
    """

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.records.append(
            {
                "step": int(getattr(pl_module, "batches_done", batch_idx + 1)),
                "param_devices": sorted({p.device.type for p in pl_module.parameters()}),
                "device": pl_module.device.type,
            }
        )

    def devices(self) -> set[str]:
        """Every device type seen in any step (parameters and the module's own device)."""
        return {d for r in self.records for d in [*r["param_devices"], r["device"]]}
