"""Hydra entry point: ``python experiments/eval.py [+exp=NAME] [key=value ...]``, the same as
``python experiments/run.py stage=eval ...`` (``mempo.stages.evaluate``).

Evaluates ``model.name_or_path`` (or every folder of ``eval.checkpoints``) as a memory agent (MemPO) and a
full-history agent (ReAct baseline) on the same val tasks for each N in ``eval.objectives``; writes tables,
results.jsonl, memory scores and figures into ``<run_dir>/eval/``. The same config tree and overrides as run.py.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from mempo.stages import run_stage, with_overrides
from mempo.stages.config import validate_config  # importing it registers the schema config.yaml composes onto


@hydra.main(config_path="configs", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    run_stage(with_overrides(validate_config(cfg), {"stage": "eval"}))


if __name__ == "__main__":
    main()
