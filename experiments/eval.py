"""Hydra entry point: ``python experiments/eval.py [+exp=NAME] [key=value ...]``.

Evaluates ``model.name_or_path`` (or every folder of ``eval.checkpoints``) as a memory agent (MemPO) and a
full-history agent (ReAct baseline) on the same val tasks for each N in ``eval.objectives``; writes tables,
results.jsonl, memory scores and figures into ``<run_dir>/eval/``. The same config tree and overrides as run.py.
"""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig

from mempo.config import validate_config  # importing it registers the schema config.yaml composes onto
from mempo.console import setup_console
from mempo.eval.compare import run_eval


@hydra.main(config_path="configs", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    cfg = validate_config(cfg)
    log = setup_console(cfg.run_dir, cfg.verbose)
    if not cfg.verbose:
        print(f"[mempo] eval: library logs and warnings go to {log} (verbose=true prints them here too)")
    result = run_eval(cfg)
    print(Path(result["out"], "intervals.md").read_text())
    if Path(result["out"], "failures.md").is_file():
        print("\nFailure verdicts per objective (mempo.eval.failures):\n")
        print(Path(result["out"], "failures.md").read_text())
    print(f"[mempo] eval outputs: {result['out']}")


if __name__ == "__main__":
    main()
