"""Every shipped config composes and validates; bad keys and values fail naming the key."""

import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

from mempo.stages.config import validate_config

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "experiments" / "configs"
EXPERIMENTS = sorted(p.stem for p in (CONFIGS / "exp").glob("*.yaml"))


def compose_cfg(*overrides: str):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def test_the_expected_experiments_ship():
    assert {"mempo", "ablation_nomem", "grpo_react", "sft", "demo"} <= set(EXPERIMENTS)


@pytest.mark.parametrize("exp", EXPERIMENTS)
def test_every_experiment_composes_and_validates(exp):
    cfg = validate_config(compose_cfg(f"+exp={exp}"))
    assert cfg.name == exp


@pytest.mark.parametrize("exp", EXPERIMENTS)
def test_every_experiment_takes_the_documented_overrides(exp, tmp_path):
    overrides = [
        f"+exp={exp}",
        "model=tiny",
        "sampler=hf",
        "logger=wandb",
        "trainer.max_steps=3",
        "data.batch_size=2",
        "data.group_size=3",
        "data.objectives=1",
        "ckpt.every_n_steps=1",
        f"run_dir={tmp_path}",
        "resume=true",
    ]
    cfg = validate_config(compose_cfg(*overrides))
    assert (cfg.model.name_or_path, cfg.sampler.backend, cfg.logger.kind) == ("tiny", "hf", "wandb")
    assert (cfg.trainer.max_steps, cfg.data.batch_size, cfg.data.group_size) == (3, 2, 3)
    assert cfg.run_dir == str(tmp_path) and cfg.resume is True


@pytest.mark.parametrize("group", ["model", "sampler", "env", "data", "loss", "trainer", "logger"])
def test_every_group_option_validates(group):
    for option in sorted(p.stem for p in (CONFIGS / group).glob("*.yaml")):
        extra = ["data.train_files=[x.jsonl]"] if (group, option) == ("data", "qa_files") else []
        validate_config(compose_cfg(f"{group}={option}", *extra))


def test_ablation_nomem_is_the_default_with_alpha_zero():
    base = OmegaConf.to_container(validate_config(compose_cfg()), resolve=True)
    ablation = OmegaConf.to_container(validate_config(compose_cfg("+exp=ablation_nomem")), resolve=True)
    assert ablation["memory"]["alpha"] == 0.0
    base["memory"]["alpha"], base["name"], base["run_dir"] = 0.0, "ablation_nomem", "runs/ablation_nomem"
    base["stage"] = "rl"
    assert ablation == base  # the delta is exactly alpha (and the name, and RL only)


def test_debug_group_shrinks_a_run():
    cfg = validate_config(compose_cfg("+exp=mempo", "+debug=default"))
    assert cfg.model.name_or_path == "tiny" and cfg.trainer.max_steps == 2


@pytest.mark.parametrize("exp", [None, *EXPERIMENTS])
def test_debug_shrinks_the_experiment_it_is_given_without_switching_it(exp):
    """Regression: debug/default.yaml set ``stage: rl``, so ``+exp=sft +debug=default`` (and the demo) ran RL."""
    given = [f"+exp={exp}"] if exp else []
    full = validate_config(compose_cfg(*given))
    small = validate_config(compose_cfg(*given, "+debug=default"))
    assert small.stage == full.stage
    assert (small.agent.context, small.advantage.estimator, small.memory.alpha) == (
        full.agent.context, full.advantage.estimator, full.memory.alpha,
    )  # fmt: skip
    assert small.model.name_or_path == "tiny" and small.sampler.backend == "hf"
    assert small.trainer.max_steps <= 2 and small.data.batch_size <= 2 and small.sft.num_tasks <= 4
    assert small.sft.max_steps <= 2 and small.eval.num_tasks <= 2


def test_unknown_key_is_an_error_naming_it():
    with pytest.raises(ConfigKeyError, match="no_such_key"):
        validate_config(OmegaConf.merge(compose_cfg(), {"loss": {"no_such_key": 1}}))


def test_wrong_type_is_an_error_naming_the_key():
    with pytest.raises(ValidationError, match="group_size"):
        validate_config(OmegaConf.merge(compose_cfg(), {"data": {"group_size": "many"}}))


@pytest.mark.parametrize(
    "override, key",
    [
        ("data.group_size=1", "data.group_size"),
        ("loss.eps_low=1.5", "loss.eps_low"),
        ("loss.eps_low=0", "loss.eps_low"),
        ("memory.baseline=oracle", "memory.baseline"),
        ("memory.normalize=global", "memory.normalize"),
        ("env.retriever=faiss", "env.retriever"),
        ("loss.agg=sum", "loss.agg"),
        ("reward.kind=bleu", "reward.kind"),
        ("agent.context=tree", "agent.context"),
    ],
)
def test_invalid_values_name_the_key(override, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        validate_config(compose_cfg(override))


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "experiments" / "run.py"), *args], capture_output=True, text=True, timeout=120
    )


def test_cli_missing_experiment_lists_the_known_ones():
    out = _run("+exp=missing")
    assert out.returncode != 0
    for exp in EXPERIMENTS:
        assert exp in out.stderr


def test_cli_unknown_key_names_it():
    out = _run("loss.no_such_key=1")
    assert out.returncode != 0
    assert "no_such_key" in out.stderr


@pytest.mark.parametrize("arg", ["no_such_key=1", "+no_such_key=1", "loss.no_such_key=1"])
def test_an_unknown_key_in_any_form_names_it(arg):
    """What run.py does to an override (compose, then validate), in process: the CLI case above shows the error
    reaching the console; each form is refused here, by Hydra (a key it does not have) or by the schema (an added
    one)."""
    with pytest.raises(Exception, match="no_such_key"):
        validate_config(compose_cfg(arg))


@pytest.mark.parametrize("exp", EXPERIMENTS)
def test_every_experiment_instantiates_its_typed_configs(exp):
    """Every experiment's groups turn into the typed objects the code takes (no model weights needed)."""
    from mempo.losses import LossConfig, MemoryConfig
    from mempo.rollout.agent import AgentConfig
    from mempo.stages.builders import build_optim_config, build_tags, group

    cfg = validate_config(compose_cfg(f"+exp={exp}"))
    loss = group(cfg, "loss")
    assert isinstance(loss, LossConfig) and loss.kl_coef == cfg.loss.kl_coef and loss.agg == cfg.loss.agg
    agent = group(cfg, "agent")
    assert isinstance(agent, AgentConfig) and agent.context == cfg.agent.context
    assert group(cfg, "sampler").sampling(seed=0).max_new_tokens == cfg.sampler.max_new_tokens
    memory = group(cfg, "memory")
    assert isinstance(memory, MemoryConfig) and memory.alpha == cfg.memory.alpha
    assert build_optim_config(cfg).lr == cfg.optim.lr and build_optim_config(cfg).old_logp in ("sampler", "recompute")
    assert build_tags(cfg).stop_strings() == ("</search>", "</answer>")


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ((), "sampler"),  # the CPU default: vLLM samples in float32, its log-probs are exact
        (("+exp=mempo",), "recompute"),  # the paper setting: a bf16 engine
        (("sampler.dtype=bfloat16",), "recompute"),
        (("sampler=hf", "model=tiny"), "sampler"),  # HF sampling runs the float32 policy itself
        (("sampler.dtype=bfloat16", "optim.old_logp=sampler"), "sampler"),  # an explicit choice stands
        (("optim.old_logp=recompute",), "recompute"),
    ],
)
def test_old_logp_auto_reuses_the_samplers_logprobs_only_when_exact(overrides, expected):
    from mempo.stages.builders import build_optim_config

    assert build_optim_config(validate_config(compose_cfg(*overrides))).old_logp == expected


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k: v})
    return out


@pytest.mark.parametrize("exp", ["grpo_cpu", "grpo_cpu_fast", "grpo_cpu_40", "grpo_cpu_lora", "ablation_nomem"])
def test_exp_delta_is_what_hydra_composes(exp):
    """exp_delta (what a study's recipe, the demo's RL phase and the headline apply on top of a config) against Hydra
    itself: applied to the base config it gives exactly the config ``+exp=<exp>`` composes, defaults lists of other
    exp files included, e.g. grpo_cpu_40 -> grpo_cpu_fast -> grpo_cpu."""
    from mempo.stages.config import exp_delta

    base = _flat(OmegaConf.to_container(compose_cfg()))
    composed = _flat(OmegaConf.to_container(compose_cfg(f"+exp={exp}")))
    delta = exp_delta(exp)
    applied = {**base, **delta}
    changed = {k for k in composed if k not in ("name", "stage") and composed[k] != base.get(k)}
    assert changed <= set(delta), f"keys Hydra set that exp_delta misses: {changed - set(delta)}"
    assert {k: applied[k] for k in delta} == {k: composed[k] for k in delta}


def test_exp_delta_refuses_group_swaps_and_cycles(tmp_path, monkeypatch):
    import mempo.stages.config as config

    with pytest.raises(ValueError, match=r"exp/mempo.yaml: defaults entry .*override /model.* swaps a config group"):
        config.exp_delta("mempo")
    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "a.yaml").write_text("defaults:\n  - b\noptim: {lr: 1.0}\n")
    (tmp_path / "exp" / "b.yaml").write_text("defaults:\n  - a\n")
    (tmp_path / "exp" / "c.yaml").write_text("defaults:\n  - nowhere\n")
    (tmp_path / "exp" / "d.yaml").write_text("defaults:\n  - _self_\n  - e\noptim: {lr: 1.0}\n")
    (tmp_path / "exp" / "e.yaml").write_text("optim: {lr: 2.0, weight_decay: 0.5}\n")
    monkeypatch.setattr(config, "CONFIG_DIR", tmp_path)
    with pytest.raises(ValueError, match=r"exp/a.yaml: its defaults list includes itself \(a -> b -> a\)"):
        config.exp_delta("a")
    with pytest.raises(ValueError, match=r"exp/nowhere.yaml: no such file .* \(in the defaults list of exp/c.yaml\)"):
        config.exp_delta("c")
    assert config.exp_delta("d") == {"optim.lr": 2.0, "optim.weight_decay": 0.5}  # _self_ first: e's keys win
