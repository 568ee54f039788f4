"""Bad inputs fail before any model loads, naming the key (or file and line); outputs stay inside run_dir."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mempo.stages import run_stage
from mempo.stages.builders import run_path
from mempo.stages.config import check_paths
from mempo.stages.train import fit_rl

ROOT = Path(__file__).resolve().parents[2]
GOOD = {"question": "Who founded Brask Holdings?", "golden_answers": ["Ann"]}


def _jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("model.name_or_path=no/such/folder", "model.name_or_path"),
        ("model.name_or_path=./missing-model", "model.name_or_path"),
        ("model.name_or_path=not a model", "model.name_or_path"),
        ("env.corpus=/no/such/corpus.jsonl", "env.corpus"),
        ("sft.trajectories=/no/such/teacher.jsonl", "sft.trajectories"),
    ],
)
def test_missing_paths_name_the_key(make_cfg, override, key):
    with pytest.raises((FileNotFoundError, ValueError), match=f"config key {key}="):
        check_paths(make_cfg(override))


def test_missing_data_files_name_the_key_and_index(make_cfg, tmp_path):
    good = _jsonl(tmp_path / "train.jsonl", [GOOD])
    cfg = make_cfg("data=qa_files", f"data.train_files=[{good},{tmp_path / 'gone.jsonl'}]", "env=http")
    with pytest.raises(FileNotFoundError, match=r"config key data.train_files\[1\]=.*gone.jsonl"):
        check_paths(cfg)
    check_paths(make_cfg("data=qa_files", f"data.train_files=[{good}]", "env=http"))  # existing files pass


def test_model_folder_without_config_json_is_rejected(make_cfg, tmp_path):
    with pytest.raises(ValueError, match=r"config key model.name_or_path=.*no config.json"):
        check_paths(make_cfg(f"model.name_or_path={tmp_path}"))


def test_valid_model_names_pass_without_building_anything(make_cfg, mempo_cache):
    before = sorted(p.name for p in mempo_cache.iterdir())
    for name in ("tiny", "smollm2-135m-instruct", "Qwen/Qwen2.5-7B-Instruct"):
        check_paths(make_cfg(f"model.name_or_path={name}"))
    assert sorted(p.name for p in mempo_cache.iterdir()) == before  # checking never materializes a model


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([GOOD, "{broken"], r"train.jsonl, line 2: broken JSON line"),
        ([GOOD, {"question": "who?"}], r"train.jsonl, line 2: key 'golden_answers': missing"),
        ([{"question": "who?", "golden_answers": []}], r"line 1: key 'golden_answers': .*empty list"),
        ([{"question": 3, "golden_answers": ["x"]}], r"line 1: key 'question': expected a string"),
        ([], r"train.jsonl: no questions"),
    ],
)
def test_bad_training_data_fails_before_the_model_loads(make_cfg, tmp_path, monkeypatch, rows, message):
    """fit_rl reads the data before it builds the model: the (fresh) model cache stays empty."""
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("MEMPO_CACHE", str(cache))
    train = _jsonl(tmp_path / "train.jsonl", rows)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "1", "contents": "\\"Ann\\"\\nAnn is here."}\n')
    cfg = make_cfg(
        "model=tiny", "sampler=hf", "data=qa_files", f"data.train_files=[{train}]", f"env.corpus={corpus}",
        f"run_dir={tmp_path}/r",
    )  # fmt: skip
    with pytest.raises(ValueError, match=message):
        fit_rl(cfg)
    assert list(cache.iterdir()) == []


def test_run_stage_checks_paths_first(make_cfg, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("MEMPO_CACHE", str(cache))
    cfg = make_cfg("stage=sft", "model=tiny", "sft.trajectories=/no/such.jsonl", f"run_dir={tmp_path}/r")
    with pytest.raises(FileNotFoundError, match="config key sft.trajectories="):
        run_stage(cfg)
    assert list(cache.iterdir()) == [] and not (tmp_path / "r").exists()


@pytest.mark.parametrize("parts", [("..", "elsewhere"), ("/tmp/abs",), ("a", "..", "..", "b")])
def test_run_path_refuses_to_escape_run_dir(make_cfg, tmp_path, parts):
    cfg = make_cfg(f"run_dir={tmp_path / 'run'}")
    with pytest.raises(ValueError, match="escapes run_dir"):
        run_path(cfg, *parts)
    assert run_path(cfg, "a", "..", "b") == tmp_path / "run" / "b"
    assert run_path(cfg) == tmp_path / "run"


def test_cli_bad_model_path_fails_naming_the_key_and_writes_only_into_run_dir(tmp_path):
    """Hydra's own outputs (.hydra/, the job log) go to run_dir, not to the working directory."""
    cwd, run = tmp_path / "cwd", tmp_path / "run"
    cwd.mkdir()
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "experiments" / "run.py"),
            "stage=rl",
            "model.name_or_path=./no-model",
            f"run_dir={run}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env={**__import__("os").environ, "MEMPO_CACHE": str(tmp_path / "cache")},
    )
    assert out.returncode != 0
    assert "config key model.name_or_path='./no-model'" in out.stderr
    assert list(cwd.iterdir()) == []
    assert (run / ".hydra" / "config.yaml").is_file()
    assert not (tmp_path / "cache").exists()  # no model was built


def test_real_data_against_the_synthetic_corpus_is_refused(make_cfg, tmp_path):
    """data=qa_files with env=bm25 and env.corpus=null searched the synthetic world (rewards about 0,
    nothing said why). A corpus of the user's own, or env=http, stays legitimate."""
    train = _jsonl(tmp_path / "train.jsonl", [GOOD])
    with pytest.raises(ValueError, match=r"data.source=qa_files with env.retriever=bm25 and env.corpus=null"):
        check_paths(make_cfg("data=qa_files", f"data.train_files=[{train}]"))
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "1", "contents": "x"}\n')
    check_paths(make_cfg("data=qa_files", f"data.train_files=[{train}]", f"env.corpus={corpus}"))
    check_paths(make_cfg("data=qa_files", f"data.train_files=[{train}]", "env=http"))


def test_warm_start_on_real_data_needs_a_teacher_file(make_cfg, tmp_path, tiny_path):
    """stage=sft (and demo, headline through it) on real data without sft.trajectories trained on the
    synthetic oracle and replayed its fictional queries against the real retriever."""
    from mempo.lm.loading import load_tokenizer
    from mempo.stages.train import sft_data

    train = _jsonl(tmp_path / "train.jsonl", [GOOD])
    cfg = make_cfg("data=qa_files", f"data.train_files=[{train}]", "env=http", "model=tiny")
    with pytest.raises(ValueError, match=r"sft.trajectories=null with data.source=qa_files.*\"turns\""):
        sft_data(cfg, load_tokenizer(tiny_path))


@pytest.mark.parametrize("stage", ["sft", "demo", "headline", "study"])
def test_a_warm_start_on_real_data_without_a_teacher_is_refused_before_any_model_loads(
    make_cfg, tmp_path, monkeypatch, stage
):
    """The same refusal from run_stage, before a model (7B, say) is loaded or the run folder made; the study trains
    the demo's warm start only without study.warm_start, and RL from a checkpoint of the user's own needs no teacher."""
    from mempo.stages.config import trains_warm_start

    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("MEMPO_CACHE", str(cache))
    train = _jsonl(tmp_path / "train.jsonl", [GOOD])
    keys = ["data=qa_files", f"data.train_files=[{train}]", "env=http", "model=tiny", f"run_dir={tmp_path}/r"]
    with pytest.raises(ValueError, match=r"sft.trajectories=null with data.source=qa_files"):
        run_stage(make_cfg(*keys, f"stage={stage}"))
    assert list(cache.iterdir()) == [] and not (tmp_path / "r").exists()
    assert not trains_warm_start(make_cfg(*keys, "stage=rl"))
    assert not trains_warm_start(make_cfg(*keys, "stage=study", f"study.warm_start={tmp_path}"))


def test_a_missing_test_file_is_named_before_any_model_loads(make_cfg, tmp_path):
    from mempo.stages.config import check_paths

    train = _jsonl(tmp_path / "train.jsonl", [GOOD])
    cfg = make_cfg("data=qa_files", f"data.train_files=[{train}]", "data.test_files=[/no/such/test.jsonl]", "env=http")
    with pytest.raises(FileNotFoundError, match=r"config key data.test_files\[0\]='/no/such/test.jsonl': no such file"):
        check_paths(cfg)


@pytest.mark.parametrize("stage", ["demo", "headline"])
def test_stages_comparing_on_fixed_tasks_refuse_eval_num_tasks_null(make_cfg, tmp_path, stage):
    """eval.num_tasks=null (each question of the split once) is stage=eval's; the demo and the headline multiply and
    print the number, so they refuse it before anything trains, naming the key."""
    from mempo.stages import STAGES

    cfg = make_cfg(f"stage={stage}", "eval.num_tasks=null", f"run_dir={tmp_path / 'run'}")
    with pytest.raises(ValueError, match=rf"eval.num_tasks=null .* stage={stage} needs a number"):
        STAGES[stage](cfg)
    assert not (tmp_path / "run" / "sft").exists()
