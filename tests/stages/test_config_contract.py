"""One source of truth for the config: every YAML key is a field of its group's dataclass, a group option states only
its deltas from the field defaults, and the default option of a group restates nothing (the dataclass defaults are
the defaults). Values here come from reading the YAML files and the dataclass fields, not from composing."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from mempo.stages.config import CONFIG_DIR, RootConfig

GROUP_FIELDS = {f.name: f for f in dataclasses.fields(RootConfig)}
GROUPS = sorted(p.name for p in CONFIG_DIR.iterdir() if p.is_dir() and p.name not in ("exp", "debug"))


def field_defaults(cls: type) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        else:
            out[f.name] = f.default_factory()  # type: ignore[misc]
    return out


def group_class(group: str) -> type:
    return GROUP_FIELDS[group].default_factory  # type: ignore[return-value]


def load(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text()) or {}


def yaml_keys(tree: dict[str, Any], prefix: str = "") -> list[str]:
    keys = []
    for k, v in tree.items():
        if k in ("defaults", "hydra"):  # the defaults list, and Hydra's own settings (run dir, job)
            continue
        if isinstance(v, dict) and not (prefix + k).endswith(("eval.checkpoints", "study.arms")):  # free-form maps
            keys += yaml_keys(v, f"{prefix}{k}.")
        else:
            keys.append(prefix + k)
    return keys


def has_field(dotted: str) -> bool:
    cls: Any = RootConfig
    for part in dotted.split("."):
        fields = {f.name: f for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else {}
        if part not in fields:
            return False
        f = fields[part]
        cls = (
            f.default_factory
            if f.default is dataclasses.MISSING and dataclasses.is_dataclass(f.default_factory)
            else None
        )
    return True


def default_options() -> dict[str, str]:
    entries = load(CONFIG_DIR / "config.yaml")["defaults"]
    return {k: v for e in entries if isinstance(e, dict) for k, v in e.items()}


OPTIONS = [(g, p) for g in GROUPS for p in sorted((CONFIG_DIR / g).glob("*.yaml"))]
EVERY_YAML = sorted(CONFIG_DIR.rglob("*.yaml"))


@pytest.mark.parametrize("path", EVERY_YAML, ids=lambda p: str(p.relative_to(CONFIG_DIR)))
def test_every_yaml_key_is_a_field(path):
    """config.yaml, experiments and debug set global keys (``# @package _global_``); group options their group's."""
    rel = path.relative_to(CONFIG_DIR)
    prefix = "" if len(rel.parts) == 1 or rel.parts[0] in ("exp", "debug") else rel.parts[0] + "."
    missing = [k for k in yaml_keys(load(path), prefix) if not has_field(k)]
    assert not missing, f"{rel}: keys with no dataclass field: {missing}"


@pytest.mark.parametrize(("group", "path"), OPTIONS, ids=lambda x: x if isinstance(x, str) else x.stem)
def test_group_options_state_only_deltas(group, path):
    defaults = field_defaults(group_class(group))
    restated = {k: v for k, v in load(path).items() if k in defaults and v == defaults[k]}
    assert not restated, f"{group}/{path.name} restates field defaults (state only deltas): {restated}"


@pytest.mark.parametrize("group", sorted(default_options()))
def test_a_groups_default_option_agrees_with_the_dataclass(group):
    """With every key a delta, the default option must be empty: its dataclass's defaults are the group's."""
    option = CONFIG_DIR / group / f"{default_options()[group]}.yaml"
    assert load(option) == {}, f"{option.name} sets {load(option)}; move them into the field defaults"


def test_the_check_catches_a_restated_default_and_an_unknown_key(tmp_path):
    """The bugs these tests guard against: a YAML copy of a default, and a key the schema does not have."""
    bad = tmp_path / "vllm.yaml"
    bad.write_text("max_new_tokens: 96\nbackend: vllm\ntemperature: 0.5\n")
    defaults = field_defaults(group_class("sampler"))
    assert {k for k, v in load(bad).items() if v == defaults[k]} == {"max_new_tokens", "backend"}
    assert not has_field("sampler.no_such_key") and has_field("sampler.max_new_tokens")
    assert has_field("eval.checkpoints") and not has_field("eval.checkpoints.x.y")
