"""Seeded, deterministic ONNX test models: `mlp`, `ew` and `resnet50`, plus an on-disk cache."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
# Pinned so the serialized bytes do not change with the installed onnx version.
IR_VERSION = 8


class _Builder:
    """Accumulates nodes and initializers; every node's output tensor is named after the node."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def const(self, name: str, array: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(array, np.float32), name))
        return name

    def normal(self, name: str, shape: tuple[int, ...], std: float, mean: float = 0.0) -> str:
        a = self.rng.standard_normal(shape, dtype=np.float32) * np.float32(std) + np.float32(mean)
        return self.const(name, a)

    def uniform(self, name: str, shape: tuple[int, ...], low: float, high: float) -> str:
        return self.const(name, self.rng.uniform(low, high, shape).astype(np.float32))

    def op(
        self, op_type: str, name: str, inputs: list[str], out: str | None = None, **attrs: object
    ) -> str:
        out = out or name
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=name, **attrs))
        return out

    def model(
        self, name: str, inp: str, in_shape: list[int], out: str, out_shape: list[int]
    ) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes,
            name,
            [helper.make_tensor_value_info(inp, TensorProto.FLOAT, in_shape)],
            [helper.make_tensor_value_info(out, TensorProto.FLOAT, out_shape)],
            initializer=self.inits,
        )
        return helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", OPSET)],
            producer_name="pyforge.models",
            ir_version=IR_VERSION,
        )


def mlp(batch: int = 1, seed: int = 0) -> onnx.ModelProto:
    """A 256 -> 512 -> 512 -> 10 perceptron: Gemm+Relu, MatMul+Add+Relu, Gemm.

    >>> mlp(batch=4).graph.output[0].name
    'y'
    """
    b = _Builder(seed)
    w1, b1 = b.normal("fc1.weight", (512, 256), (2 / 256) ** 0.5), b.normal("fc1.bias", (512,), 0.1)
    h = b.op("Relu", "relu1", [b.op("Gemm", "fc1", ["x", w1, b1], transB=1)])
    h = b.op("MatMul", "fc2.matmul", [h, b.normal("fc2.weight", (512, 512), (2 / 512) ** 0.5)])
    h = b.op("Add", "fc2.add", [h, b.normal("fc2.bias", (512,), 0.1)])
    h = b.op("Relu", "relu2", [h])
    w3, b3 = b.normal("fc3.weight", (10, 512), (1 / 512) ** 0.5), b.normal("fc3.bias", (10,), 0.1)
    b.op("Gemm", "fc3", [h, w3, b3], out="y", transB=1)
    return b.model("mlp", "x", [batch, 256], "y", [batch, 10])


def ew(batch: int = 1, seed: int = 0) -> onnx.ModelProto:
    """A chain of nine broadcasting elementwise ops on [batch, 8, 32, 32] with one diamond.

    `relu` feeds both `sigmoid` and `tanh`, which meet again at `div`, so a fuser has to keep a
    multi-use value. The divisor is 1.5 + sigmoid(...), never near zero.

    >>> [n.op_type for n in ew().graph.node][:3]
    ['Mul', 'Add', 'Relu']
    """
    b = _Builder(seed)
    h = b.op("Mul", "scale", ["x", b.uniform("scale.c", (1, 8, 1, 1), 0.5, 1.5)])
    h = b.op("Add", "shift", [h, b.normal("shift.c", (32,), 0.5)])
    r = b.op("Relu", "relu", [h])
    s = b.op("Sigmoid", "sigmoid", [r])
    t = b.op("Tanh", "tanh", [r])
    d = b.op("Add", "denom", [s, b.const("denom.c", np.array(1.5))])
    h = b.op("Div", "div", [t, d])
    h = b.op("Sub", "center", [h, b.normal("center.c", (1, 8, 1, 1), 0.1)])
    lo, hi = b.const("clip.min", np.array(-0.25)), b.const("clip.max", np.array(0.5))
    b.op("Clip", "clip", [h, lo, hi], out="y")
    return b.model("ew", "x", [batch, 8, 32, 32], "y", [batch, 8, 32, 32])


def _conv_bn(
    b: _Builder,
    x: str,
    name: str,
    bn: str,
    cin: int,
    cout: int,
    k: int,
    stride: int,
    gamma: tuple[float, float] = (0.5, 1.5),
) -> str:
    """Conv (no bias, He init) followed by BatchNormalization with sane random statistics."""
    w = b.normal(f"{name}.weight", (cout, cin, k, k), (2 / (cin * k * k)) ** 0.5)
    h = b.op("Conv", name, [x, w], kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4)
    params = [
        b.uniform(f"{bn}.weight", (cout,), *gamma),
        b.normal(f"{bn}.bias", (cout,), 0.05),
        b.normal(f"{bn}.running_mean", (cout,), 0.05),
        b.uniform(f"{bn}.running_var", (cout,), 0.5, 1.5),
    ]
    return b.op("BatchNormalization", bn, [h, *params], epsilon=1e-5)


def _bottleneck(b: _Builder, x: str, p: str, cin: int, width: int, stride: int) -> str:
    """ResNet v1.5 bottleneck: the stride sits on the 3x3 conv."""
    cout = width * 4
    h = b.op("Relu", f"{p}.relu1", [_conv_bn(b, x, f"{p}.conv1", f"{p}.bn1", cin, width, 1, 1)])
    h = _conv_bn(b, h, f"{p}.conv2", f"{p}.bn2", width, width, 3, stride)
    h = b.op("Relu", f"{p}.relu2", [h])
    # A small last-BN scale keeps each residual add from doubling the variance over 16 blocks.
    h = _conv_bn(b, h, f"{p}.conv3", f"{p}.bn3", width, cout, 1, 1, gamma=(0.1, 0.3))
    if stride != 1 or cin != cout:
        x = _conv_bn(b, x, f"{p}.downsample.0", f"{p}.downsample.1", cin, cout, 1, stride)
    return b.op("Relu", f"{p}.relu3", [b.op("Add", f"{p}.add", [h, x])])


def resnet50(batch: int = 1, seed: int = 0) -> onnx.ModelProto:
    """ResNet-50 v1.5 with random weights and torchvision's layer names (~25.6M parameters).

    >>> resnet50().graph.input[0].name
    'input'
    """
    b = _Builder(seed)
    h = b.op("Relu", "relu", [_conv_bn(b, "input", "conv1", "bn1", 3, 64, 7, 2)])
    h = b.op("MaxPool", "maxpool", [h], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for stage, (width, blocks, stride) in enumerate(
        [(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)], start=1
    ):
        for i in range(blocks):
            h = _bottleneck(b, h, f"layer{stage}.{i}", cin, width, stride if i == 0 else 1)
            cin = width * 4
    h = b.op("GlobalAveragePool", "avgpool", [h])
    h = b.op("Flatten", "flatten", [h], axis=1)
    w, bias = b.normal("fc.weight", (1000, 2048), 2048**-0.5), b.normal("fc.bias", (1000,), 0.01)
    b.op("Gemm", "fc", [h, w, bias], out="output", transB=1)
    return b.model("resnet50", "input", [batch, 3, 224, 224], "output", [batch, 1000])


MODELS = {"mlp": mlp, "ew": ew, "resnet50": resnet50}


def cached_model(name: str, batch: int = 1, cache_dir: str | None = None) -> str:
    """Path of `MODELS[name](batch)` saved under `<cache>/models/`, generating it on first use.

    The cache is `cache_dir`, else `$PYFORGE_CACHE`, else `~/.cache/pyforge`.

    >>> onnx.load(cached_model("mlp", batch=2)).graph.input[0].name
    'x'
    """
    root = cache_dir or os.environ.get("PYFORGE_CACHE") or Path.home() / ".cache" / "pyforge"
    path = Path(root) / "models" / f"{name}_b{batch}.onnx"
    if path.exists():
        return str(path)
    data = MODELS[name](batch).SerializeToString()
    path.parent.mkdir(parents=True, exist_ok=True)
    # Write then rename so a concurrent reader never sees a half-written file.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return str(path)


def random_inputs(model: onnx.ModelProto | str, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded standard-normal arrays for every graph input that is not an initializer.

    Symbolic or unknown dimensions become 1.

    >>> random_inputs(mlp(batch=2))["x"].shape
    (2, 256)
    """
    if isinstance(model, str):
        model = onnx.load(model)
    rng = np.random.default_rng(seed)
    inits = {t.name for t in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        shape = tuple(d.dim_value if d.dim_value > 0 else 1 for d in tt.shape.dim)
        dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type)
        feeds[vi.name] = rng.standard_normal(shape).astype(dtype)
    return feeds
