"""tests/support/device_probe.py on the CPU: the record the GPU smoke tests read for where the steps ran is taken
inside the fit, once per step, and keeps saying so whatever happens to the module after the fit."""

from __future__ import annotations

import csv
from pathlib import Path

from device_probe import DeviceProbe


def test_the_probe_records_each_step_during_the_fit(make_cfg, tiny_path: Path, tmp_path: Path) -> None:
    from mempo.stages.train import fit_rl

    cfg = make_cfg(
        f"model.name_or_path={tiny_path}", "sampler=hf", "trainer.precision=32-true", "loss.kl_coef=1e-3",
        "advantage.estimator=test_signed", "optim.lr=1e-3", "data.batch_size=1", "data.group_size=2",
        "agent.max_turns=1", "sampler.max_new_tokens=4", "trainer.max_steps=2", "ckpt.every_n_steps=5",
        "eval.every_n_steps=0", f"run_dir={tmp_path}",
    )  # fmt: skip
    probe = DeviceProbe()
    module, summary = fit_rl(cfg, callbacks=[probe])
    assert summary["steps"] == 2
    assert probe.records == [
        {"step": 1, "param_devices": ["cpu"], "device": "cpu"},
        {"step": 2, "param_devices": ["cpu"], "device": "cpu"},
    ]
    assert module.reference is not None  # kl on: the reference's parameters were among those recorded
    rows = list(csv.DictReader((tmp_path / "metrics.csv").open()))
    assert float(rows[-1]["train/kl"]) > 0
    # After the fit the module may be moved anywhere (Lightning's teardown moves it to the CPU): the records stay.
    module.to("meta")
    assert next(module.policy.parameters()).device.type == "meta"
    assert probe.devices() == {"cpu"}
