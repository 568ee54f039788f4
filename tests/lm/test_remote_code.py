"""``trust_remote_code``: a model folder that ships its own Python code runs it only when configured.

The folder is ``tiny`` plus an ``auto_map`` to a ``custom.py`` that leaves a marker file when imported. Each load
runs in a fresh interpreter with its own ``HF_MODULES_CACHE``, so no imported module leaks between cases.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CUSTOM = """
import os
from transformers import LlamaConfig, LlamaForCausalLM

with open(os.environ["MARKER"], "a") as f:
    f.write("remote code ran\\n")


class CustomConfig(LlamaConfig):
    pass


class CustomModel(LlamaForCausalLM):
    config_class = CustomConfig
"""

LOAD = {
    "default": "from mempo.lm.loading import load_policy; load_policy(FOLDER)",
    "trusted": "from mempo.lm.loading import load_policy; load_policy(FOLDER, trust_remote_code=True)",
    "config_default": "build(FOLDER, [])",
    "config_trusted": "build(FOLDER, ['model.trust_remote_code=true'])",
}
BUILD = """
from omegaconf import OmegaConf
from mempo.stages.builders import build_module
from mempo.stages.config import validate_config

def build(folder, extra):
    dots = [f"model.name_or_path={folder}", "sampler.backend=hf", "loss.kl_coef=0", *extra]
    build_module(validate_config(OmegaConf.from_dotlist(dots)))
"""


@pytest.fixture(scope="module")
def remote_code_folder(tiny_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("remote") / "model"
    shutil.copytree(tiny_path, folder)
    (folder / "custom.py").write_text(CUSTOM)
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "custom.CustomConfig", "AutoModelForCausalLM": "custom.CustomModel"}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


CASES = [("default", False), ("trusted", True), ("config_default", False), ("config_trusted", True)]


@pytest.mark.parametrize(("case", "runs"), CASES)
def test_remote_code_runs_only_when_configured(remote_code_folder: Path, tmp_path: Path, case: str, runs: bool):
    marker = tmp_path / "marker"
    script = f"{BUILD}\nFOLDER = {str(remote_code_folder)!r}\n{LOAD[case]}\nprint('LOADED')\n"
    env = {
        **os.environ,
        "MARKER": str(marker),
        "HF_MODULES_CACHE": str(tmp_path / "modules"),
        "MEMPO_CACHE": str(tmp_path / "cache"),
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
    }
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0 and "LOADED" in out.stdout, out.stderr[-2000:]
    assert marker.exists() == runs, out.stderr[-2000:]
