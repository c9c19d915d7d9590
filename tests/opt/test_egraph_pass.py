"""The e-graph pass in compile: parallel GEMMs merged or kept apart by their (cached) measured
costs, parity with ONNX Runtime either way, what explain shows, the option's checks, the cost
model's cache and its analytic fallback."""

from __future__ import annotations

import json

import numba
import numpy as np
import pytest
from onnx import helper, numpy_helper

import pyforge
from pyforge import explain
from pyforge.errors import OptionError
from pyforge.lower_numba.costs import CostModel, device_name
from tests.helpers import check_against_ort, make_model

S, H = 8, 16


def qkv_model(seed: int = 0):
    """Three MatMul + bias Add pairs reading one tensor (an attention block's Q, K, V)."""
    rng = np.random.default_rng(seed)
    inits, nodes = [], []
    for p in "qkv":
        inits.append(
            numpy_helper.from_array(rng.standard_normal((H, H)).astype(np.float32), f"w{p}")
        )
        inits.append(numpy_helper.from_array(rng.standard_normal(H).astype(np.float32), f"b{p}"))
        nodes.append(helper.make_node("MatMul", ["x", f"w{p}"], [f"m{p}"], name=f"mm_{p}"))
        nodes.append(helper.make_node("Add", [f"b{p}", f"m{p}"], [p], name=f"add_{p}"))
    nodes.append(helper.make_node("Mul", ["q", "k"], ["qk"], name="qk"))
    nodes.append(helper.make_node("Add", ["qk", "v"], ["y"], name="y"))
    return make_model(nodes, [("x", np.float32, (1, S, H))], [("y", np.float32, (1, S, H))], inits)


def seed_costs(tmp_path, monkeypatch, apart: float, merged: float) -> None:
    """A cost cache saying what each candidate kernel takes, so the choice is fixed."""
    from pyforge.lower_numba import costs as cm

    monkeypatch.setenv("PYFORGE_COSTS", str(tmp_path / "costs.json"))
    monkeypatch.setattr(cm, "load_class", lambda: "idle")  # costs are kept per load class
    dev = f"{device_name('cpu')}|idle"

    def key(kind, shapes):
        return f"{dev}|{kind}|{json.dumps(shapes)}|float32"

    table = {
        key("gemm_bias", ((1, S, H), (H, H))): apart / 3,
        key("gemm_bias", ((1, S, H), (H, 3 * H))): merged / 2,
        key("split", ((1, S, 3 * H), (H, H, H))): merged / 2,
    }
    (tmp_path / "costs.json").write_text(json.dumps(table))


def _feeds():
    return {"x": np.random.default_rng(1).standard_normal((1, S, H)).astype(np.float32)}


@pytest.mark.parametrize("apart, merged, want", [(3e-4, 1e-4, "merged"), (1e-4, 3e-4, "apart")])
def test_choice_follows_the_costs_and_matches_ort(tmp_path, monkeypatch, apart, merged, want):
    seed_costs(tmp_path, monkeypatch, apart, merged)
    m, _ = check_against_ort(qkv_model(), _feeds(), optimizer="egraph")
    rep = m.details["egraph"]
    assert [r.chosen for r in rep.regions] == [want]
    assert rep.regions[0].alternatives["merged"][0] == pytest.approx(merged)
    assert rep.regions[0].alternatives["apart"][0] == pytest.approx(apart)
    assert all(g.optimal for g in rep.searches)
    splits = [mem for n in m.details["graph"].nodes if n.group for mem in n.group.members]
    assert any(mem.op == "Split" for mem in splits) == (want == "merged")
    text = explain.report(m)
    assert "== e-graph (1 regions" in text and f"-> {want}" in text and "search: 1 searches" in text
    assert "(cached)" in text
    greedy = pyforge.compile(qkv_model(), target="cpu")
    assert greedy.details["egraph"] is None and "== e-graph" not in explain.report(greedy)
    np.testing.assert_allclose(m.predict(_feeds()), greedy.predict(_feeds()), rtol=1e-5, atol=1e-5)


def test_a_merged_plan_saves_and_loads(tmp_path, monkeypatch):
    seed_costs(tmp_path, monkeypatch, apart=3e-4, merged=1e-4)
    m = pyforge.compile(qkv_model(), target="cpu", optimizer="egraph")
    assert m.details["egraph"].regions[0].chosen == "merged"
    m.save(tmp_path / "plan")
    back = pyforge.load(tmp_path / "plan", "cpu")
    assert back.stats["optimizer"] == "egraph"
    np.testing.assert_array_equal(back.predict(_feeds()), m.predict(_feeds()))


def test_option_is_checked_up_front():
    with pytest.raises(OptionError, match="cpu target only"):
        pyforge.CompileOptions(optimizer="egraph").resolve("cuda")
    with pytest.raises(OptionError, match="did you mean 'egraph'"):
        pyforge.CompileOptions(optimizer="egrahp")
    assert pyforge.CompileOptions().resolve("cpu").optimizer == "greedy"


def test_cost_model_measures_caches_and_falls_back(tmp_path, monkeypatch):
    monkeypatch.setenv("PYFORGE_COSTS", str(tmp_path / "costs.json"))
    from pyforge.exec.cpu import CpuRuntime

    shapes = ((1, 4, 8), (8, 8))
    seconds, how = CostModel("cpu", make_runtime=CpuRuntime).seconds("gemm_bias", shapes, "float32")
    assert how == "measured" and 0 < seconds < 1
    again = CostModel("cpu", make_runtime=CpuRuntime).seconds("gemm_bias", shapes, "float32")
    assert again == (seconds, "cached")
    est, how = CostModel("cpu").seconds("split", ((1, 4, 24), (8, 8, 8)), "float32")
    assert how == "analytic" and est > 0
    with pytest.raises(ValueError, match="no candidate kernel"):
        CostModel("cpu").seconds("conv", shapes, "float32")


def convs_on_openblas_too(monkeypatch) -> None:
    """Offer convs the OpenBLAS alternative (off by default: see impl.OPENBLAS_OPS)."""
    from pyforge.opt.egraph import impl, parallel_gemm

    for mod in (impl, parallel_gemm):
        monkeypatch.setattr(mod, "OPENBLAS_OPS", ("MatMul", "Gemm", "Conv"))


APART = {"own, epilogue apart", "openblas, epilogue apart"}
ONE_THREAD = {"own, one thread", "openblas, one thread"}  # where the runtime would split it


def gemm_models():
    """A MatMul + bias + Relu and a 3x3 Conv + Relu, each big enough for own sgemm."""
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.standard_normal((64, 96)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(96).astype(np.float32), "b")
    mm = make_model(
        [
            helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
            helper.make_node("Add", ["m", "b"], ["a"], name="bias"),
            helper.make_node("Relu", ["a"], ["y"], name="relu"),
        ],
        [("x", np.float32, (1, 64, 64))],
        [("y", np.float32, (1, 64, 96))],
        [w, b],
    )
    k = numpy_helper.from_array(rng.standard_normal((16, 8, 3, 3)).astype(np.float32), "k")
    conv = make_model(
        [
            helper.make_node("Conv", ["x", "k"], ["c"], name="conv", pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c"], ["y"], name="relu"),
        ],
        [("x", np.float32, (1, 8, 16, 16))],
        [("y", np.float32, (1, 16, 16, 16))],
        [k],
    )
    return {"matmul": (mm, (1, 64, 64)), "conv": (conv, (1, 8, 16, 16))}


@pytest.mark.parametrize("which", ["matmul", "conv"])
@pytest.mark.parametrize("blas_s, want", [(1e-5, "openblas"), (1e-2, "own")])
def test_each_gemm_runs_on_the_implementation_its_cost_picks(monkeypatch, which, blas_s, want):
    from pyforge.lower_numba import costs as cm

    monkeypatch.setattr(
        cm.CostModel, "seconds", lambda s, k, *_: (blas_s if "/" in k else 1e-3, "x")
    )
    monkeypatch.setattr(cm.CostModel, "measure", lambda self, kernels: None)
    if which == "conv":
        convs_on_openblas_too(monkeypatch)
    model, shape = gemm_models()[which]
    feeds = {"x": np.random.default_rng(4).standard_normal(shape).astype(np.float32)}
    m, _ = check_against_ort(model, feeds, optimizer="egraph")
    (g,) = m.details["egraph"].groups
    assert g.chosen == want and set(g.alternatives) - ONE_THREAD == {"own", "openblas"}
    impls = set(m.runtime.gemm_impls.values())
    assert impls == {"OpenBLAS sgemm" if want == "openblas" else "pyforge sgemm (AVX2)"}
    assert m.details["egraph"].predicted == pytest.approx((1e-3, min(1e-3, 1.1 * blas_s)))


@pytest.mark.slow
@pytest.mark.parametrize("which", ["matmul", "conv"])
def test_each_gemm_runs_on_the_implementation_its_measured_cost_picks(tmp_path, monkeypatch, which):
    """Measured once for real (both implementations), then the cached table is rewritten so that
    each side in turn is the cheaper: the plan follows it and matches ORT either way."""
    if which == "conv":
        convs_on_openblas_too(monkeypatch)
    model, shape = gemm_models()[which]
    feeds = {"x": np.random.default_rng(4).standard_normal(shape).astype(np.float32)}
    monkeypatch.setenv("PYFORGE_COSTS", str(tmp_path / "costs.json"))
    m = pyforge.compile(model, target="cpu", optimizer="egraph")
    (g,) = m.details["egraph"].groups
    assert set(g.alternatives) - ONE_THREAD == {"own", "openblas"}
    assert {how for _, how in g.alternatives.values()} == {"cached"}  # measured by prefetch
    table = json.loads((tmp_path / "costs.json").read_text())
    assert sum("|group/blas|" in k for k in table) == 1 and sum("|group|" in k for k in table) == 1
    for want, blas_s in (("openblas", 1e-5), ("own", 1e-2)):
        (tmp_path / "costs.json").write_text(
            json.dumps({k: blas_s if "|group/blas|" in k else 1e-3 for k in table})
        )
        m, _ = check_against_ort(model, feeds, optimizer="egraph")
        (g,) = m.details["egraph"].groups
        assert g.chosen == want and g.alternatives[want][1] == "cached"
        impls = set(m.runtime.gemm_impls.values())
        assert impls == {"OpenBLAS sgemm" if want == "openblas" else "pyforge sgemm (AVX2)"}
        assert "1 of 1 other GEMM groups on OpenBLAS" in explain.report(m) or want == "own"


def test_a_gemm_too_small_for_own_sgemm_has_no_openblas_alternative(tmp_path, monkeypatch):
    seed_costs(tmp_path, monkeypatch, apart=3e-4, merged=1e-4)
    m = pyforge.compile(qkv_model(), target="cpu", optimizer="egraph")
    rep = m.details["egraph"]
    assert all(set(g.alternatives) == {"own"} for g in rep.groups)
    assert rep.saturation.applied == 1  # the merge alone


def two_convs_model(k: int = 1):
    """Two convs (k x k, same geometry) with bias Add + Relu reading one tensor, concatenated
    (an inception block's 1x1 branches)."""
    rng = np.random.default_rng(5)
    inits, nodes = [], []
    for name, co in (("a", 8), ("b", 16)):
        w = rng.standard_normal((co, 8, k, k)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{name}"))
        b = rng.standard_normal((1, co, 1, 1)).astype(np.float32)
        inits.append(numpy_helper.from_array(b, f"b{name}"))
        pads = [k // 2] * 4
        nodes.append(
            helper.make_node("Conv", ["x", f"w{name}"], [f"c{name}"], f"conv_{name}", pads=pads)
        )
        nodes.append(
            helper.make_node("Add", [f"c{name}", f"b{name}"], [f"a{name}"], name=f"add_{name}")
        )
        nodes.append(helper.make_node("Relu", [f"a{name}"], [f"r{name}"], name=f"relu_{name}"))
    nodes.append(helper.make_node("Concat", ["ra", "rb"], ["y"], name="cat", axis=1))
    x, y = ("x", np.float32, (1, 8, 12, 12)), ("y", np.float32, (1, 24, 12, 12))
    return make_model(nodes, [x], [y], inits)


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("split_s, want", [(0.0, "merged"), (1e-2, "apart")])
def test_convs_sharing_an_input_merge_by_their_costs_and_match_ort(monkeypatch, k, split_s, want):
    from pyforge.lower_numba import costs as cm

    asked = []

    def fake(self, kind, shapes, dtype):  # each conv 1 ms; OpenBLAS never cheaper
        asked.append((kind, shapes))
        return (split_s if kind == "split" else 1e-3 + (kind != "group")), "cached"

    monkeypatch.setattr(cm.CostModel, "seconds", fake)
    monkeypatch.setattr(cm.CostModel, "measure", lambda self, kernels: None)
    feeds = {"x": np.random.default_rng(6).standard_normal((1, 8, 12, 12)).astype(np.float32)}
    m, _ = check_against_ort(two_convs_model(k), feeds, optimizer="egraph")
    (r,) = m.details["egraph"].regions
    assert r.chosen == want and [mm.op for mm, _ in r.gemms] == ["Conv", "Conv"]
    convs = [n for n in m.details["graph"].nodes if n.group and n.group.members[0].op == "Conv"]
    assert len(convs) == (1 if want == "merged" else 2)
    # the spec each conv is costed by rebuilds to the conv it stands for
    specs = [s[0] for kind, s in asked if kind == "group"]
    outs = {cm.candidate_graph("group", (s,), "float32")[0].outputs[0].shape for s in specs}
    assert outs == {(1, 8, 12, 12), (1, 16, 12, 12), (1, 24, 12, 12)}
    assert ("split", ((1, 24, 12, 12), (8, 16), 1)) in asked


def test_convs_get_no_openblas_alternative_by_default(monkeypatch):
    from pyforge.lower_numba import costs as cm

    monkeypatch.setattr(cm.CostModel, "seconds", lambda s, k, *_: (1e-6 if "/" in k else 1e-3, "x"))
    monkeypatch.setattr(cm.CostModel, "measure", lambda self, kernels: None)
    model, _ = gemm_models()["conv"]
    m = pyforge.compile(model, target="cpu", optimizer="egraph")
    # (too small to be split over threads: no one-thread alternative either)
    assert [set(g.alternatives) for g in m.details["egraph"].groups] == [{"own"}]
    assert set(m.runtime.gemm_impls.values()) == {"pyforge sgemm (AVX2)"}


def _parts(spec: tuple) -> str:
    """Which cut of a MatMul + bias + Relu group a spec is: whole, anchor or epilogue."""
    ops = tuple(m[0] for m in spec)
    return {("MatMul",): "anchor", ("Add", "Relu"): "epilogue"}.get(ops, "whole")


@pytest.mark.parametrize(
    "times, want",
    [
        # (whole, anchor, epilogue, OpenBLAS factor): the cut wins only past its guard, 10% of whole
        ((3e-3, 1e-3, 1e-3, 10.0), "own, epilogue apart"),
        ((3e-3, 1e-3, 1.9e-3, 10.0), "own"),  # 2.9 ms apart: not past the guard
        ((3e-3, 1e-3, 1e-4, 0.5), "openblas, epilogue apart"),
        ((1e-3, 1e-3, 1e-3, 0.5), "openblas"),
    ],
)
def test_an_epilogue_runs_fused_or_apart_as_its_costs_pick_and_matches_ort(
    monkeypatch, times, want
):
    from pyforge.lower_numba import costs as cm

    whole, anchor, epilogue, blas = times

    def fake(self, kind, shapes, dtype):
        if kind == "step":  # one more step's dispatch
            return 0.0, "cached"
        t = {"whole": whole, "anchor": anchor, "epilogue": epilogue}[_parts(shapes[0])]
        return t * (blas if "/blas" in kind else 1.0), "cached"

    from pyforge.opt.egraph import parallel_gemm

    monkeypatch.setattr(parallel_gemm, "EPILOGUE_APART", True)  # off by default
    monkeypatch.setattr(cm.CostModel, "seconds", fake)
    monkeypatch.setattr(cm.CostModel, "measure", lambda self, kernels: None)
    model, shape = gemm_models()["matmul"]
    feeds = {"x": np.random.default_rng(7).standard_normal(shape).astype(np.float32)}
    m, _ = check_against_ort(model, feeds, optimizer="egraph")
    (g,) = m.details["egraph"].groups
    assert g.chosen == want and set(g.alternatives) - ONE_THREAD == {"own", "openblas"} | APART
    fused = [n.group.members for n in m.details["graph"].nodes if n.group]
    ops = [[mem.op for mem in ms] for ms in fused]
    if want.endswith("apart"):
        assert ops == [["MatMul"], ["Add", "Relu"]]
        assert g.alternatives[want][0] == pytest.approx(
            anchor * (1.1 * blas if "blas" in want else 1) + epilogue + 0.1 * whole
        )
    else:
        assert ops == [["MatMul", "Add", "Relu"]]
    impls = set(m.runtime.gemm_impls.values())
    assert impls == {"OpenBLAS sgemm" if "openblas" in want else "pyforge sgemm (AVX2)"}
    line = "1 of 1 other GEMM groups on OpenBLAS" if "openblas" in want else "0 of 1"
    assert line in explain.report(m)


@pytest.mark.skipif(numba.get_num_threads() < 2, reason="one thread: nothing is split")
@pytest.mark.parametrize("serial_s, want", [(1e-4, "own, one thread"), (1e-2, "own")])
def test_a_gemm_runs_on_one_thread_where_its_cost_picks_and_matches_ort(
    monkeypatch, serial_s, want
):
    """A GEMM the runtime would split over its threads (a stall whenever another process holds
    one of their cores) is offered one thread too, on own sgemm and on OpenBLAS; the choice
    reaches the runtime through the step's label."""
    from pyforge.exec.cpu import own
    from pyforge.exec.steps import GemmStep
    from pyforge.lower_numba import costs as cm

    asked = []

    def fake(self, kind, shapes, dtype):
        asked.append(kind)
        return (serial_s if kind == "group@serial" else 1e-3), "cached"

    monkeypatch.setattr(cm.CostModel, "seconds", fake)
    monkeypatch.setattr(cm.CostModel, "measure", lambda self, kernels: None)
    rng = np.random.default_rng(8)
    w = numpy_helper.from_array(rng.standard_normal((128, 256)).astype(np.float32), "w")
    node = helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")
    model = make_model(
        [node], [("x", np.float32, (1, 128, 128))], [("y", np.float32, (1, 128, 256))], [w]
    )
    feeds = {"x": rng.standard_normal((1, 128, 128)).astype(np.float32)}
    m, _ = check_against_ort(model, feeds, optimizer="egraph")
    (g,) = m.details["egraph"].groups
    assert g.chosen == want and set(g.alternatives) == {"own", "openblas"} | ONE_THREAD
    assert set(asked) >= {"group", "group/blas", "group@serial", "group/blas@serial"}
    (step,) = [s for s in m.plan.steps if isinstance(s, GemmStep)]
    assert own.threads_for(step) == (1 if want.endswith("thread") else numba.get_num_threads())
    assert set(m.runtime.gemm_impls.values()) == {"pyforge sgemm (AVX2)"}
    assert m.details["egraph"].one_thread == (want != "own")
    assert m.details["egraph"].predicted == pytest.approx((1e-3, min(1e-3, 1.1 * serial_s)))


def test_a_cost_measured_by_other_code_is_not_used(tmp_path, monkeypatch):
    """The cost key carries a fingerprint of the lowering and runtime code: a table written
    before a change to either (or before versions were keyed) is dropped, other devices kept."""
    from pyforge.lower_numba import costs as cm

    monkeypatch.setenv("PYFORGE_COSTS", str(tmp_path / "costs.json"))
    shapes = ((1, 4, 8), (8, 8))
    dev = device_name("cpu")
    base = dev.rsplit(":", 1)[0]
    monkeypatch.setattr(cm, "load_class", lambda: "idle")
    key = f"|idle|gemm_bias|{json.dumps(shapes)}|float32"
    table = {
        dev + key: 1.0,
        base + ":0123456789ab" + key: 2.0,
        base + key: 3.0,
        "cuda:x" + key: 4.0,
    }
    (tmp_path / "costs.json").write_text(json.dumps(table))
    model = CostModel("cpu")
    assert model.seconds("gemm_bias", shapes, "float32") == (1.0, "cached")
    assert set(model.table) == {dev + key, "cuda:x" + key}
    monkeypatch.setattr(cm, "load_class", lambda: "busy")  # measured idle: not a busy cost
    assert CostModel("cpu").seconds("gemm_bias", shapes, "float32")[1] == "analytic"
    monkeypatch.setattr(cm, "load_class", lambda: "idle")
    monkeypatch.setitem(cm._VERSIONS, "cpu", "fedcba987654")  # the code changed since
    seconds, how = CostModel("cpu").seconds("gemm_bias", shapes, "float32")
    assert how == "analytic" and seconds != 1.0
