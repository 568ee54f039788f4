"""Studies pooled as fixed strata (one study per synthetic world): ``crossed_variance``, ``stratified_t_interval``,
``pool_studies`` and ``python -m mempo.eval.report --per-task A --per-task B``, against values worked out by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mempo.eval.report import main
from mempo.eval.seeds import pool_studies, pooled_markdown
from mempo.eval.stats import crossed_variance, stratified_t_interval

STUDIES = Path(__file__).resolve().parents[2] / "docs" / "studies"


def test_the_crossed_variance_by_hand() -> None:
    # seed means [1, 2]: s^2 = 0.5, / K = 0.25; task means [0.5, 1, 3]: s^2 = 3.5 / 2 = 1.75, / T = 0.58333;
    # df = 0.83333^2 / (0.25^2 / 1 + 0.58333^2 / 2) = 2.98507
    var, df = crossed_variance([[0.0, 1.0, 2.0], [1.0, 1.0, 4.0]])
    assert var == pytest.approx(0.833333, abs=1e-6) and df == pytest.approx(2.98507, abs=1e-5)


def test_the_stratified_interval_by_hand() -> None:
    # Var = (0.0004 + 0.0012) / 4 = 0.0004 (SE 0.02); df = 0.0004^2 / (0.0001^2 / 10 + 0.0003^2 / 30) = 40;
    # t(40) = 2.0211: 0.2 +- 0.040423
    mean, lo, hi, df = stratified_t_interval([0.1, 0.3], [0.0004, 0.0012], [10, 30])
    assert (mean, df) == (pytest.approx(0.2), pytest.approx(40.0))
    assert (lo, hi) == (pytest.approx(0.2 - 0.040423, abs=1e-5), pytest.approx(0.2 + 0.040423, abs=1e-5))
    with pytest.raises(ValueError, match="one mean, variance and df per stratum"):
        stratified_t_interval([0.1, 0.3], [0.0004], [10, 30])


def _study(mean: float, var: float, df: float) -> dict:
    one, no_interval = {"mean": mean, "var": var, "df": df}, {"mean": mean, "var": None, "df": None}
    return {"comparisons": [{"arm": "mempo", "against": "ablation", "N": 6, "em": one, "f1": one},
                            {"arm": "mempo", "against": "react", "N": 6, "em": no_interval, "f1": one}]}  # fmt: skip


def test_pool_studies_by_hand_and_the_difference_between_them() -> None:
    pooled = pool_studies([_study(0.1, 0.0004, 10), _study(0.3, 0.0012, 30)], ["w0", "w1"])
    assert [(r["arm"], r["against"]) for r in pooled] == [("mempo", "ablation")]  # no interval in one: left out
    em = pooled[0]["em"]
    assert em["by_study"] == [0.1, 0.3] and em["verdict"] == "above 0"
    assert em["interval"] == pytest.approx([0.2 - 0.040423, 0.2 + 0.040423], abs=1e-5)
    # between: 0.3 - 0.1, Var 0.0016 (SE 0.04), df = 0.0016^2 / (0.0004^2 / 10 + 0.0012^2 / 30) = 40: +- 0.080845
    assert em["between"]["mean"] == pytest.approx(0.2) and em["between"]["df"] == pytest.approx(40.0)
    assert em["between"]["interval"] == pytest.approx([0.2 - 0.080845, 0.2 + 0.080845], abs=1e-5)
    assert "| mempo - ablation | 6 | EM | 0.100 | 0.300 | 0.200 | [0.160, 0.240] | 40.0 | above 0 |" in (
        pooled_markdown(pooled))  # fmt: skip
    with pytest.raises(ValueError, match="no comparison with an interval in every study"):
        pool_studies([_study(0.1, 0.0004, 10), {"comparisons": []}], ["w0", "w1"])


def test_the_report_pools_two_committed_studies(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The positive control on world 0 and on world 1 (docs/studies/control, control_w1): the pooled difference is the
    mean of the two studies' own, read from their study.json files."""
    paths = [STUDIES / name / "per_task.csv" for name in ("control", "control_w1")]
    main(["--per-task", str(paths[0]), "--per-task", str(paths[1]), "--json", str(tmp_path / "pooled.json")])
    own = [json.loads((p.parent / "study.json").read_text())["comparisons"][0]["em"]["mean"] for p in paths]
    got = json.loads((tmp_path / "pooled.json").read_text())["pooled"]
    assert [(r["arm"], r["against"], r["N"]) for r in got] == [("ablation", "warm_start", 2)]
    assert got[0]["em"]["mean"] == pytest.approx(sum(own) / 2)
    assert got[0]["em"]["by_study"] == pytest.approx(own)
    assert "## Pooled over control, control_w1" in capsys.readouterr().out
