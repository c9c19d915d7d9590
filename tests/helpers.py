"""The one checker every test shares: compile with pyforge, run ONNX Runtime, compare."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort

import pyforge

RTOL, ATOL = 1e-4, 1e-5


def run_ort(model: onnx.ModelProto | str, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    src = model if isinstance(model, str) else model.SerializeToString()
    sess = ort.InferenceSession(src, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def check_against_ort(
    model: onnx.ModelProto | str,
    feeds: dict[str, np.ndarray],
    target: str = "cpu",
    fusion: bool = True,
    rtol: float = RTOL,
    atol: float = ATOL,
    **options,
) -> tuple[pyforge.CompiledModel, float]:
    """Compile, predict, compare every output with ORT; return the model and max abs error."""
    compiled = pyforge.compile(model, target=target, fusion=fusion, **options)
    got = compiled.predict(feeds)
    got = got if isinstance(got, dict) else {compiled.output_names[0]: got}
    want = run_ort(model, feeds)
    max_err = 0.0
    for name, ref in zip(compiled.output_names, want):
        out = got[name]
        assert out.shape == ref.shape, f"{name}: shape {out.shape} != ORT {ref.shape}"
        assert out.dtype == ref.dtype, f"{name}: dtype {out.dtype} != ORT {ref.dtype}"
        if ref.size:
            err = float(np.max(np.abs(out.astype(np.float64) - ref.astype(np.float64))))
            max_err = max(max_err, err)
            np.testing.assert_allclose(out, ref, rtol=rtol, atol=atol, err_msg=name)
    print(f"max abs error vs ORT: {max_err:.3g}")
    return compiled, max_err


def make_model(nodes, inputs, outputs, initializers=(), opset: int = 17) -> onnx.ModelProto:
    """A small model from onnx.helper parts; inputs/outputs are (name, dtype, shape) triples."""
    from onnx import helper

    def vi(name, dtype, shape):
        return helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), shape
        )

    graph = helper.make_graph(
        list(nodes), "test", [vi(*i) for i in inputs], [vi(*o) for o in outputs], list(initializers)
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def run_in_simulator(test_file: str, timeout: int = 900) -> None:
    """Re-run ``test_file`` with pytest in a subprocess under Numba's CUDA simulator (which must
    be on before numba is imported) and fail unless its cases pass."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test_file],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    print(proc.stdout[-3000:], proc.stderr[-2000:])
    assert proc.returncode == 0, "simulator cases failed"
    assert " passed" in proc.stdout
