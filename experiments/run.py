"""Hydra entry point: ``python experiments/run.py [+exp=NAME] [key=value ...]``; ``-m`` sweeps (docs/guide/sweeps.md).

Composes ``experiments/configs`` (an experiment file overrides the main config globally), sets ``run_dir`` to
Hydra's output folder of the job (a multirun's job: ``<run_dir>/<job number>``; a W&B sweep agent's run:
``<run_dir>/sweep-<sweep id>/<run id>``) and records the sweep, the job and its overrides (``sweep``;
``mempo.stages.rundir.hydra_job``), validates the config against ``mempo.stages.config`` (unknown keys and bad
values fail here, naming the key, before any model loads) and runs the configured stage.
"""

from __future__ import annotations

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from mempo.stages import run_stage
from mempo.stages.config import validate_config  # importing it registers the schema config.yaml composes onto
from mempo.stages.rundir import hydra_job


@hydra.main(config_path="configs", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    cfg = validate_config(OmegaConf.merge(OmegaConf.to_container(cfg), hydra_job(HydraConfig.get())))
    run_stage(cfg)


if __name__ == "__main__":
    main()
