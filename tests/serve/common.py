"""Models the serving tests share: mlp with a free batch dim, and a two-input two-output graph."""

from __future__ import annotations

import io
import socket
import urllib.error
import urllib.request

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import pyforge.models


def mlp_path(tmp_dir) -> str:
    path = str(tmp_dir / "mlp_batch.onnx")
    onnx.save(pyforge.models.mlp(batch="batch"), path)
    return path


def pair_path(tmp_dir) -> str:
    """a, b: float32 [batch, 8] -> sum = a + b, proj = a @ W (W seeded)."""
    w = np.random.default_rng(3).standard_normal((8, 5)).astype(np.float32)
    f = TensorProto.FLOAT
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["a", "b"], ["sum"]),
            helper.make_node("MatMul", ["a", "w"], ["proj"]),
        ],
        "pair",
        [helper.make_tensor_value_info(n, f, ["batch", 8]) for n in ("a", "b")],
        [
            helper.make_tensor_value_info("sum", f, ["batch", 8]),
            helper.make_tensor_value_info("proj", f, ["batch", 5]),
        ],
        initializer=[numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path = str(tmp_dir / "pair.onnx")
    onnx.save(model, path)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(
    url: str, body: bytes, kind: str = "application/json", timeout: float = 60
) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": kind})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()
