"""Hydra entry point: ``python experiments/run.py [+exp=NAME] [key=value ...]``.

Composes ``experiments/configs`` (an experiment file overrides the main config globally), validates it against
``mempo.stages.config`` (unknown keys and bad values fail here, naming the key, before any model loads) and runs the
configured stage.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from mempo.stages import run_stage
from mempo.stages.config import validate_config  # importing it registers the schema config.yaml composes onto


@hydra.main(config_path="configs", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    cfg = validate_config(cfg)
    run_stage(cfg)


if __name__ == "__main__":
    main()
