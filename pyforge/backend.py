"""pyforge as an ``onnx.backend`` backend, so ONNX's own conformance suite can run against it.

    >>> import onnx.backend.test
    >>> import pyforge.backend
    >>> globals().update(onnx.backend.test.BackendTest(pyforge.backend, __name__).test_cases)

Shapes are static in pyforge, so ``prepare`` only checks that the model imports; the plan is
compiled on the first ``run`` with the shapes of the arrays given, and once more for each new
set of input shapes. Kernels are cached by source, so recompiling a model is cheap.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep, Device, DeviceType, namedtupledict

from .errors import InputError
from .exec.plan import normalise_feeds
from .staged import StagedModel


def _runtime_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    inits = {i.name for i in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def _target(device: str) -> str:
    return "cuda" if Device(device).type == DeviceType.CUDA else "cpu"


def _with_shapes(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> onnx.ModelProto:
    """A copy of ``model`` whose run-time inputs declare exactly these static shapes."""
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    for inp in fixed.graph.input:
        if inp.name not in shapes:
            continue
        dims = inp.type.tensor_type.shape
        dims.ClearField("dim")
        for d in shapes[inp.name]:
            dims.dim.add().dim_value = int(d)
    return fixed


def _shape_like_inputs(model: onnx.ModelProto) -> set[str]:
    """Run-time inputs read where an op needs a constant (a shape, axes, pads, ...)."""
    from .ops import OPS

    runtime = {i.name for i in _runtime_inputs(model)}
    names = set()
    for node in model.graph.node:
        opdef = OPS.get(node.op_type)
        for i in opdef.const_inputs if opdef is not None else ():
            if i < len(node.input) and node.input[i] in runtime:
                names.add(node.input[i])
    return names


def _bake(model: onnx.ModelProto, values: dict[str, np.ndarray]) -> onnx.ModelProto:
    """Turn these run-time inputs into initializers holding the given values."""
    if not values:
        return model
    from onnx import numpy_helper

    kept = [i for i in model.graph.input if i.name not in values]
    model.graph.ClearField("input")
    model.graph.input.extend(kept)
    model.graph.initializer.extend(numpy_helper.from_array(a, n) for n, a in values.items())
    return model


class PyforgeRep(BackendRep):
    """A prepared model: compiles for the input shapes of each distinct call signature."""

    def __init__(self, model: onnx.ModelProto, device: str = "CPU", **options: Any):
        from .options import split_options

        self.model = model
        self.target = _target(device)
        # checked here, once, not at the first run's compile
        compile_opts, runtime = split_options(None, None, options)
        self.options = compile_opts.resolve(self.target)
        self.runtime_options = runtime.resolve(self.target)
        self.input_names = [i.name for i in _runtime_inputs(model)]
        self.output_names = [o.name for o in model.graph.output]
        self.baked = _shape_like_inputs(model)
        self._compiled: dict[tuple, Any] = {}

    def _compile(self, feeds: dict[str, np.ndarray]):
        from . import compile as pyforge_compile

        key = tuple(
            (n, a.shape, a.dtype.str, a.tobytes() if n in self.baked else None)
            for n, a in feeds.items()
        )
        if key not in self._compiled:
            model = _with_shapes(self.model, {n: a.shape for n, a in feeds.items()})
            model = _bake(model, {n: a for n, a in feeds.items() if n in self.baked})
            self._compiled[key] = pyforge_compile(
                model, self.target, self.options, runtime=self.runtime_options
            )
        return self._compiled[key]

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        """Run on a list of arrays (graph input order) or a dict; outputs in graph order."""
        if isinstance(inputs, dict):
            feeds = {k: np.asarray(v) for k, v in inputs.items()}
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            if len(inputs) > len(self.input_names):
                raise InputError(f"{len(inputs)} inputs given, the model takes {self.input_names}")
            feeds = {n: np.asarray(a) for n, a in zip(self.input_names, inputs)}
        compiled = self._compile(feeds)
        feeds = {n: a for n, a in feeds.items() if n not in self.baked}
        if isinstance(compiled, StagedModel):  # run in stages: predict, not one plan
            out = compiled.predict(feeds)
            outs = out if isinstance(out, dict) else {compiled.output_names[0]: out}
        else:
            outs = compiled.runtime.run(normalise_feeds(compiled.plan, feeds))
        result = [outs[compiled.output_names[i]] for i in range(len(self.output_names))]
        return namedtupledict("Outputs", self.output_names)(*result)


class PyforgeBackend(Backend):
    """``onnx.backend.base.Backend`` over pyforge.compile."""

    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        return cls.supports_device(device)

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> PyforgeRep:
        if not isinstance(model, onnx.ModelProto):
            model = onnx.load_model_from_string(model)
        return PyforgeRep(model, device, **kwargs)

    @classmethod
    def run_model(
        cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any
    ) -> tuple[np.ndarray, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(
        cls,
        node: onnx.NodeProto,
        inputs: Any,
        device: str = "CPU",
        outputs_info: Any = None,
        **kwargs: Any,
    ) -> tuple[np.ndarray, ...]:
        """Wrap one node in a model whose inputs take the shapes and dtypes of ``inputs``."""
        from onnx import helper

        arrays = [np.asarray(a) for a in inputs]
        names = [n for n in node.input if n][: len(arrays)]
        graph_inputs = [
            helper.make_tensor_value_info(
                n, helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape)
            )
            for n, a in zip(names, arrays)
        ]
        graph_outputs = [helper.make_empty_tensor_value_info(o) for o in node.output if o]
        graph = helper.make_graph([node], "run_node", graph_inputs, graph_outputs)
        opset = kwargs.pop("opset_version", onnx.defs.onnx_opset_version())
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        return cls.run_model(model, dict(zip(names, arrays)), device, **kwargs)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        kind = Device(device).type
        if kind == DeviceType.CPU:
            return True
        if kind == DeviceType.CUDA:
            from . import default_target

            return default_target() == "cuda"
        return False


prepare = PyforgeBackend.prepare
run_model = PyforgeBackend.run_model
run_node = PyforgeBackend.run_node
supports_device = PyforgeBackend.supports_device
is_compatible = PyforgeBackend.is_compatible
