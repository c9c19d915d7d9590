"""The `pyforge` command line: every subcommand on mlp, and one-line errors with exit codes."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import helper

from pyforge.cli import main
from tests.helpers import make_model


def test_compile_then_run_and_bench_the_plan(tmp_path, capsys):
    plan = tmp_path / "mlp.plan"
    assert main(["compile", "mlp", "-o", str(plan), "--target", "cpu"]) == 0
    out, err = capsys.readouterr()
    assert (plan / "plan.json").is_file()
    assert "fuse" in err and "compiled" in out

    y = tmp_path / "y.npy"
    assert main(["run", str(plan), "--random", "1", "-o", str(y), "--target", "cpu"]) == 0
    assert np.load(y).shape == (1, 10)
    assert "output    y: float32[1, 10]" in capsys.readouterr().out

    assert main(["bench", str(plan), "--runs", "3", "--target", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "median" in out and "launches" in out and "ORT" not in out  # no ONNX file


def test_run_with_an_input_file_matches_onnxruntime(tmp_path, capsys):
    import onnxruntime as ort

    from pyforge.models import cached_model

    x = np.random.default_rng(3).standard_normal((1, 256)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "out.npy"
    args = ["run", "mlp", "--input", str(tmp_path / "x.npy"), "-o", str(out), "--target", "cpu"]
    assert main(args) == 0
    sess = ort.InferenceSession(cached_model("mlp"), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(np.load(out), sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)


def test_bench_an_onnx_model_shows_onnxruntime(capsys):
    assert main(["bench", "mlp", "--runs", "3", "--target", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "pyforge   median" in out and "ORT cpu   median" in out and "arena" in out


def test_explain_text_and_html(tmp_path, capsys):
    page = tmp_path / "mlp.html"
    assert main(["explain", "mlp", "--html", str(page), "--target", "cpu"]) == 0
    out = capsys.readouterr().out
    for section in ("== passes", "== fused groups", "== steps", "== memory plan", "fuse"):
        assert section in out
    assert "Gemm + Add + Relu" in out  # a fused group with its member ops
    html = page.read_text()
    assert "<svg" in html and "relu1" in html and "lower bound" in html
    assert "src=" not in html and "<link" not in html and "@import" not in html  # no assets


def _unsupported_model(path):
    node = helper.make_node("DFT", ["x"], ["y"], name="weird")  # no kernel, no expansion
    onnx.save(
        make_model([node], [("x", np.float32, [1, 4, 1])], [("y", np.float32, [1, 4, 2])]), path
    )


@pytest.mark.parametrize("case", ["missing", "unsupported", "not_onnx"])
def test_errors_are_one_line_with_exit_code_1(tmp_path, case):
    path = tmp_path / "model.onnx"
    if case == "unsupported":
        _unsupported_model(path)
    elif case == "not_onnx":
        path.write_bytes(b"this is not a protobuf")
    r = subprocess.run(  # noqa: PLW1510  (the return code is asserted below)
        [sys.executable, "-m", "pyforge.cli", "compile", str(path), "-o", str(tmp_path / "p")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 1, r.stderr
    # Progress lines may come first on stderr; the error itself is the one last line.
    errors = [line for line in r.stderr.splitlines() if line.startswith("pyforge")]
    assert len(errors) == 1 and errors[0].startswith("pyforge compile: error:"), r.stderr
    assert r.stderr.rstrip().endswith(errors[0]) and "Traceback" not in r.stderr
    if case == "unsupported":
        assert "DFT" in errors[0] and "weird" in errors[0]


def test_usage_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        main(["compile", "mlp"])  # -o is required
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        main(["frobnicate"])
    assert e.value.code == 2
    capsys.readouterr()


def test_compile_shows_each_stage_on_stderr(tmp_path, capsys):
    assert main(["compile", "mlp", "-o", str(tmp_path / "p"), "--target", "cpu"]) == 0
    err = capsys.readouterr().err
    for k, stage in enumerate(["import", "passes", "lowering", "plan", "bind", "jit"], start=1):
        assert f"[{k}/6] {stage}" in err, err
    # the counts of steps bound and JIT-compiled end at the plan's step count (mlp: 3)
    assert "bind: 3/3 steps bound" in err and "jit: 3/3 steps JIT-compiled" in err, err
    assert err.index("[5/6] bind") < err.index("bind: 3/3") < err.index("[6/6] jit")


def test_an_option_the_cpu_does_not_take_is_a_one_line_error(tmp_path, capsys):
    args = ["compile", "mlp", "-o", str(tmp_path / "p"), "--target", "cpu", "--precision", "tf32"]
    assert main(args) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("pyforge compile: error: precision='tf32' applies to the cuda target")
    assert "internal error" not in err
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--no-fusion"], "--no-fusion does not apply to a saved plan"),
        (["--precision", "fp32"], "--precision does not apply to a saved plan"),
        (["--shape", "x=1x256"], "--shape does not apply to a saved plan"),
    ],
)
def test_compile_flags_on_a_saved_plan_are_refused(tmp_path, capsys, flags, says):
    plan = tmp_path / "mlp.plan"
    assert main(["compile", "mlp", "-o", str(plan), "--target", "cpu"]) == 0
    capsys.readouterr()
    for command in (["run", str(plan)], ["bench", str(plan), "--runs", "1"]):
        assert main([*command, "--target", "cpu", *flags]) == 1
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert says in err and "compile option" in err, err


def test_no_ort_on_a_saved_plan_is_refused(tmp_path, capsys):
    plan = tmp_path / "mlp.plan"
    assert main(["compile", "mlp", "-o", str(plan), "--target", "cpu"]) == 0
    capsys.readouterr()
    assert main(["bench", str(plan), "--runs", "1", "--target", "cpu", "--no-ort"]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("pyforge bench: error: --no-ort does not apply to a saved plan"), err
