"""``mempo.core.console.setup_console``: third-party log records and warnings land in the run log, once, and reach the
console only with ``verbose=True``; the project's own records reach both.

Regressions these tests catch (each planted by hand and seen to fail the named tests, then removed):
- a third-party logger keeping its own console handler while it propagates (each Lightning line printed twice)
  (``test_third_party_records_go_to_the_run_log_only``, ``test_verbose_prints_third_party_records_once``);
- the console filter left on Hydra's console handler by a ``verbose=True`` call (``test_hydra_handlers_are_reused``);
- a stripped logger left with ``propagate=False`` (its records lost) and warnings not routed into logging (the first
  two tests).
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from mempo.core.console import CONSOLE_FILTER, LOG_FORMAT, setup_console


@pytest.fixture
def clean_logging(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Restore every logger's handlers, level and propagation, the root's filters, warning capture and the env."""
    monkeypatch.delenv("VLLM_CONFIGURE_LOGGING", raising=False)
    loggers = [logging.getLogger()] + [
        lg for lg in logging.root.manager.loggerDict.values() if isinstance(lg, logging.Logger)
    ]
    saved = {lg: (list(lg.handlers), lg.level, lg.propagate) for lg in loggers}
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)  # restored at teardown
    hf_bars = None
    try:
        from transformers.utils import logging as hf_logging

        hf_bars = hf_logging.is_progress_bar_enabled()
    except ImportError:
        pass
    yield
    for lg in [logging.getLogger()] + [
        lg for lg in logging.root.manager.loggerDict.values() if isinstance(lg, logging.Logger)
    ]:
        handlers, level, propagate = saved.get(lg, ([], logging.NOTSET, True))
        for h in lg.handlers:
            if h not in handlers:
                h.close()
        lg.handlers[:] = handlers
        lg.setLevel(level)
        lg.propagate = propagate
        for h in lg.handlers:
            h.removeFilter(CONSOLE_FILTER)
    if hf_bars is not None:
        hf_logging.enable_progress_bar() if hf_bars else hf_logging.disable_progress_bar()


def plant_import_time_handler(name: str) -> None:
    """What ``import lightning`` does: its own console handler on a logger that still propagates."""
    handler = logging.StreamHandler()  # the current (captured) stderr
    handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
    logging.getLogger(name).addHandler(handler)
    logging.getLogger(name).propagate = True


THIRD_PARTY_LINES = ("vllm engine config dump", "GPU available: False", "FutureWarning: a deprecated")


def emit_records() -> None:
    logging.getLogger("vllm.engine").info("vllm engine config dump")
    logging.getLogger("lightning.pytorch.utilities.rank_zero").info("GPU available: False")
    logging.getLogger("mempo.rollout.retrievers").warning("retriever retrying")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("a deprecated third-party call", FutureWarning, stacklevel=1)


@pytest.mark.usefixtures("clean_logging")
def test_third_party_records_go_to_the_run_log_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plant_import_time_handler("lightning")
    log = setup_console(tmp_path, verbose=False)
    setup_console(tmp_path, verbose=False)  # idempotent: still one file handler, one console
    emit_records()
    logging.getLogger("lightning").error("a third-party error")
    out, err = capsys.readouterr()
    text = log.read_text()

    assert log == tmp_path / "run.log"
    for line in THIRD_PARTY_LINES:
        assert text.count(line) == 1, (line, text)
        assert line not in out + err
    assert text.count("retriever retrying") == 1 and (out + err).count("retriever retrying") == 1
    assert (out + err).count("a third-party error") == 1  # errors still reach the console
    assert os.environ["VLLM_CONFIGURE_LOGGING"] == "0"


@pytest.mark.usefixtures("clean_logging")
def test_verbose_prints_third_party_records_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    setup_console(tmp_path, verbose=False)
    plant_import_time_handler("lightning")
    setup_console(tmp_path, verbose=True)  # a later call switches the console filter off
    emit_records()
    out, err = capsys.readouterr()
    text = (tmp_path / "run.log").read_text()

    for line in (*THIRD_PARTY_LINES, "retriever retrying"):
        assert text.count(line) == 1, (line, text)
        assert (out + err).count(line) == 1, (line, out + err)


@pytest.mark.usefixtures("clean_logging")
def test_hydra_handlers_are_reused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Under experiments/run.py Hydra's root handlers exist: its console (stdout) gets the filter, its job log in
    run_dir is the run log, and no second file or console handler is added."""
    root = logging.getLogger()
    console = logging.StreamHandler()  # stands in for Hydra's stdout handler (the exact class Hydra uses)
    console.setFormatter(logging.Formatter(LOG_FORMAT))
    hydra_log = logging.FileHandler(tmp_path / "eval.log")
    root.addHandler(console)
    root.addHandler(hydra_log)

    assert setup_console(tmp_path, verbose=False) == tmp_path / "eval.log"
    assert [h for h in root.handlers if type(h) is logging.StreamHandler] == [console]
    files = [h for h in root.handlers if isinstance(h, logging.FileHandler) and h.baseFilename != os.devnull]
    assert files == [hydra_log]  # (pytest's own log handler writes to os.devnull)
    assert not (tmp_path / "run.log").exists()
    emit_records()
    hydra_log.flush()
    out, err = capsys.readouterr()
    assert "GPU available: False" in (tmp_path / "eval.log").read_text()
    assert "GPU available: False" not in out + err
    assert (out + err).count("retriever retrying") == 1

    setup_console(tmp_path, verbose=True)  # the filter comes off Hydra's console handler again
    logging.getLogger("lightning.pytorch").info("now verbose")
    out, err = capsys.readouterr()
    assert (out + err).count("now verbose") == 1


@pytest.mark.usefixtures("clean_logging")
def test_a_new_run_dir_moves_the_run_log(tmp_path: Path) -> None:
    first = setup_console(tmp_path / "a", verbose=False)
    second = setup_console(tmp_path / "b", verbose=False)
    logging.getLogger("vllm").warning("after the move")
    assert "after the move" not in first.read_text() and "after the move" in second.read_text()


def test_rl_step_line_reads_the_modules_metrics() -> None:
    from types import SimpleNamespace

    from mempo.models.callbacks import RLProgress

    module = SimpleNamespace(last_metrics={"rollout/reward_mean": 0.5625, "rollout/em_mean": 0.5, "train/loss": 0.1})
    assert RLProgress(6).line(None, module, 3, 51.84) == "[mempo] RL step 3/6: reward 0.562, EM 0.500, 51.8 s"
    module.last_metrics["val/em"] = 0.25  # a validation step (ValidationCallback merged val/* in)
    line = RLProgress(6).line(None, module, 4, 9.0)
    assert line == "[mempo] RL step 4/6: reward 0.562, EM 0.500, val EM 0.250, 9.0 s"
