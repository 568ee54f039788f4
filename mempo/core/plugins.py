"""Import paths as config values: ``pkg.module:name`` (an importable module) or ``path/to/file.py:name`` (a script
that is not installed, resolved against the working directory), for the registries a user extends from the config
(``reward.kind``, ``env.retriever``, ``advantage.estimator``; ``mempo.stages.plugins`` checks and registers them).
Standard library only.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any


def is_import_path(value: object) -> bool:
    """Whether a config value names code (``module:name`` or ``file.py:name``) rather than a registered name."""
    return isinstance(value, str) and ":" in value and not value.startswith(":") and not value.endswith(":")


def registered_names(registry: dict[str, Any]) -> list[str]:
    """A registry's own names, sorted, without the import paths registered into it (what an error lists as known)."""
    return sorted(k for k in registry if not is_import_path(k))


def _is_file_form(left: str) -> bool:
    return left.endswith(".py") or "/" in left or "\\" in left


def load_object(spec: str, *, key: str) -> Any:
    """The object ``spec`` names; a ValueError naming ``key``, the spec and what was wrong: no such module or file,
    an error while importing it, or no such name in it. A file is imported as module ``mempo_user_<hash of its
    path>`` (registered in ``sys.modules``), afresh on every call, so an edited file is what runs."""
    left, _, name = spec.rpartition(":")
    where = f"{key}={spec!r}"
    if _is_file_form(left):
        path = Path(left).expanduser().resolve()
        if not path.is_file():
            raise ValueError(f"{where}: no file {path} (a relative path is read from the working directory)")
        module_name = "mempo_user_" + hashlib.sha1(str(path).encode()).hexdigest()[:12]
        loader_spec = importlib.util.spec_from_file_location(module_name, path)
        if loader_spec is None or loader_spec.loader is None:
            raise ValueError(f"{where}: {path} cannot be imported as Python")
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[module_name] = module
        try:
            loader_spec.loader.exec_module(module)
        except Exception as e:
            del sys.modules[module_name]
            raise ValueError(f"{where}: importing {path} failed: {type(e).__name__}: {e}") from e
    else:
        try:
            module = importlib.import_module(left)
        except ModuleNotFoundError as e:
            raise ValueError(f"{where}: no module {left!r} ({e}); is it installed or on PYTHONPATH?") from e
        except Exception as e:
            raise ValueError(f"{where}: importing {left} failed: {type(e).__name__}: {e}") from e
    try:
        return getattr(module, name)
    except AttributeError:
        found = sorted(n for n in vars(module) if not n.startswith("_"))[:12]
        raise ValueError(f"{where}: {left} has no {name!r} (it defines {found})") from None


def source_of(spec: str) -> tuple[str, str]:
    """(the file ``spec`` names, resolved; the sha256 of its bytes, 16 hex digits), without running it: what a run's
    provenance records of a user's code, so that a run resumed or reused under edited code is refused like a changed
    key. A module form is located by ``importlib.util.find_spec`` (its parent packages are imported)."""
    left = spec.rpartition(":")[0]
    if _is_file_form(left):
        path: str | None = str(Path(left).expanduser().resolve())
    else:
        try:
            found = importlib.util.find_spec(left)
        except (ImportError, ValueError):
            found = None
        path = found.origin if found is not None else None
    if path is None or not Path(path).is_file():
        return f"(no source file for {left})", "none"
    return str(Path(path).resolve()), hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
