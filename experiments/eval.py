"""Hydra entry point: ``python experiments/eval.py [+exp=NAME] [key=value ...]``, the same as
``python experiments/run.py stage=eval ...`` (``mempo.stages.evaluate``).

Evaluates ``model.name_or_path`` (or every folder of ``eval.checkpoints``) as a memory agent (MemPO) and a
full-history agent (ReAct baseline) on the same val tasks for each N in ``eval.objectives``; writes tables,
results.jsonl, memory scores and figures into ``<run_dir>/eval/``. The same config tree and overrides as run.py,
and the same run folders (a multirun's job: ``<run_dir>/<job number>``).
"""

from __future__ import annotations

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from mempo.stages import run_stage, with_overrides
from mempo.stages.config import validate_config  # importing it registers the schema config.yaml composes onto
from mempo.stages.rundir import hydra_job


@hydra.main(config_path="configs", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    cfg = validate_config(OmegaConf.merge(OmegaConf.to_container(cfg), hydra_job(HydraConfig.get())))
    run_stage(with_overrides(cfg, {"stage": "eval"}))


if __name__ == "__main__":
    main()
