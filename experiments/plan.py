"""Hydra entry point: ``python experiments/plan.py [+exp=NAME] [key=value ...]``: whether a run fits, per GPU.

Composes and validates the config exactly as ``experiments/run.py`` does (the same overrides), then prints the memory
plan of ``mempo.capacity.gpu_memory`` against ``plan.gpu_gib`` (``plan.gpu_gib=24`` for a 24 GB GPU); the last line is
``fits: yes`` or ``fits: no (needs N GiB, has M GiB)``. Nothing loads: the model's shape comes from its config.json.
Exits 0 either way; 1 when the config is one the plan does not model (the message names the key).
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from mempo.capacity.gpu_memory import plan_memory, render
from mempo.stages.config import validate_config  # importing it registers the schema config.yaml composes onto


@hydra.main(config_path="configs", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    cfg = validate_config(cfg)
    try:
        plan = plan_memory(cfg)
    except ValueError as e:
        sys.exit(f"plan: {e}")
    print(render(plan, f"{cfg.name} (stage {cfg.stage})"))


# A plan writes nothing: no run folder, no .hydra copy of the config, no log file (given first, so a user's own
# hydra.* overrides still win).
QUIET = ["hydra.run.dir=.", "hydra.output_subdir=null", "hydra/job_logging=disabled", "hydra/hydra_logging=disabled"]

if __name__ == "__main__":
    sys.argv[1:1] = QUIET
    main()
