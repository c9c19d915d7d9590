"""ONNX's backend conformance cases (node tests and the light model-zoo models), run on pyforge.

Shared by the pytest module and the CONFORMANCE.md report: ``cases()`` lists every case,
``run_case()`` runs one on the cpu target and raises on any failure.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.backend.test.loader import load_model_tests
from onnx.backend.test.runner import Runner

import pyforge.backend

HERE = os.path.dirname(__file__)
EXPECTED_PASS = os.path.join(HERE, "expected_pass.txt")
LIGHT_DIR = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
LIGHT_TOLERANCE = {"densenet121": 2e-3}  # rtol, as ONNX's own real-model cases set it


@dataclass
class Case:
    name: str
    kind: str  # "node" | "light"
    ops: tuple[str, ...]
    test: object = None  # onnx TestCase for node tests
    path: str = ""  # model file for light models


def node_cases() -> list[Case]:
    out = []
    for t in load_model_tests(kind="node"):
        ops = tuple(dict.fromkeys(n.op_type for n in t.model.graph.node))
        out.append(Case(t.name, "node", ops, test=t))
    return out


def light_cases() -> list[Case]:
    out = []
    for path in sorted(glob.glob(os.path.join(LIGHT_DIR, "light_*.onnx"))):
        name = os.path.basename(path)[len("light_") : -len(".onnx")]
        out.append(Case(f"test_{name}", "light", (), path=path))
    return out


def cases() -> list[Case]:
    return node_cases() + light_cases()


def _light_data(path: str) -> tuple[onnx.ModelProto, dict, list[np.ndarray]]:
    """Inputs as ONNX's runner makes them (arange / n) and the outputs shipped with the model."""
    model = onnx.load(path)
    inits = {i.name for i in model.graph.initializer}
    feeds = {
        x.name: Runner.generate_dummy_data(x, seed=0, random=False)
        for x in model.graph.input
        if x.name not in inits
    }
    prefix = os.path.splitext(path)[0]
    refs = []
    for i in range(len(model.graph.output)):
        t = onnx.TensorProto()
        with open(f"{prefix}_output_{i}.pb", "rb") as f:
            t.ParseFromString(f.read())
        refs.append(numpy_helper.to_array(t))
    return model, feeds, refs


def _normalize(item):
    if isinstance(item, onnx.TensorProto):
        return numpy_helper.to_array(item)
    return item


def run_case(case: Case, device: str = "CPU") -> None:
    """Run one case through pyforge.backend; raise on a compile error or a wrong answer."""
    if case.kind == "light":
        model, feeds, refs = _light_data(case.path)
        rep = pyforge.backend.prepare(model, device)
        outs = rep.run(feeds)
        rtol = LIGHT_TOLERANCE.get(case.name[len("test_") :], 1e-3)
        Runner.assert_similar_outputs(refs, outs, rtol=rtol, atol=1e-7)
        return
    t = case.test
    rep = pyforge.backend.prepare(t.model, device)
    for inputs, refs in t.data_sets:
        outs = rep.run([_normalize(x) for x in inputs])
        refs = [_normalize(r) for r in refs]
        Runner.assert_similar_outputs(refs, outs, rtol=t.rtol, atol=t.atol)


def read_expected() -> set[str]:
    if not os.path.exists(EXPECTED_PASS):
        return set()
    with open(EXPECTED_PASS) as f:
        return {line.strip() for line in f if line.strip() and not line.startswith("#")}


def write_expected(names: set[str]) -> None:
    with open(EXPECTED_PASS, "w") as f:
        f.write(
            "# ONNX backend cases pyforge passes on cpu; regenerate: python -m tests.conformance.report --update\n"
        )
        f.writelines(f"{n}\n" for n in sorted(names))
