"""Test helper: record which checkpoints an evaluation really evaluates (``mempo.stages.evaluate.evaluate_grid``)."""

from __future__ import annotations

import pytest


def record_evaluated(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Wrap ``evaluate_grid`` for this test -> the list its calls' checkpoint labels are appended to, in order."""
    import mempo.stages.evaluate as evaluate_stage

    evaluated: list[str] = []
    real = evaluate_stage.evaluate_grid

    def counting(*args, checkpoint, **kwargs):
        evaluated.append(checkpoint)
        return real(*args, checkpoint=checkpoint, **kwargs)

    monkeypatch.setattr(evaluate_stage, "evaluate_grid", counting)
    return evaluated
