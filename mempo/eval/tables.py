"""Markdown tables and matplotlib figures: the leaf every report of ``mempo.eval`` formats with (imports no mempo
module, so the reports import it and never each other for a formatter)."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any


def fmt_cell(v: Any) -> str:
    """A table cell: floats to 3 decimals, anything else as ``str``."""
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def markdown_table(rows: list[dict[str, Any]], cols: list[str]) -> str:
    """A GitHub markdown table of ``rows`` (floats to 3 decimals)."""
    head = "| " + " | ".join(cols) + " |"
    sep = "| " + " | ".join("---" for _ in cols) + " |"
    body = ["| " + " | ".join(fmt_cell(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join([head, sep, *body])


def refuse_repeats(
    keys: Sequence[tuple[Hashable, ...]],
    names: Sequence[str],
    *,
    unit: str = "line",
    where: str = "",
    numbers: Sequence[int] | None = None,
) -> None:
    """mempo/eval's one rule for repeated rows: a key (checkpoint, agent, N, task, ...) stands for one row, and a
    reader that met it twice would keep the last, average both or count both, so every reader refuses instead. A
    ValueError "<where><unit> j repeats <unit> i: name=value, ..." at the first repeat; ``numbers``: each key's line
    (or item) number, 1, 2, ... when None."""
    seen: dict[tuple[Hashable, ...], int] = {}
    for i, key in zip(numbers if numbers is not None else range(1, len(keys) + 1), keys):
        if key in seen:
            named = ", ".join(f"{n}={v!r}" for n, v in zip(names, key))
            raise ValueError(
                f"{where}{unit} {i} repeats {unit} {seen[key]}: {named}; each key is read once (a row written twice, "
                "or two runs merged into one file?)"
            )
        seen[key] = i


def have_matplotlib() -> bool:
    """Whether matplotlib imports. Only the figures need it: a training run without it (a locked-down GPU machine with
    only the packages training imports) writes its metrics.csv and skips curves.png."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (no display: figures are only written to files)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path, *, dpi: int = 120) -> Path:
    """Lay out, write at ``dpi`` and close a figure."""
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return path
