"""Shapes at compile and at predict: input_shapes, symbolic dims bound per call, one plan per
input signature (LRU, shared weights), saved plans, the CLI's --shape."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnx
import onnx.numpy_helper
import pytest
from onnx import helper

import pyforge
import pyforge.compiler
from pyforge.cli import main
from pyforge.errors import InputError, OptionError
from pyforge.models import mlp
from tests.helpers import ATOL, RTOL, check_against_ort, make_model, run_ort


@pytest.fixture(scope="module")
def dynamic_mlp() -> onnx.ModelProto:
    return mlp(batch="batch")  # x: ('batch', 256) -> y: ('batch', 10)


def _x(batch: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed + batch).standard_normal((batch, 256)).astype(np.float32)


def _check(model, proto, x):
    np.testing.assert_allclose(model.predict(x), run_ort(proto, {"x": x})[0], rtol=RTOL, atol=ATOL)


def _pair_model() -> onnx.ModelProto:
    """y = a + b, both ('batch', 4): one symbol in two inputs."""
    node = helper.make_node("Add", ["a", "b"], ["y"])
    f32 = np.float32
    return make_model(
        [node], [("a", f32, ["batch", 4]), ("b", f32, ["batch", 4])], [("y", f32, ["batch", 4])]
    )


def test_a_dynamic_batch_binds_per_call_and_reuses_its_plans(dynamic_mlp):
    model = pyforge.compile(dynamic_mlp, target="cpu")
    assert model.inputs[0].shape == ("batch", 256)
    assert model.stats["plans"] == [{"x": (1, 256)}]  # compile's first plan: free dims as 1
    first = model.plan
    _check(model, dynamic_mlp, _x(1))
    _check(model, dynamic_mlp, _x(4))
    assert model.plan is not first and model.plan.signature(["x"])[0][1] == (4, 256)
    _check(model, dynamic_mlp, _x(1, seed=7))
    assert model.plan is first  # the batch-1 plan again, not a third one
    assert model.stats["plans"] == [{"x": (4, 256)}, {"x": (1, 256)}]  # least recent first
    assert model.stats["max_plans"] == 8
    assert model.inputs[0].shape == ("batch", 256)  # still symbolic: predict binds it


def test_plans_of_one_model_share_one_weights_array(dynamic_mlp):
    model = pyforge.compile(dynamic_mlp, target="cpu")
    weights = model.plan.weights
    assert weights.nbytes > 0
    model.predict(_x(3))
    assert model.stats["plans"][-1] == {"x": (3, 256)}
    assert model.plan.weights is weights


def test_max_plans_evicts_the_least_recently_used(dynamic_mlp):
    model = pyforge.compile(dynamic_mlp, target="cpu", max_plans=1)
    _check(model, dynamic_mlp, _x(1))
    first = model.plan
    _check(model, dynamic_mlp, _x(2))
    assert model.stats["plans"] == [{"x": (2, 256)}]
    _check(model, dynamic_mlp, _x(1))  # batch 1 was evicted: compiled anew
    assert model.stats["plans"] == [{"x": (1, 256)}] and model.plan is not first


def test_input_shapes_fix_the_plan_up_front(dynamic_mlp):
    model, _ = check_against_ort(dynamic_mlp, {"x": _x(3)}, input_shapes={"x": (3, 256)})
    assert model.inputs[0].shape == (3, 256)
    assert model.stats["plans"] == [{"x": (3, 256)}]
    with pytest.raises(InputError, match=r"'x' has shape \(2, 256\): dim 0 must be 3"):
        model.predict(_x(2))


def test_a_fixed_dim_given_another_size_names_the_dim(dynamic_mlp):
    model = pyforge.compile(dynamic_mlp, target="cpu")
    bad = np.ones((2, 255), np.float32)
    with pytest.raises(InputError, match=r"input 'x' has shape \(2, 255\): dim 1 must be 256"):
        model.predict(bad)
    with pytest.raises(InputError, match="rank 3, but the model takes rank 2"):
        model.predict(np.ones((1, 2, 256), np.float32))
    assert model.stats["plans"] == [{"x": (1, 256)}]  # nothing compiled for a refused call


@pytest.mark.parametrize(
    "shapes, says",
    [
        ({"nope": (1, 256)}, ["['nope']", "not a graph input", "['x']"]),
        ({"x": (256,)}, ["input_shapes['x']", "rank 1", "rank 2", "('batch', 256)"]),
        ({"x": (4, 255)}, ["input_shapes['x']", "dim 1 must be 256"]),
    ],
)
def test_bad_input_shapes_are_refused_before_any_work(monkeypatch, dynamic_mlp, shapes, says):
    def reached(*_args, **_kwargs):
        raise AssertionError("the importer ran: input_shapes was not checked first")

    monkeypatch.setattr(pyforge.compiler, "import_onnx", reached)
    with pytest.raises(OptionError) as e:
        pyforge.compile(dynamic_mlp, target="cpu", input_shapes=shapes)
    assert e.value.option == "input_shapes"
    for text in says:
        assert text in str(e.value)


def test_one_symbol_in_two_inputs_binds_to_one_value():
    proto = _pair_model()
    rng = np.random.default_rng(5)
    a, b = (rng.standard_normal((3, 4)).astype(np.float32) for _ in range(2))
    model, _ = check_against_ort(proto, {"a": a, "b": b})  # batch 3, bound at predict
    with pytest.raises(InputError) as e:
        model.predict({"a": a, "b": b[:2]})
    for text in ("'a'", "'b'", "'batch'", "is 3", "is 2"):
        assert text in str(e.value)
    with pytest.raises(OptionError, match="inputs 'a' and 'b' disagree on symbolic dim 'batch'"):
        pyforge.compile(proto, target="cpu", input_shapes={"a": (2, 4), "b": (5, 4)})
    fixed = pyforge.compile(proto, target="cpu", input_shapes={"a": (2, 4)})
    assert [t.shape for t in fixed.inputs] == [(2, 4), (2, 4)]  # 'batch' fixed in b too


def test_a_saved_plan_runs_its_own_signature_only(tmp_path, dynamic_mlp):
    model = pyforge.compile(dynamic_mlp, target="cpu")
    model.predict(_x(4))  # the most recent plan is the one saved
    model.save(tmp_path / "plan")
    loaded = pyforge.load(tmp_path / "plan", target="cpu")
    assert loaded.inputs[0].shape == (4, 256)
    _check(loaded, dynamic_mlp, _x(4, seed=1))
    with pytest.raises(InputError, match=r"dim 0 must be 4; .*saved plan runs only the shapes"):
        loaded.predict(_x(1))
    with pytest.raises(OptionError, match="input_shapes=.* is a compile option"):
        pyforge.load(tmp_path / "plan", target="cpu", input_shapes={"x": (1, 256)})


def test_cli_shape_flag(tmp_path, capsys, dynamic_mlp):
    path = tmp_path / "mlp_dynamic.onnx"
    onnx.save(dynamic_mlp, path)
    out = tmp_path / "y.npy"
    args = ["run", str(path), "--shape", "x=3x256", "--target", "cpu", "-o", str(out)]
    assert main(args) == 0
    assert np.load(out).shape == (3, 10)
    assert "input     x: float32[3, 256]" in capsys.readouterr().out

    assert (
        main(
            [
                "compile",
                str(path),
                "-o",
                str(tmp_path / "p"),
                "--shape",
                "x=2x256",
                "--target",
                "cpu",
            ]
        )
        == 0
    )
    assert pyforge.load(tmp_path / "p", target="cpu").inputs[0].shape == (2, 256)
    capsys.readouterr()
    assert main(["run", str(tmp_path / "p"), "--shape", "x=2x256", "--target", "cpu"]) == 1
    assert "--shape does not apply to a saved plan" in capsys.readouterr().err
    assert main(["bench", str(path), "--shape", "y=1x10", "--runs", "1", "--target", "cpu"]) == 1
    assert "input_shapes names ['y'], not a graph input" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["explain", str(path), "--shape", "x=3by256"])
    assert e.value.code == 2
    assert "give NAME=DIMS" in capsys.readouterr().err


def test_a_model_the_default_ones_cannot_compile_waits_for_the_first_predict():
    # as a decoder with past_key_values: only real shapes are consistent
    w = onnx.numpy_helper.from_array(np.ones((2, 3), np.float32), "w")
    node = helper.make_node("MatMul", ["a", "w"], ["y"])
    proto = make_model([node], [("a", np.float32, [1, "s"])], [("y", np.float32, [1, 3])], [w])
    model = pyforge.compile(proto, target="cpu")
    assert model.stats["plans"] == [] and "a[1]=s" in model.stats["deferred"]
    assert "input_shapes={name: shape} fixes them" in model.stats["deferred"]
    with pytest.raises(
        pyforge.errors.InputError, match=r"no plan yet: .*free dims \['a\[1\]=s'\] as 1"
    ):
        _ = model.plan
    a = np.random.default_rng(2).standard_normal((1, 2)).astype(np.float32)
    np.testing.assert_allclose(model.predict(a), a @ np.ones((2, 3), np.float32), rtol=1e-6)
    assert model.stats["plans"] == [{"a": (1, 2)}] and model.output_names == ["y"]
    with pytest.raises(pyforge.errors.ShapeError):  # a shape the file cannot take still fails
        model.predict(np.ones((1, 5), np.float32))
    check_against_ort(proto, {"a": a}, input_shapes={"a": (1, 2)})


def test_an_unnamed_dim_shows_as_none_and_binds_on_its_own():
    node = helper.make_node("Relu", ["x"], ["y"])
    proto = make_model([node], [("x", np.float32, [None, 4])], [("y", np.float32, [None, 4])])
    x = np.random.default_rng(4).standard_normal((3, 4)).astype(np.float32)
    model, _ = check_against_ort(proto, {"x": x})
    assert model.inputs[0].shape == (None, 4)
    assert model.stats["plans"] == [{"x": (3, 4)}]  # compile's (1, 4) plan never bound


def test_threads_bringing_new_signatures_each_get_their_plan():
    proto = _pair_model()
    model = pyforge.compile(proto, target="cpu")
    rng = np.random.default_rng(9)
    cases = [rng.standard_normal((2, b % 3 + 1, 4)).astype(np.float32) for b in range(8)]

    def run(ab):
        return model.predict({"a": ab[0], "b": ab[1]})

    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(run, cases))
    for ab, y in zip(cases, got):
        want = run_ort(proto, {"a": ab[0], "b": ab[1]})[0]
        np.testing.assert_allclose(y, want, rtol=RTOL, atol=ATOL)
    assert sorted(p["a"] for p in model.stats["plans"]) == [(1, 4), (2, 4), (3, 4)]


def _conv_bn_model() -> onnx.ModelProto:
    """x ('batch', 3, 8, 8) -> Conv (with bias) -> BatchNormalization -> Relu -> Conv (no bias)
    -> BatchNormalization: two folds into a conv, seeded random weights and statistics."""
    rng = np.random.default_rng(5)

    def init(name, *shape, positive=False):
        a = rng.standard_normal(shape).astype(np.float32)
        return onnx.numpy_helper.from_array(np.abs(a) + 0.5 if positive else a, name)

    inits = [init("w1", 4, 3, 3, 3), init("b1", 4), init("w2", 4, 4, 1, 1)]
    for i in (1, 2):
        inits += [
            init(f"s{i}", 4),
            init(f"o{i}", 4),
            init(f"m{i}", 4),
            init(f"v{i}", 4, positive=True),
        ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "s1", "o1", "m1", "v1"], ["n1"]),
        helper.make_node("Relu", ["n1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"]),
        helper.make_node("BatchNormalization", ["c2", "s2", "o2", "m2", "v2"], ["y"]),
    ]
    f32 = np.float32
    return make_model(
        nodes, [("x", f32, ["batch", 3, 8, 8])], [("y", f32, ["batch", 4, 8, 8])], inits
    )


def _images(batch: int) -> np.ndarray:
    return np.random.default_rng(batch).standard_normal((batch, 3, 8, 8)).astype(np.float32)


def test_a_new_shape_reuses_the_models_initializers_and_folds(monkeypatch):
    import pyforge.exec.cpu.runtime as cpu_runtime
    from pyforge.frontend import importer

    reads, warm_ups = [], []
    real_read, real_warm = importer.tensor_array, cpu_runtime._CpuContext.warm_up
    monkeypatch.setattr(
        importer, "tensor_array", lambda t, *a: reads.append(t.name) or real_read(t, *a)
    )
    monkeypatch.setattr(
        cpu_runtime._CpuContext, "warm_up", lambda self, p: warm_ups.append(1) or real_warm(self, p)
    )
    proto = _conv_bn_model()
    model = pyforge.compile(proto, target="cpu")
    cache = model._source.cache
    assert len(reads) == len(proto.graph.initializer) and cache.folds_computed == 4
    assert not warm_ups  # compile's plan (batch 1) is bound only when predict asks for it
    weights = model.plan.weights
    ys = {}
    for batch in (3, 2):
        ys[batch] = model.predict(_images(batch))
        assert model.stats["plans"][-1] == {"x": (batch, 3, 8, 8)}
        # nothing per model done again: no initializer read, no BatchNorm refolded, no
        # warm-up run (the predict's own run is the first), the weights array shared
        assert len(reads) == len(proto.graph.initializer) and cache.folds_computed == 4
        assert len(warm_ups) == 1 and model.plan.weights is weights
    for batch, y in ys.items():
        x = _images(batch)
        fresh = pyforge.compile(proto, target="cpu", input_shapes={"x": x.shape})
        np.testing.assert_array_equal(y, fresh.predict(x))  # the same plan, bit for bit
        np.testing.assert_allclose(y, run_ort(proto, {"x": x})[0], rtol=RTOL, atol=ATOL)
        assert np.array_equal(fresh.plan.weights, weights)


def test_editing_the_proto_after_compile_does_not_reach_its_plans():
    proto = _conv_bn_model()
    want = run_ort(proto, {"x": _images(3)})[0]
    model = pyforge.compile(proto, target="cpu")
    scale = next(t for t in proto.graph.initializer if t.name == "s1")
    scale.CopyFrom(onnx.numpy_helper.from_array(np.full(4, 9.0, np.float32), "s1"))
    np.testing.assert_allclose(model.predict(_images(3)), want, rtol=RTOL, atol=ATOL)


def test_const_cache_folds_read_only_arrays_once_and_by_identity():
    from pyforge.ir import ConstCache

    calls = []

    def twice(k, a):
        calls.append(1)
        return (a * k,)

    cache, a = ConstCache(), np.arange(4.0)
    cache.fold(twice, (2,), (a,))
    cache.fold(twice, (2,), (a,))
    assert len(calls) == 2  # a writeable array is no key: its bytes may change
    a.flags.writeable = False
    (out,) = cache.fold(twice, (2,), (a,))
    assert cache.fold(twice, (2,), (a,))[0] is out and len(calls) == 3
    assert not out.flags.writeable  # a later fold may key on it
    cache.fold(twice, (3,), (a,))  # another parameter
    b = a.copy()
    b.flags.writeable = False
    cache.fold(twice, (2,), (b,))  # equal bytes, another array: computed again
    assert len(calls) == 5 and cache.folds_computed == 3


def test_a_bad_attribute_at_the_default_ones_names_the_free_dims_and_input_shapes():
    # gpt2 with past: a constant Gather index 1 over a past of length 1
    idx = onnx.numpy_helper.from_array(np.array([1], np.int64), "i")
    node = helper.make_node("Gather", ["a", "i"], ["y"], axis=1)
    proto = make_model([node], [("a", np.float32, [2, "p"])], [("y", np.float32, [2, 1])], [idx])
    model = pyforge.compile(proto, target="cpu")
    why = model.stats["deferred"]
    assert "bad attribute in op 'Gather'" in why and "a[1]=p" in why and "input_shapes=" in why
    a = np.random.default_rng(3).standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_array_equal(model.predict(a), a[:, 1:2])


def test_compile_binds_its_ones_plan_only_when_predict_asks_for_it(dynamic_mlp, monkeypatch):
    binds = []
    real = pyforge._bind
    monkeypatch.setattr(pyforge, "_bind", lambda plan, *a: binds.append(plan) or real(plan, *a))
    model = pyforge.compile(dynamic_mlp, target="cpu")
    ones = model.plan  # built and checked at compile, not bound
    assert not binds and ones.signature(["x"])[0][1] == (1, 256)
    assert model.outputs[0].shape == (1, 10) and model.details["pass_ops"]
    _check(model, dynamic_mlp, _x(4))
    assert binds[-1] is not ones and model.stats["plans"] == [{"x": (4, 256)}]
    assert model.plan.weights is ones.weights  # the 4s plan took the compiled one's weights
    _check(model, dynamic_mlp, _x(1))
    assert binds[-1] is ones and model.plan is ones and len(binds) == 2
    again = pyforge.compile(dynamic_mlp, target="cpu")
    assert again.stats["plans"] == [{"x": (1, 256)}] and binds[-1] is again.plan  # stats binds
    fixed = pyforge.compile(dynamic_mlp, target="cpu", input_shapes={"x": (2, 256)})
    assert binds[-1] is fixed.plan  # nothing free: bound at compile
