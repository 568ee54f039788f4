"""The console a person reads, and the run log that keeps everything else.

``setup_console(run_dir, verbose)`` (once per stage, from ``mempo.stages.run_stage``): every log record and Python
warning goes to ``<run_dir>/run.log`` (Hydra's job log when ``experiments/run.py`` opened it, else a file handler
added here). The console keeps the project's own output: ``[mempo] ...`` lines (``say``), progress bars
(``progress``), records of ``mempo.*`` loggers, and third-party records of level ERROR and above. ``verbose=True``
lets every record through to the console too, each once.

Third-party libraries that print on their own: ``lightning`` adds a console handler at import and still propagates
to the root (each line twice under Hydra's handlers), transformers adds one to ``transformers``, and vLLM to
``vllm`` unless ``VLLM_CONFIGURE_LOGGING=0`` (set here unless the environment sets it). Console handlers of
third-party loggers are removed and their records propagate to the root's handlers. Transformers' progress bars
(weight loading, shard writing) are off unless verbose.

Not reached: text written straight to the file descriptors, such as torch's C++ warnings (``[W... utils.cpp:68]
Warning: NUMA binding ...``) and output of worker processes that do not inherit this configuration.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import sys
import warnings
from pathlib import Path
from typing import Any, TextIO

OWN_LOGGERS = ("mempo", "__main__")
LOG_NAME = "run.log"
LOG_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"  # Hydra's, so both handlers' lines look alike
# Imported before the handlers are swept: these add a console handler to their logger when first imported.
NOISY_AT_IMPORT = ("lightning", "transformers.utils.logging")
_OURS = "_mempo_console"  # attribute set on the handlers this module added


def _own(name: str) -> bool:
    return any(name == own or name.startswith(own + ".") for own in OWN_LOGGERS)


class OwnOrError(logging.Filter):
    """Passes the project's own records and any record of level ERROR or above."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR or _own(record.name)


CONSOLE_FILTER = OwnOrError()


def _is_console(handler: logging.Handler) -> bool:
    # The exact class: FileHandler and pytest's capture handlers are StreamHandler subclasses.
    return type(handler) is logging.StreamHandler


def _import_noisy() -> None:
    for module in NOISY_AT_IMPORT:
        try:
            if importlib.util.find_spec(module) is not None:
                importlib.import_module(module)
        except ImportError:
            pass


def _route_to_root() -> None:
    """Console handlers off third-party loggers; such a logger then propagates to the root's handlers."""
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if not isinstance(logger, logging.Logger) or _own(name):
            continue
        console = [h for h in logger.handlers if _is_console(h)]
        for h in console:
            logger.removeHandler(h)
        if console:
            logger.propagate = True


def _our_log_files(root: logging.Logger) -> list[logging.FileHandler]:
    return [h for h in root.handlers if getattr(h, _OURS, False) and isinstance(h, logging.FileHandler)]


def _log_file(root: logging.Logger, run_dir: Path) -> Path:
    """The root's file handler in ``run_dir`` (Hydra's job log), else ours on ``run_dir/run.log``."""
    ours = _our_log_files(root)
    theirs = [
        h
        for h in root.handlers
        if isinstance(h, logging.FileHandler) and h not in ours and Path(h.baseFilename).parent == run_dir
    ]
    path = Path(theirs[0].baseFilename) if theirs else run_dir / LOG_NAME
    keep = [h for h in ours if not theirs and Path(h.baseFilename) == path]
    for h in ours:
        if h not in keep:
            root.removeHandler(h)
            h.close()
    if not theirs and not keep:
        run_dir.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(path, encoding="utf-8")
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        setattr(handler, _OURS, True)
        root.addHandler(handler)
    return path


def _console_handlers(root: logging.Logger) -> list[logging.Handler]:
    """The root's console handlers (Hydra's, or ours on the current stderr when there is none)."""
    for h in [h for h in root.handlers if getattr(h, _OURS, False) and _is_console(h)]:
        root.removeHandler(h)
    consoles = [h for h in root.handlers if _is_console(h)]
    if not consoles:  # without any, Python's last-resort handler would print nothing once the file handler is on
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        setattr(handler, _OURS, True)
        root.addHandler(handler)
        consoles = [handler]
    return consoles


def show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    """``warnings.showwarning`` as a WARNING record of the ``py.warnings`` logger (as ``logging.captureWarnings``
    does; installed directly, so a caller that put back the previous ``showwarning`` cannot leave it stale)."""
    text = warnings.formatwarning(message, category, filename, lineno, line)
    if file is not None:
        file.write(text)
    else:
        logging.getLogger("py.warnings").warning("%s", text.rstrip("\n"))


def _progress_bars(verbose: bool) -> None:
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        return
    if verbose:
        hf_logging.enable_progress_bar()
    else:
        hf_logging.disable_progress_bar()


def setup_console(run_dir: str | Path, verbose: bool) -> Path:
    """Route logs and warnings as the module docstring says -> the run log's path. Idempotent: a second call
    (another run_dir, another ``verbose``) replaces what the first set up."""
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")  # read when vLLM is imported and when an engine starts
    _import_noisy()
    _route_to_root()
    root = logging.getLogger()
    if root.level > logging.INFO:
        root.setLevel(logging.INFO)
    path = _log_file(root, Path(run_dir).resolve())
    for h in _console_handlers(root):
        h.removeFilter(CONSOLE_FILTER)
        if not verbose:
            h.addFilter(CONSOLE_FILTER)
    warnings.showwarning = show_warning
    _progress_bars(verbose)
    return path


def release_log_file() -> None:
    """Detach and close the run-log handler ``setup_console`` added (Hydra's own are left alone): for a process that
    outlives its run folder, e.g. a test session that deletes a finished test's temporary folder, where a later
    record would otherwise try to reopen a log in a folder that is gone."""
    root = logging.getLogger()
    for h in _our_log_files(root):
        root.removeHandler(h)
        h.close()


def say(line: str) -> None:
    """Print ``line`` on stdout without breaking an active progress bar."""
    from tqdm import tqdm

    tqdm.write(line, file=sys.stdout)
    sys.stdout.flush()


def progress(desc: str, total: int, *, initial: int = 0, unit: str = "step") -> Any:
    """A tqdm bar on stderr, drawn only when stderr is a terminal (a redirected run gets the ``say`` lines only)."""
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit=unit, disable=None, dynamic_ncols=True, file=sys.stderr)
