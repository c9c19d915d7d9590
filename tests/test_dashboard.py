"""`pyforge dashboard`: asv result files in, one self-contained page out, regressions marked."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pyforge import dashboard
from pyforge.cli import main
from pyforge.errors import ModelLoadError

COLUMNS = ["result", "params", "version", "started_at", "duration"]
PARAMS = [["'mlp'", "'ew'"], ["'cpu'"]]


def _write_results(root, values: np.ndarray) -> None:
    """One asv result file per commit: time_predict over (model, target), as asv 0.6 writes."""
    machine = root / "results" / "box"
    machine.mkdir(parents=True)
    (machine / "machine.json").write_text(json.dumps({"machine": "box", "version": 1}))
    meta = {"m.Predict.time_predict": {"unit": "seconds", "type": "time"}}
    (root / "results" / "benchmarks.json").write_text(json.dumps(meta))
    for i, row in enumerate(values):
        commit = f"{i:02d}" + "ab" * 19
        run = {
            "commit_hash": commit,
            "env_name": "existing-py",
            "date": 1_700_000_000_000 + i * 60_000,
            "params": {},
            "result_columns": COLUMNS,
            "results": {"m.Predict.time_predict": [list(row), PARAMS, "v", 0, 1.0]},
            "version": 2,
        }
        (machine / f"{commit[:8]}-existing-py.json").write_text(json.dumps(run))


def test_dashboard_marks_the_regressions(tmp_path):
    rng = np.random.default_rng(0)
    values = 1e-4 * (1 + 0.02 * rng.standard_normal((4, 2)))  # 2% noise: no regression
    values[2, 1] *= 1.5  # ew slows down at commit 2 (then stays slow: one regression)
    values[3, 1] = values[2, 1]
    _write_results(tmp_path, values)
    (tmp_path / "env" / "py" / "lib").mkdir(parents=True)  # a virtualenv's own JSON is no result
    (tmp_path / "env" / "py" / "lib" / "x.json").write_text("[1]")
    assert main(["dashboard", str(tmp_path), "-o", str(tmp_path / "dash.html")]) == 0
    page = (tmp_path / "dash.html").read_text()
    assert "<script" not in page and "http" not in page.replace("http://www.w3.org/2000/svg", "")
    assert page.count("<svg") == 2  # one chart per parameter set
    ratio = f"<td>{values[2, 1] / values[1, 1]:.2f}x</td>"
    assert page.count('class="bad"') == 1 and "<td>02ababab</td>" in page and ratio in page
    assert page.count('class="ok"') == 7
    runs, _ = dashboard.load_results(tmp_path)
    order, data = dashboard.series(runs)
    assert [c[:2] for c, _ in order] == ["00", "01", "02", "03"]
    assert {k[1] for k in data} == {"'mlp', 'cpu'", "'ew', 'cpu'"}


def test_dashboard_refuses_what_is_not_asv_results(tmp_path):
    with pytest.raises(ModelLoadError, match="no asv results"):
        dashboard.html_page(tmp_path)
    bad = tmp_path / "results" / "box" / "x.json"
    bad.parent.mkdir(parents=True)
    bad.write_text('{"a": 1}')
    with pytest.raises(ModelLoadError, match=r"x\.json: not an asv result file"):
        dashboard.html_page(tmp_path)
    bad.write_text("{")
    with pytest.raises(ModelLoadError, match="not JSON"):
        dashboard.html_page(tmp_path)
    assert main(["dashboard", str(tmp_path / "missing"), "-o", str(tmp_path / "d.html")]) == 1
