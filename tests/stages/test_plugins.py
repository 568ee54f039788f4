"""A user's reward, retriever and advantage estimator by import path (mempo.stages.plugins): the examples under
examples/ checked against hand-worked values, run for an RL step on the tiny model through the guide's own commands,
every kind of bad path refused before any model loads naming the key, edited code refused on resume, and a file-path
estimator used on both ranks of a two-process run."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from mempo.losses import ADVANTAGE_ESTIMATORS, AdvantageConfig, MemoryConfig
from mempo.rollout.retrievers import Passage, make_retriever
from mempo.rollout.rewards import trajectory_reward
from mempo.stages import run_stage
from mempo.stages.config import compose_config
from mempo.stages.plugins import probe_inputs

ROOT = Path(__file__).resolve().parents[2]
REWARD = "examples/entity_reward.py:entity_reward"
RETRIEVER = "examples/function_retriever.py:KeywordSearch"
ESTIMATOR = "examples/rloo_advantage.py:rloo"
SMALL = ["+debug=default", "trainer.max_steps=1", "eval.every_n_steps=0"]


def test_the_entity_reward_by_hand() -> None:
    """Registered by the config, called by the rollout's own reward function with the format gate."""
    cfg = compose_config("model=tiny", f"reward.kind={REWARD}")
    gold = (("Paris",), ("1990",))
    # exact + exact = 1; exact + a wrong year (right kind) = (1 + 0.25) / 2; a place for a year = (1 + 0) / 2
    assert trajectory_reward("Paris; 1990", gold, format_ok=True, kind=cfg.reward.kind) == 1.0
    assert trajectory_reward("Paris; 2020", gold, format_ok=True, kind=cfg.reward.kind) == 0.625
    assert trajectory_reward("Paris; Rome", gold, format_ok=True, kind=cfg.reward.kind) == 0.5
    assert trajectory_reward("Paris; 1990", gold, format_ok=False, kind=cfg.reward.kind) == 0.0


def test_the_function_retriever_by_hand(tmp_path: Path) -> None:
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "a", "contents": "\\"Ann\\"\\nAnn lives in Rome."}\n'
                      '{"id": "b", "contents": "\\"Bob\\"\\nBob lives in Rome and Oslo."}\n')  # fmt: skip
    cfg = compose_config("model=tiny", f"env.retriever={RETRIEVER}")
    retriever = make_retriever(cfg.env.retriever, corpus=str(corpus))
    got = retriever.retrieve(["bob oslo", "rome", "zzz"], 2)
    # "bob oslo": b shares 2 words, a none; "rome": both share 1, corpus order; "zzz": nothing
    assert [[p.id for p in ps] for ps in got] == [["b"], ["a", "b"], []]
    assert all(isinstance(p, Passage) for ps in got for p in ps)


def test_the_rloo_estimator_by_hand() -> None:
    """Two groups: rewards (1, 0, 0) and (1, 1). Leave-one-out: 1 - 0 = 1, 0 - 0.5 = -0.5 (twice); 1 - 1 = 0."""
    from dataclasses import replace

    compose_config("model=tiny", f"advantage.estimator={ESTIMATOR}")
    fn = ADVANTAGE_ESTIMATORS[ESTIMATOR]
    x = probe_inputs()
    x = replace(x, rewards=torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0]), group_ids=torch.tensor([0, 0, 0, 1, 1]),
                traj_ids=torch.tensor([0, 1, 2, 3, 4]), turn_ids=torch.zeros(5, dtype=torch.long),
                response_mask=torch.tensor([[True, True, False]] * 5))  # fmt: skip
    out = fn(x, MemoryConfig(), AdvantageConfig())
    want = torch.tensor([[1.0, 1.0, 0.0], [-0.5, -0.5, 0.0], [-0.5, -0.5, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(out, want)
    assert AdvantageConfig(estimator=ESTIMATOR).needs_memory_scores is False


def guide_commands() -> list[str]:
    """The extending guide's commands (``python experiments/run.py ...`` lines of its bash blocks)."""
    text = (ROOT / "docs" / "guide" / "extending.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    return [line.strip() for b in blocks for line in b.splitlines() if line.startswith("python experiments/run.py")]


def test_the_guide_has_one_command_per_example() -> None:
    cmds = guide_commands()
    assert len(cmds) == 3 and all(any(spec in c for c in cmds) for spec in (REWARD, RETRIEVER, ESTIMATOR))


@pytest.mark.parametrize("index", [0, 1, 2])
def test_each_guide_command_runs_a_step_on_the_tiny_model(tmp_path: Path, index: int) -> None:
    """The guide's command as a user types it, shrunk (+debug=default: the tiny model, the HF sampler; one step),
    from the repository root: the run records the example's file and hash in its config.yaml."""
    args = [a for a in guide_commands()[index].split()[2:] if not a.startswith("run_dir=")]
    small = [*SMALL, "model.train_top_layers=null"]  # grpo_cpu trains its top 8 layers; the tiny model has fewer
    run = subprocess.run([sys.executable, "experiments/run.py", *args, *small, f"run_dir={tmp_path}"], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    saved = OmegaConf.to_container(OmegaConf.load(tmp_path / "config.yaml"))
    (code,) = saved["provenance"]["code"].values()
    spec = next(s for s in (REWARD, RETRIEVER, ESTIMATOR) if any(s in a for a in args))
    assert code["resolved"] == f"{ROOT / spec.split(':')[0]}:{spec.split(':')[1]}"
    assert (tmp_path / "hf" / "config.json").is_file()


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("reward.kind=no_such_pkg.rewards:fn", r"reward\.kind='no_such_pkg\.rewards:fn': no module 'no_such_pkg"),
        ("reward.kind=examples/entity_reward.py:no_fn", r"reward\.kind=.*has no 'no_fn'"),
        ("reward.kind=examples/missing.py:fn", r"reward\.kind=.*: no file .*missing\.py"),
        (
            "reward.kind=examples/entity_reward.py:entity_kind",
            r"reward\.kind=.*entity_kind\(text: 'str'\) -> 'str' cannot be "
            r"called as fn\(answer, gold_answers\)",
        ),
        (
            "env.retriever=examples/entity_reward.py:entity_reward",
            r"env\.retriever=.*cannot be called as "
            r"Factory\(corpus=PATH\)",
        ),
        (
            "advantage.estimator=examples/entity_reward.py:entity_reward",
            r"advantage\.estimator=.*cannot be called as "
            r"fn\(inputs, memory, advantage\)",
        ),
    ],
)
def test_a_bad_import_path_is_refused_before_anything_loads_naming_the_key(override: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        compose_config("model=tiny", override)


def test_a_wrong_return_type_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "def reward(answer, gold_answers):\n    return 'yes'\n"
        "class Dicts:\n    def __init__(self, corpus):\n        pass\n"
        "    def retrieve(self, queries, topk):\n        return [[{'id': 'x'}] for _ in queries]\n"
        "def estimator(x, memory, advantage):\n    return x.rewards\n"
    )
    cases = [
        (f"reward.kind={bad}:reward", r"reward\.kind=.*returned 'yes' \(str\).*a reward returns a finite float"),
        (
            f"env.retriever={bad}:Dicts",
            r"env\.retriever=.*returned \[\[\{'id': 'x'\}\]\]; expected one list of "
            r"mempo\.rollout\.retrievers\.Passage",
        ),
        (
            f"advantage.estimator={bad}:estimator",
            r"advantage\.estimator=.*returned \(2,\) for a probe of 2 turns x 3 "
            r"tokens; expected a float Tensor \[N, T\]",
        ),
    ]
    for override, message in cases:
        with pytest.raises(ValueError, match=message):
            compose_config("model=tiny", override)


def test_a_run_resumed_under_edited_code_is_refused(tmp_path: Path) -> None:
    reward = tmp_path / "my_reward.py"
    reward.write_text((ROOT / "examples" / "entity_reward.py").read_text())
    base = ["+exp=ablation_nomem", *SMALL, f"reward.kind={reward}:entity_reward", f"run_dir={tmp_path / 'run'}"]
    run_stage(compose_config(*base))
    reward.write_text(reward.read_text().replace("PARTIAL = 0.25", "PARTIAL = 0.5"))
    with pytest.raises(ValueError, match=r"provenance\.code\.reward\.sha256 \([0-9a-f]{16} -> [0-9a-f]{16}\)"):
        run_stage(compose_config(*base, "resume=true", "trainer.max_steps=2"))


def test_a_file_path_estimator_runs_on_both_ranks_of_a_two_process_run(tmp_path: Path, monkeypatch) -> None:
    """Lightning starts rank 1 by running the script again: the rank validates the config itself, so the file is
    imported, checked and registered there too, and both ranks update with it."""
    from parallel_probe import run_fsdp_probe

    markers = tmp_path / "markers"
    markers.mkdir()
    monkeypatch.setenv("MEMPO_RANK_MARKERS", str(markers))
    spec = f"advantage.estimator={ROOT / 'tests' / 'support' / 'rank_estimator.py'}:rank_signed"
    ranks = run_fsdp_probe(tmp_path / "run", "ddp", "hf", "trainer.max_steps=1", spec)
    assert sorted(p.name for p in markers.iterdir()) == ["estimator-rank0", "estimator-rank1"]
    torch.testing.assert_close(ranks[0]["weights"][1], ranks[1]["weights"][1])  # one synchronized update
