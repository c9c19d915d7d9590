"""The serving engine without Ray: batches padded to plan sizes and split back, both backends
agreeing with ONNX Runtime, and bad requests refused with pyforge's errors."""

from __future__ import annotations

import numpy as np
import pytest

from pyforge import errors
from pyforge.serve.engine import Engine, batch_sizes, example_inputs
from tests.helpers import ATOL, RTOL, run_ort

from .common import mlp_path, pair_path


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("serve_engine")
    return {"mlp": mlp_path(d), "pair": pair_path(d)}


@pytest.fixture(scope="module")
def engines(paths):
    made: dict[str, Engine] = {}

    def get(backend: str) -> Engine:
        if backend not in made:
            made[backend] = Engine(paths["mlp"], backend, max_batch_size=2)
        return made[backend]

    return get


def test_batch_sizes():
    assert batch_sizes(1) == [1]
    assert batch_sizes(8) == [1, 2, 4, 8]
    assert batch_sizes(6) == [1, 2, 4, 6]
    with pytest.raises(errors.OptionError, match="max_batch_size"):
        batch_sizes(0)


@pytest.mark.parametrize("backend", ["pyforge", "ort"])
def test_batch_predict_splits_back(paths, backend):
    engine = Engine(paths["mlp"], backend, max_batch_size=4)
    # rows 1..3 each: 13 rows run as 4 + 4 + 4 + 1 (the last one alone), and 3 padded to 4
    requests = [example_inputs(engine, seed=i, rows=1 + i % 3) for i in range(7)]
    got = engine.batch_predict([engine.check(r) for r in requests])
    for req, out in zip(requests, got):
        (want,) = run_ort(paths["mlp"], req)
        assert out["y"].shape == want.shape
        np.testing.assert_allclose(out["y"], want, rtol=RTOL, atol=ATOL)


def test_multi_input_and_groups_by_shape(paths):
    engine = Engine(paths["pair"], "pyforge", max_batch_size=8)
    requests = [example_inputs(engine, seed=i, rows=2) for i in range(3)]
    got = engine.batch_predict([engine.check(r) for r in requests])
    for req, out in zip(requests, got):
        want = dict(zip(["sum", "proj"], run_ort(paths["pair"], req)))
        for name, ref in want.items():
            np.testing.assert_allclose(out[name], ref, rtol=RTOL, atol=ATOL)


def test_fixed_batch_model_runs_alone(tmp_path):
    import onnx

    import pyforge.models

    path = str(tmp_path / "mlp_b1.onnx")
    onnx.save(pyforge.models.mlp(batch=1), path)
    engine = Engine(path, "ort", max_batch_size=8)
    assert engine.sizes == [1] and not engine.batched
    reqs = [example_inputs(engine, seed=s) for s in (1, 2)]
    got = engine.batch_predict([engine.check(r) for r in reqs])
    np.testing.assert_allclose(got[1]["y"], run_ort(path, reqs[1])[0], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(
    ("inputs", "cast", "words"),
    [
        ({"x": np.ones((2, 3), np.float32)}, False, "dim 1 must be 256"),
        ({"x": np.ones((2, 256), np.float64)}, False, "dtype float64, expected float32"),
        ({"x": np.ones((256,), np.float32)}, False, "expected rank 2"),
        ({"z": np.ones((1, 256), np.float32)}, False, "missing ['x'], unknown ['z']"),
        ({"x": [[1.0, 2.0], [3.0]]}, True, "not a float32 array"),
        ({"x": [["a"] * 256]}, True, "not a float32 array"),
        ({"x": np.ones((0, 256), np.float32)}, False, "no rows"),
    ],
)
@pytest.mark.parametrize("backend", ["pyforge", "ort"])
def test_bad_inputs_name_what_is_wrong(engines, backend, inputs, cast, words):
    engine = engines(backend)
    with pytest.raises(errors.InputError) as e:
        engine.check(inputs, cast=cast)
    assert words in str(e.value) and "'x'" in str(e.value)


def test_bad_backend(paths):
    with pytest.raises(errors.OptionError, match="backend must be one of"):
        Engine(paths["mlp"], "tvm")
