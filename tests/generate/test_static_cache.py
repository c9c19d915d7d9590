"""The KV cache kept in place: a static-cache Gemma 3 decoder compiled with ``state`` (present
aliasing past), against the concat layout; one decode plan; nothing fed or copied per step; the
cuda path in the simulator; bad state specs."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import pyforge
from pyforge.errors import OptionError

ort = pytest.importorskip("onnxruntime")
gemma3 = pytest.importorskip("pyforge.generate.gemma3")

CONTEXT = 48


def prompt(seed: int, n: int) -> list[int]:
    return [2] + [int(t) for t in np.random.default_rng(seed).integers(3, 320, n - 1)]


def recorded(gen, fn):
    """fn()'s result and the logits each step produced (greedy on the host, from the logits:
    the decoder's next_token is not read)."""
    seen, step, was, gen._next = [], gen._step, gen._next, False
    gen._step = lambda ids, width: seen.append(step(ids, width)) or seen[-1]
    try:
        return fn(), seen
    finally:
        del gen._step
        gen._next = was


@pytest.fixture(scope="module")
def config():
    return gemma3.Gemma3Config.tiny()


@pytest.fixture(scope="module")
def weights(config):
    return gemma3.random_weights(config, seed=5)


@pytest.fixture(scope="module")
def static(config, weights):
    return pyforge.TextGenerator.from_config(
        config, weights, target="cpu", max_context=CONTEXT, cache="static"
    )


@pytest.fixture(scope="module")
def concat(config, weights):
    return pyforge.TextGenerator.from_config(
        config, weights, target="cpu", max_context=CONTEXT, cache="concat", decode_bucket=16
    )


def test_static_and_concat_give_the_same_tokens_and_logits(static, concat):
    """A 9-token prompt (the tiny window is 4), 20 greedy tokens, then a continuation that
    reuses the cached prefix and prefills a padded suffix: the same tokens, logits to 1e-5."""
    ids = prompt(1, 9)
    for gen in (static, concat):
        gen.reset()
    (a, la), (b, lb) = (
        recorded(g, lambda g=g: g.generate(ids, max_new_tokens=20)) for g in (static, concat)
    )
    assert a.tokens == b.tokens and len(a.tokens) == 20
    np.testing.assert_allclose(np.array(la), np.array(lb), rtol=1e-5, atol=1e-5)
    more = ids + a.tokens + prompt(2, 6)[1:]
    (a, la), (b, lb) = (
        recorded(g, lambda g=g: g.generate(more, max_new_tokens=8)) for g in (static, concat)
    )
    assert a.reused_tokens == b.reused_tokens == len(ids) + 19  # the last token was never fed
    assert a.tokens == b.tokens
    np.testing.assert_allclose(np.array(la), np.array(lb), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout", ["static", "concat"])
def test_the_decoders_own_greedy_pick_gives_the_hosts_tokens(layout, static, concat):
    """Greedy steps read the decoder's next_token (an ArgMax on the target) and copy no logits;
    the tokens are those of argmax over the copied logits, over a prefill and 16 steps."""
    gen, ids = {"static": static, "concat": concat}[layout], prompt(3, 7)
    assert gen._next and "next_token" in gen.model.output_names
    gen.reset()
    picked = gen.generate(ids, max_new_tokens=16).tokens
    gen.reset()
    (host, logits) = recorded(gen, lambda: gen.generate(ids, max_new_tokens=16))
    assert picked == host.tokens == [int(np.argmax(x)) for x in logits]


@pytest.mark.gpu
def test_run_ahead_decode_on_cuda_gives_the_step_by_step_tokens(config, weights):
    """On a GPU: greedy decode with a step queued ahead (inputs copied on the device) gives the
    tokens of step-by-step decode and of the cpu, also when eos or max_context ends it early."""
    gen = pyforge.TextGenerator.from_config(
        config, weights, target="cuda", max_context=24, cache="static"
    )
    ids = prompt(8, 6)
    want = static_tokens = None
    for run_ahead in (False, True, True):
        gen._next = run_ahead
        gen.reset()
        got = gen.generate(ids, max_new_tokens=30)  # runs into max_context (24 rows)
        assert got.stop_reason == "max_context" and len(got.tokens) == 24 - 6 + 1
        want = want or got.tokens
        assert got.tokens == want
    cpu = pyforge.TextGenerator.from_config(config, weights, target="cpu", max_context=24)
    static_tokens = cpu.generate(ids, max_new_tokens=30).tokens
    assert static_tokens == want
    gen.eos_id = want[7]
    gen.reset()
    cut = gen.generate(ids, max_new_tokens=30)
    assert cut.stop_reason == "eos" and cut.tokens == want[: want.index(want[7])]
    more = gen.generate(ids + cut.tokens + [want[7]], max_new_tokens=3)  # continues the rows
    assert more.reused_tokens == len(ids) + len(cut.tokens)


def test_the_static_cache_matches_ort_running_the_same_file(config, weights, static):
    """ORT runs the static decoder one prompt at a time: its present rows and logits."""
    proto = gemma3.build_decoder(
        config, weights, logits="last", max_context=CONTEXT, cache="static"
    )
    sess = ort.InferenceSession(proto.SerializeToString())
    ids = prompt(3, 7)
    feeds = {"input_ids": np.array([ids]), "position_ids": np.arange(7)[None],
             "attention_mask": (np.arange(CONTEXT) < 7)[None].astype(np.int64)}  # fmt: skip
    rng = np.random.default_rng(0)  # rows past the valid ones hold anything: masked off
    for name in gemma3.state_map(config).values():
        feeds[name] = rng.standard_normal(
            (1, config.kv_heads, CONTEXT, config.head_dim), np.float32
        )
    want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    static.reset()
    got = static.model.predict(
        {k: feeds[k] for k in ("input_ids", "position_ids", "attention_mask")}
    )
    np.testing.assert_allclose(got["logits"], want["logits"], rtol=1e-4, atol=1e-5)
    for name in gemma3.state_map(config):
        np.testing.assert_allclose(got[name][:, :, :7], want[name][:, :, :7], rtol=1e-4, atol=1e-5)


def test_one_decode_plan_and_no_copy_of_the_state(static, monkeypatch):
    """Every decode step runs the one seq-1 plan; no past is fed, and the present outputs are
    views of the one state buffer the model's plans share."""
    static.reset()
    static.generate(prompt(4, 5), max_new_tokens=2)  # the plans this test uses, compiled
    runs, fed, step = [], [], type(static.model.runtime).run
    monkeypatch.setattr(
        type(static.model.runtime),
        "run",
        lambda rt, feeds: (runs.append(rt), fed.append(set(feeds)), step(rt, feeds))[2],
    )
    from pyforge.generate.runtime import _Cache

    copies = []  # the concat layout's row copies out of present
    monkeypatch.setattr(_Cache, "_copy", lambda *a: copies.append(a))
    static.reset()
    r = static.generate(prompt(4, 5), max_new_tokens=30)
    assert len(r.tokens) == 30 and len(runs) == 30
    decode = {id(rt) for rt in runs[1:]}
    assert len(decode) == 1 and id(runs[0]) not in decode  # one plan for 29 decode steps
    assert all(f == {"input_ids", "attention_mask", "position_ids"} for f in fed)
    plans = static.model.stats["plans"]
    assert sum(p["input_ids"] == (1, 1) for p in plans) == 1 and len(plans) <= 3, plans
    out = static.model.predict({"input_ids": np.array([[7]]), "position_ids": np.array([[34]]),
                                "attention_mask": np.ones((1, CONTEXT), np.int64)})  # fmt: skip
    state = static.model.runtime.state
    assert all(np.shares_memory(out[n], state) for n in static.model.state)
    assert not copies
    assert static.model.plan.arena_bytes < static.model.plan.state_bytes  # the cache is not in it


SIMULATED = """
import numpy as np, pyforge
from pyforge.generate import gemma3
c = gemma3.Gemma3Config.tiny()
c = gemma3.Gemma3Config(**{**c.__dict__, "vocab": 64, "layers": 2, "hidden": 32, "ffn": 32, "head_dim": 8})
w = gemma3.random_weights(c, seed=1)
out = {}
for target in ("cpu", "cuda"):
    gen = pyforge.TextGenerator.from_config(c, w, target=target, max_context=10, cache="static",
                                            prefill_buckets=None)
    fast = gen.generate([2, 9, 17, 33, 40, 5], max_new_tokens=2).tokens  # next_token's ids
    gen.reset()
    seen, step, gen._next = [], gen._step, False  # the logits every step, greedy on the host
    gen._step = lambda ids, width: seen.append(step(ids, width)) or seen[-1]
    tokens = gen.generate([2, 9, 17, 33, 40, 5], max_new_tokens=2).tokens
    assert fast == tokens, (fast, tokens)
    state = gen.model.runtime.state
    state = state if target == "cpu" else state.copy_to_host()
    out[target] = tokens, np.array(seen), state.view(np.float32), len(gen.model.stats["plans"])
print(out["cpu"][0], out["cuda"][0], out["cuda"][3])
assert out["cpu"][0] == out["cuda"][0] and out["cuda"][3] == 2
np.testing.assert_allclose(out["cuda"][1], out["cpu"][1], rtol=1e-4, atol=1e-5)
np.testing.assert_allclose(out["cuda"][2], out["cpu"][2], rtol=1e-4, atol=1e-5)  # the caches
assert np.abs(out["cpu"][2]).max() > 0
print("static cache ok")
"""


@pytest.mark.sim
@pytest.mark.slow  # 2 steps of 2 layers simulated: 20-50 s on a loaded 2-core host
def test_static_cache_on_cuda_in_the_simulator():
    """The cuda runtime's state buffer (step mode: the simulator captures no graph) gives the
    cpu's tokens and logits."""
    pytest.importorskip("numba.cuda")
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    run = subprocess.run([sys.executable, "-c", SIMULATED], env=env, capture_output=True,
                         text=True, timeout=600, check=False)  # fmt: skip
    assert run.returncode == 0 and "static cache ok" in run.stdout, run.stderr[-3000:]


def _scatter_model(reader_after: bool):
    """present = ScatterND(past, at, new); with ``reader_after``, y = past + 1 is made after it."""
    from onnx import TensorProto, helper

    f32, i64 = TensorProto.FLOAT, TensorProto.INT64
    nodes = [helper.make_node("ScatterND", ["past", "at", "new"], ["present"], name="write")]
    outs = [helper.make_tensor_value_info("present", f32, [4, 3])]
    if reader_after:
        one = helper.make_tensor("one", f32, [], [1.0])
        nodes.append(helper.make_node("Add", ["past", "one"], ["y"], name="late_add"))
        outs.append(helper.make_tensor_value_info("y", f32, [4, 3]))
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("past", f32, [4, 3]),
         helper.make_tensor_value_info("at", i64, [1, 1]),
         helper.make_tensor_value_info("new", f32, [1, 3])],
        outs, [one] if reader_after else [],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_small_state_model_keeps_its_buffer_across_calls():
    model = pyforge.compile(_scatter_model(False), target="cpu", state={"present": "past"})
    assert [s.name for s in model.inputs] == ["at", "new"]
    rng = np.random.default_rng(0)
    want = np.zeros((4, 3), np.float32)
    for row in (2, 0, 2, 3):
        new = rng.standard_normal((1, 3)).astype(np.float32)
        want[row] = new
        got = model.predict({"at": np.array([[row]]), "new": new})
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    "state, match",
    [
        ({"present": "present"}, "state="),
        (["present"], "state="),
        ({"present": 3}, "state="),
        ({"present": "nope"}, "'nope'.*not an output and input"),
        ({"past": "present"}, "not an output and input"),
    ],
)
def test_bad_state_specs_raise_option_error(state, match):
    with pytest.raises(OptionError, match=match):
        pyforge.compile(_scatter_model(False), target="cpu", state=state)


def test_an_illegal_alias_names_the_node(config, weights):
    with pytest.raises(OptionError, match="'late_add' \\(Add\\) reads 'past' after node 'write'"):
        pyforge.compile(_scatter_model(True), target="cpu", state={"present": "past"})
    concat = gemma3.build_decoder(config, weights, logits="last", max_context=CONTEXT)
    with pytest.raises(OptionError, match="state input 'past_key_values.0.key' has shape"):
        pyforge.compile(concat, target="cpu", state=gemma3.state_map(config))
    fixed = {f"past_key_values.{i}.{t}": (1, 1, 8, 16) for i in range(4) for t in ("key", "value")}
    fixed["attention_mask"] = (1, 9)
    with pytest.raises(
        OptionError, match="made by node 'present_0_key' \\(Concat\\), not by a ScatterND"
    ):
        pyforge.compile(concat, target="cpu", state=gemma3.state_map(config), input_shapes=fixed)


def test_a_saved_state_plan_loads_strictly(tmp_path):
    import json

    from pyforge.errors import ModelLoadError
    from pyforge.exec.plan import meta_checksum

    model = pyforge.compile(_scatter_model(False), target="cpu", state={"present": "past"})
    model.save(tmp_path / "p")
    loaded = pyforge.load(tmp_path / "p", target="cpu")
    assert loaded.state == {"present": "past"} and [s.name for s in loaded.inputs] == ["at", "new"]
    new = np.random.default_rng(1).standard_normal((2, 1, 3)).astype(np.float32)
    loaded.predict({"at": np.array([[1]]), "new": new[0]})
    got = loaded.predict({"at": np.array([[3]]), "new": new[1]})
    np.testing.assert_array_equal(got[[1, 3]], new[:, 0])
    path = tmp_path / "p" / "plan.json"
    cases = [("state", {"present": "at"}, "field 'state'"), ("state", {"x": 1}, "field 'state'"),
             ("state_bytes", 8, "reach past the state"), ("state_bytes", -1, "state_bytes")]  # fmt: skip
    for field, value, match in cases:
        meta = json.loads(path.read_text())
        meta[field] = value
        meta["checksum"] = meta_checksum(meta)
        (tmp_path / "bad").mkdir(exist_ok=True)
        for f in (tmp_path / "p").rglob("*"):
            if f.is_file():
                dst = tmp_path / "bad" / f.relative_to(tmp_path / "p")
                dst.parent.mkdir(exist_ok=True)
                dst.write_bytes(f.read_bytes())
        (tmp_path / "bad" / "plan.json").write_text(json.dumps(meta))
        with pytest.raises(ModelLoadError, match=match):
            pyforge.load(tmp_path / "bad", target="cpu")


def test_the_cuda_decode_step_re_views_q_k_v_without_a_kernel(config, weights):
    """Per layer of the cuda decode plan: 4 GEMMs (q, k, v one, gate and up one, their parts
    views) and 7 kernels; the seq-1 head Transposes and the logits' last row are views, the q
    and k heads one norm and one rotary kernel (Gather + Mul + Mul + Add), the GELU one kernel
    with its Mul."""
    from pyforge.compiler import compile_to_plan
    from pyforge.options import CompileOptions

    proto = gemma3.build_decoder(
        config, weights, logits="last", max_context=CONTEXT, cache="static"
    )
    shapes = {"input_ids": (1, 1), "position_ids": (1, 1)}
    opts = CompileOptions(state=gemma3.state_map(config), input_shapes=shapes).resolve("cuda")
    plan, _ = compile_to_plan(proto, opts)
    ops = [s.label.split()[0] for s in plan.steps]
    assert not any(op.startswith(("Transpose", "Concat")) for op in ops), ops
    assert ops.count("Slice") == 0
    assert ops.count("MatMul") == 4 * config.layers
    kernels = [s for s in plan.steps if hasattr(s, "kernel")]
    assert ops.count("Gather+Mul+Mul+Add") == ops.count("RMSNormalization+Mul") == config.layers
    # a junction (RMSNorm, residual Add, RMSNorm) a kernel, but the last layer's (its h is
    # read through the logits' last-row view); K and V written by one scatter kernel
    assert ops.count("ResidualRMSNorm") == 2 * config.layers - 1
    assert ops.count("ScatterND+ScatterND") == config.layers
    # tables, masks, indices, ends, the first norm, the last junction, the pick (next_token)
    assert len(kernels) == 7 * config.layers + 13, ops


@pytest.mark.slow
def test_the_in_place_scatter_compiles_to_ptx(config, weights, tmp_path):
    """The cuda plan of the static decoder: its ScatterND kernels write present over past (no
    copy loop) and compile to sm_90 PTX."""
    from tests.lower_numba.test_ptx import _ptx_available, _ptx_of

    if not _ptx_available():
        pytest.skip("no numba-cuda with NVVM/NVRTC ([cuda] extra) to compile PTX")
    from pyforge.compiler import compile_to_plan
    from pyforge.options import CompileOptions

    proto = gemma3.build_decoder(
        config, weights, logits="last", max_context=CONTEXT, cache="static"
    )
    shapes = {"input_ids": (1, 1), "position_ids": (1, 1)}
    opts = CompileOptions(state=gemma3.state_map(config), input_shapes=shapes).resolve("cuda")
    plan, _ = compile_to_plan(proto, opts)
    scatters = [s for s in plan.steps if s.label.startswith("ScatterND")]
    assert len(scatters) == config.layers  # K's and V's: siblings, one kernel
    for step in scatters:
        names = [a for kind, a in step.args if kind == "t"]  # kernel parameters t0, t1, ...
        pasts = [k for k, name in enumerate(names) if name.startswith("past_key_values")]
        assert len(pasts) == 2
        for k in pasts:  # each scatter's output is its parameter before its data's
            out = names[k - 1]
            assert plan.slots[names[k]] == plan.slots[out] and plan.slots[out].region == "state"
            assert f"t{k}[" not in plan.kernels[step.kernel]["cuda"]  # past never read: no copy
    for step in {s.kernel: s for s in scatters}.values():
        assert _ptx_of(plan, step, tmp_path)
