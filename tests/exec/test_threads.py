"""Concurrent predict on one CompiledModel: every call in its own execution context."""

import os
import threading

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import pyforge
from pyforge.errors import OptionError
from pyforge.models import ew, mlp
from tests.helpers import run_in_simulator

THREADS, CALLS = 8, 200  # the stress figure: 8 threads x 200 calls over 3 models


def two_conv() -> onnx.ModelProto:
    """Conv -> Relu -> Conv: im2col prologues, GEMMs and epilogues, all in the arena."""
    rng = np.random.default_rng(3)
    w1 = rng.standard_normal((8, 3, 3, 3)).astype(np.float32)
    w2 = rng.standard_normal((4, 8, 3, 3)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["h"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("Conv", ["r", "w2"], ["y"], pads=[1, 1, 1, 1]),
    ]
    graph = helper.make_graph(
        nodes,
        "two_conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 16, 16])],
        [onnx.numpy_helper.from_array(w1, "w1"), onnx.numpy_helper.from_array(w2, "w2")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


MODELS = {"mlp": lambda: mlp(batch=1), "ew": lambda: ew(batch=1), "two_conv": two_conv}


def _feeds(model: pyforge.CompiledModel, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {s.name: rng.standard_normal(s.shape).astype(s.dtype) for s in model.inputs}


def hammer(models: dict, threads: int, calls: int) -> int:
    """Run ``calls`` predicts per thread over every model at once; count the wrong answers
    (each checked against the single-threaded answer for its inputs)."""
    inputs = {k: [_feeds(m, s) for s in range(calls)] for k, m in models.items()}
    want = {k: [m.predict(f) for f in inputs[k]] for k, m in models.items()}
    wrong, errors = [0], []
    start = threading.Barrier(threads)

    def worker(t: int) -> None:
        start.wait()
        try:
            for i in range(calls):
                for k, m in models.items():
                    j = (i * 7 + t) % calls  # threads run different inputs at the same time
                    got = m.predict(inputs[k][j])
                    if not np.array_equal(got, want[k][j]):
                        wrong[0] += 1
        except BaseException as e:  # noqa: BLE001  (reported by the test thread)
            errors.append(e)

    pool = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    if errors:
        raise errors[0]
    return wrong[0]


@pytest.mark.parametrize("concurrency", [None, 1, 3])
def test_threads_get_right_answers_cpu(concurrency):
    kw = {} if concurrency is None else {"max_concurrency": concurrency}
    models = {k: pyforge.compile(f(), target="cpu", **kw) for k, f in MODELS.items()}
    assert hammer(models, THREADS, CALLS) == 0
    for m in models.values():
        made = len(m.runtime.pool.contexts)
        assert 1 <= made <= m.runtime.pool.size == (concurrency or 2)


def test_contexts_made_lazily_and_weights_shared():
    m = pyforge.compile(two_conv(), target="cpu", max_concurrency=4)
    x = _feeds(m, 0)
    for _ in range(3):
        m.predict(x)
    assert len(m.runtime.pool.contexts) == 1  # one thread: one arena, as before
    hammer({"c": m}, 4, 5)
    contexts = m.runtime.pool.contexts
    arenas = {id(c.arena) for c in contexts}
    assert len(arenas) == len(contexts)
    weights = [v for n, v in contexts[0].views.items() if m.plan.slots[n].region == "weights"]
    assert weights and all(np.shares_memory(v, m.plan.weights) for v in weights)


def test_default_and_bad_max_concurrency():
    assert pyforge.compile(mlp(batch=1), target="cpu").runtime.pool.size == 2
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(OptionError, match="max_concurrency"):
            pyforge.RuntimeOptions(max_concurrency=bad)


INSIDE_SIM = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"


@pytest.mark.sim
@pytest.mark.skipif(INSIDE_SIM, reason="this is the launcher")
def test_cuda_threads_in_simulator():
    run_in_simulator(__file__, timeout=900)


@pytest.mark.skipif(not INSIDE_SIM, reason="runs inside the simulator subprocess")
def test_threads_get_right_answers_cuda_simulated():
    models = {k: pyforge.compile(MODELS[k](), target="cuda", max_concurrency=2) for k in ("mlp",)}
    assert hammer(models, 3, 3) == 0
    rt = models["mlp"].runtime
    assert len(rt.pool.contexts) == 2
    a, b = rt.pool.contexts
    assert a.arena is not b.arena and a.stream is not b.stream
    assert a.weights is b.weights  # one device copy of the weights
    other = pyforge.compile(mlp(batch=1), target="cuda")
    assert other.runtime.weights is not a.weights  # another plan, other host weights
    from pyforge.exec.cuda import CudaRuntime

    assert CudaRuntime(models["mlp"].plan).weights is a.weights  # same host array: same upload


@pytest.mark.gpu
@pytest.mark.parametrize("graph", [True, False], ids=["graph", "stepwise"])
def test_threads_get_right_answers_cuda(graph):
    models = {k: pyforge.compile(f(), target="cuda", graph=graph) for k, f in MODELS.items()}
    assert hammer(models, THREADS, CALLS) == 0
    for m in models.values():
        contexts = m.runtime.pool.contexts
        assert 1 <= len(contexts) <= 4
        assert all(c.weights is contexts[0].weights for c in contexts)
