"""``pyforge serve``: its flags, options refused before Ray starts, and a real server stopped by
SIGTERM while requests are in flight (they finish; the process exits; the port is freed)."""

from __future__ import annotations

import io
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from pyforge.cli import main
from tests.helpers import ATOL, RTOL

from .common import free_port, npy, post

ROOT = Path(__file__).resolve().parents[2]


def test_help_lists_the_flags(capsys):
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out = capsys.readouterr().out
    for flag in (
        "--backend",
        "--replicas",
        "--max-batch-size",
        "--batch-wait-ms",
        "--host",
        "--port",
        "--generate",
        "--tokenizer",
        "--access-log",
        "--direct",
        "--fill-wait-ms",
        "--inline-ms",
    ):
        assert flag in out


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["nosuch.onnx"], "no such ONNX file, and not a built-in model"),
        (["mlp", "--max-batch-size", "0"], "max_batch_size must be >= 1"),
        (["mlp", "--replicas", "0"], "replicas must be >= 1"),
        (["mlp", "--fill-wait-ms", "-1"], "fill_wait_ms must be >= 0"),
    ],
)
def test_bad_arguments_fail_before_ray(capsys, argv, words):
    assert main(["serve", *argv]) == 1
    err = capsys.readouterr().err
    assert err.startswith("pyforge serve: error:") and words in err


@pytest.mark.slow  # Ray's start and a model's compile: over a minute on 2 loaded cores
@pytest.mark.parametrize("how", [[], ["--direct"]], ids=["proxy", "direct"])
def test_sigterm_drains_requests_in_flight(how):
    pytest.importorskip("ray.serve")
    import pyforge.models

    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "pyforge.cli",
        "serve",
        "mlp",
        "--port",
        str(port),
        "--max-batch-size",
        "1",
        *how,
    ]
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(s) for s in proc.stdout], daemon=True).start()
    try:
        deadline, seen = time.monotonic() + 300, []
        while not any(s.startswith("serving mlp") for s in seen):
            assert proc.poll() is None and time.monotonic() < deadline, "".join(seen[-30:])
            try:
                seen.append(lines.get(timeout=1))
            except queue.Empty:
                pass
        # 4,096 rows at batch size 1: 4,096 runs, long enough to be in flight at the signal
        x = np.random.default_rng(7).standard_normal((4096, 256)).astype(np.float32)
        answers: list = []
        url = f"http://127.0.0.1:{port}/predict"
        senders = [
            threading.Thread(target=lambda: answers.append(post(url, npy(x), "application/x-npy")))
            for _ in range(2)
        ]
        for t in senders:
            t.start()
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        for t in senders:
            t.join(120)
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    want = pyforge.compile(pyforge.models.mlp(batch=4096), "cpu").predict(x)
    assert [s for s, _ in answers] == [200, 200], answers
    for _, body in answers:
        np.testing.assert_allclose(np.load(io.BytesIO(body)), want, rtol=RTOL, atol=ATOL)
    with pytest.raises(OSError):  # nothing listens there any more
        post(url, npy(x[:1]), "application/x-npy", timeout=5)
