"""Run every asv benchmark once (quick mode, nothing stored) so the suite cannot rot."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("asv") is None, reason="asv is not installed")
def test_asv_suite_runs_once(tmp_path):
    # A private HOME keeps `asv machine` from touching the user's ~/.asv-machine.json.
    env = dict(os.environ, HOME=str(tmp_path))
    env.setdefault("PYFORGE_CACHE", str(ROOT / ".cache"))
    subprocess.run(
        ["asv", "machine", "--yes", "--machine", "ci"],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        timeout=60,
    )
    r = subprocess.run(  # noqa: PLW1510  (the return code is asserted below)
        ["asv", "run", "--python=same", "--quick", "--dry-run", "--show-stderr", "--machine", "ci"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert "failed" not in out, out[-4000:]
    for name in (
        "time_predict",
        "track_launches",
        "track_arena_bytes",
        "track_compile_seconds",
        "track_ops_after_optimisation",
    ):
        assert name in out
