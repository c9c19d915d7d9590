"""Gemma 3 as an ONNX decoder with past_key_values, in the layout optimum and onnx-community use.

    model = build_decoder(Gemma3Config.tiny(), random_weights(Gemma3Config.tiny(), seed=0))

Weights are keyed by their GGUF names, numpy-shaped (out, in) as GGUF dequantizes them; the
RMSNorm scales hold (1 + w), as the GGUF converter stores them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ModelLoadError, OptionError

NEG = np.float32(-3.0e38)  # a masked score: exp underflows to 0, yet never -inf - -inf = NaN


@dataclass(frozen=True)
class Gemma3Config:
    hidden: int = 640
    layers: int = 18
    heads: int = 4
    kv_heads: int = 1
    head_dim: int = 256
    ffn: int = 2048
    vocab: int = 262144
    eps: float = 1e-6
    window: int = 512
    sliding_pattern: int = 6  # layer i is global when (i + 1) % sliding_pattern == 0
    rope_global: float = 1e6
    rope_local: float = 1e4
    query_pre_attn_scalar: float = 256.0
    context: int = 32768

    @classmethod
    def tiny(cls) -> Gemma3Config:
        """Four layers (1 and 3 global), GQA 4:1, a window of 4 so short tests cross it."""
        return cls(
            hidden=64,
            layers=4,
            heads=4,
            kv_heads=1,
            head_dim=16,
            ffn=128,
            vocab=320,
            window=4,
            sliding_pattern=2,
            query_pre_attn_scalar=16.0,
            context=128,
        )

    def sliding(self, layer: int) -> bool:
        return (layer + 1) % self.sliding_pattern != 0


def weight_shapes(c: Gemma3Config) -> dict[str, tuple[int, ...]]:
    """Every tensor the decoder reads, by GGUF name, numpy-shaped."""
    shapes = {"token_embd.weight": (c.vocab, c.hidden), "output_norm.weight": (c.hidden,)}
    q, kv = c.heads * c.head_dim, c.kv_heads * c.head_dim
    per_layer = {
        "attn_norm": (c.hidden,), "attn_q": (q, c.hidden), "attn_k": (kv, c.hidden),
        "attn_v": (kv, c.hidden), "attn_q_norm": (c.head_dim,), "attn_k_norm": (c.head_dim,),
        "attn_output": (c.hidden, q), "post_attention_norm": (c.hidden,),
        "ffn_norm": (c.hidden,), "ffn_gate": (c.ffn, c.hidden), "ffn_up": (c.ffn, c.hidden),
        "ffn_down": (c.hidden, c.ffn), "post_ffw_norm": (c.hidden,),
    }  # fmt: skip
    for i in range(c.layers):
        shapes.update({f"blk.{i}.{k}.weight": s for k, s in per_layer.items()})
    return shapes


def random_weights(config: Gemma3Config, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded weights of the right shapes and scales (norm scales near 1, matrices ~ 1/sqrt(in))."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in weight_shapes(config).items():
        if len(shape) == 1:
            out[name] = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            out[name] = (rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32)
    return out


def rope_tables(head_dim: int, base: float, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and signed sin by position, (rows, head_dim), computed in float32 as transformers does;
    the sin's first half is negated so rotate_half(x) * sin == swap_halves(x) * signed_sin."""
    inv = np.float32(1.0) / (
        np.float32(base) ** (np.arange(0, head_dim, 2).astype(np.float32) / np.float32(head_dim))
    )
    ang = np.arange(rows, dtype=np.float32)[:, None] * inv[None, :]
    cos, sin = np.cos(ang), np.sin(ang)
    return np.concatenate([cos, cos], 1), np.concatenate([-sin, sin], 1)


class _Graph:
    """Collects nodes and initializers; each op call returns its output's name."""

    def __init__(self):
        from onnx import helper, numpy_helper

        self.h, self.nh = helper, numpy_helper
        self.nodes, self.inits, self.n, self.names = [], [], 0, set()

    def const(self, name: str, array: np.ndarray) -> str:
        if name not in self.names:  # a named scalar is stored once, however often it is asked for
            self.names.add(name)
            self.inits.append(self.nh.from_array(np.asarray(array), name))
        return name

    def ints(self, *values: int) -> str:
        self.n += 1
        return self.const(f"c{self.n}", np.array(values, np.int64))

    def __call__(self, op: str, *inputs: str, **attrs) -> str:
        self.n += 1
        out = f"{op.lower()}_{self.n}"
        self.nodes.append(self.h.make_node(op, list(inputs), [out], name=f"{op}_{self.n}", **attrs))
        return out


def _rms(g: _Graph, x: str, weight: str, eps: str) -> str:
    ms = g("ReduceMean", g("Mul", x, x), axes=[-1], keepdims=1)
    return g("Mul", g("Div", x, g("Sqrt", g("Add", ms, eps))), weight)


def _gelu_tanh(g: _Graph, x: str) -> str:
    cube = g("Mul", g("Mul", x, x), x)
    inner = g("Mul", g("Add", x, g("Mul", cube, g.const("gelu_c", np.float32(0.044715)))),
              g.const("gelu_k", np.float32(np.sqrt(2.0 / np.pi))))  # fmt: skip
    # x * (0.5 * (1 + tanh)): halving is exact, so x * 0.5 * (..) rounds alike, and the chain
    # from tanh stays one fused kernel with the Mul by the up projection after it
    half = g("Mul", g("Add", g("Tanh", inner), g.const("one", np.float32(1.0))),
             g.const("half", np.float32(0.5)))  # fmt: skip
    return g("Mul", x, half)


def _rotate(g: _Graph, x: str, cos: str, sin: str, half: int) -> str:
    """x * cos + rotate_half(x) * sin, with the sign of rotate_half folded into sin; the halves
    swapped by a Gather over (.., 2, half) views, which its Mul takes as epilogue: two kernels."""
    x, cos, sin = (g("Reshape", t, g.ints(0, 0, 0, 2, half)) for t in (x, cos, sin))
    swapped = g("Gather", x, g.const("rope_swap", np.array([1, 0], np.int64)), axis=3)
    return g("Reshape", g("Add", g("Mul", x, cos), g("Mul", swapped, sin)), g.ints(0, 0, 0, -1))


def _masks(g: _Graph, c: Gemma3Config, rows: int | None) -> tuple[str, str]:
    """(global, sliding) boolean masks per the decoder contract, (batch, 1, groups * seq, total):
    row r is query r % seq, as the query heads sharing a KV head are folded into the rows.
    ``rows``: a static cache, where cache row k holds position k."""
    kpos = g("Sub", g("CumSum", "attention_mask", g.ints(1)), g.ints(1))
    if rows:
        kpos = g.const("cache_rows", np.arange(rows, dtype=np.int64)[None])
    k3 = g("Unsqueeze", kpos, g.ints(1))  # (b, 1, total)
    qpos = g("Tile", "position_ids", g.ints(1, c.heads // c.kv_heads))
    q3 = g("Unsqueeze", qpos, g.ints(2))  # (b, groups * seq, 1)
    valid = g("Equal", g("Unsqueeze", "attention_mask", g.ints(1)), g.ints(1))
    causal = g("And", g("LessOrEqual", k3, q3), valid)
    near = g("Less", g("Sub", q3, k3), g.ints(c.window))
    return tuple(g("Unsqueeze", m, g.ints(1)) for m in (causal, g("And", causal, near)))


def _attention(g, c: Gemma3Config, i: int, x: str, mask: str, cos: str, sin: str, at) -> str:
    p, hd, nq, nk = f"blk.{i}.", c.head_dim, c.heads, c.kv_heads

    def heads(name: str, n: int) -> str:  # (b, seq, n*hd) -> (b, seq, n, hd)
        return g("Reshape", g("MatMul", x, p + name + ".weight"), g.ints(0, 0, n, hd))

    # the q and k heads side by side: one norm (a scale per head, then q's times the attention
    # scale, its epilogue) and one rotary, then each a run of heads (b, n, seq, hd): views
    per_head = np.repeat([c.query_pre_attn_scalar**-0.5, 1], [nq, nk]).astype(np.float32)
    # q, k and v from one GEMM, each a column run of its result (a view at seq 1): every plan
    # of the model has the same weights, so they share one copy
    qkv = heads("attn_qkv", nq + 2 * nk)
    qk, v = (g("Slice", qkv, g.ints(a), g.ints(b), g.ints(2)) for a, b in ((0, nq + nk), (nq + nk, nq + 2 * nk)))  # fmt: skip
    qk = _rms(g, qk, p + "attn_qk_norm.weight", "eps")
    qk = g("Mul", qk, g.const("qk_scale", per_head[:, None]))
    qk = _rotate(g, g("Transpose", qk, perm=[0, 2, 1, 3]), cos, sin, hd // 2)
    q, k = (g("Slice", qk, g.ints(a), g.ints(b), g.ints(1)) for a, b in ((0, nq), (nq, nq + nk)))
    v = g("Transpose", v, perm=[0, 2, 1, 3])
    for t, new in (("key", k), ("value", v)):  # at: a static cache's rows, written in place
        op, ins, kw = ("ScatterND", [at, new], {}) if at else ("Concat", [new], {"axis": 2})
        g.nodes.append(g.h.make_node(op, [f"past_key_values.{i}.{t}", *ins], [f"present.{i}.{t}"],
                                     name=f"present_{i}_{t}", **kw))  # fmt: skip
    # the query heads of one KV head share its keys: fold them into the row axis, no Expand
    q = g("Reshape", q, g.ints(0, c.kv_heads, -1, hd))
    s = g("MatMul", q, g("Transpose", f"present.{i}.key", perm=[0, 1, 3, 2]))
    prob = g("Softmax", g("Where", mask, s, "neg"), axis=-1)
    o = g("Reshape", g("MatMul", prob, f"present.{i}.value"), g.ints(0, c.heads, -1, hd))
    o = g("Reshape", g("Transpose", o, perm=[0, 2, 1, 3]), g.ints(0, 0, c.heads * hd))
    return g("MatMul", o, p + "attn_output.weight")


def build_decoder(config: Gemma3Config, weights: dict[str, np.ndarray], precision: str = "fp32",
                  logits: str = "all", max_context: int | None = None, cache: str = "concat"):  # fmt: skip
    """The ONNX decoder (opset 17); rotary tables hold ``max_context`` positions (default: the
    model's context, at most 8192). fp16/bf16 store the matrices so, each Cast to float32.

    ``cache="concat"``: optimum's layout (present = past + the new rows). ``"static"``: batch 1,
    past and present ``max_context`` rows, the new rows scattered at ``position_ids`` (compile
    with ``state=state_map(config)`` to keep them in place), attention_mask over the rows."""
    from onnx import helper

    if precision not in ("fp32", "fp16", "bf16"):
        raise OptionError("precision", f"precision {precision!r}: expected fp32, fp16 or bf16")
    if logits not in ("all", "last"):
        raise OptionError("logits", f"logits {logits!r}: expected 'all' or 'last'")
    if cache not in ("concat", "static"):
        raise OptionError("cache", f"cache {cache!r}: expected 'concat' or 'static'")
    c, rows = config, max_context or min(config.context, 8192)
    g = _Graph()
    for name, w in _stored(c, weights).items():
        matrix = w.ndim == 2 and name != "token_embd.weight" and not name.endswith("norm.weight")
        if not matrix or precision == "fp32":
            g.const(name, w.T if matrix else w)
        else:
            _store_cast(g, name, np.ascontiguousarray(w.T), precision)
    hd = c.head_dim
    g.const("eps", np.float32(c.eps))
    g.const("neg", NEG)
    tables = {}
    for kind, base in (("local", c.rope_local), ("global", c.rope_global)):
        cos, sin = rope_tables(hd, base, rows)
        tables[kind] = [
            g("Unsqueeze", g("Gather", g.const(f"rope_{kind}_{t}", a), "position_ids"), g.ints(1))
            for t, a in (("cos", cos), ("sin", sin))
        ]
    static = rows if cache == "static" else None
    mask_global, mask_sliding = _masks(g, c, static)
    at = None
    if static:  # ScatterND indices (0, head, position) per head and new token: one kernel
        pos = g("Unsqueeze", "position_ids", g.ints(1, 3))  # (1, 1, seq, 1)
        heads = np.zeros((1, c.kv_heads, 1, 3), np.int64)
        heads[0, :, 0, 1] = np.arange(c.kv_heads)
        at = g("Add", g("Mul", pos, g.ints(0, 0, 1)), g.const("kv_head_ids", heads))
    h = g("Gather", "token_embd.weight", "input_ids")
    h = g("Mul", h, g.const("embed_scale", np.float32(np.sqrt(c.hidden))))
    for i in range(c.layers):
        p, sl = f"blk.{i}.", c.sliding(i)
        cos, sin = tables["local" if sl else "global"]
        a = _attention(g, c, i, _rms(g, h, p + "attn_norm.weight", "eps"),
                       mask_sliding if sl else mask_global, cos, sin, at)  # fmt: skip
        h = g("Add", h, _rms(g, a, p + "post_attention_norm.weight", "eps"))
        x = _rms(g, h, p + "ffn_norm.weight", "eps")
        gate_up = g("MatMul", x, p + "ffn_gate_up.weight")  # gate's columns, then up's
        gate, up = (g("Slice", gate_up, g.ints(a), g.ints(b), g.ints(2)) for a, b in ((0, c.ffn), (c.ffn, 2 * c.ffn)))  # fmt: skip
        f = g("Mul", _gelu_tanh(g, gate), up)
        h = g(
            "Add",
            h,
            _rms(g, g("MatMul", f, p + "ffn_down.weight"), p + "post_ffw_norm.weight", "eps"),
        )
    if logits == "last":
        h = g("Slice", h, g.ints(-1), g.ints(2**62), g.ints(1))
    h = _rms(g, h, "output_norm.weight", "eps")
    # the output projection shares the embedding initializer (Gemm transB), no transposed copy
    flat = g("Gemm", g("Reshape", h, g.ints(-1, c.hidden)), "token_embd.weight", transB=1)
    lead = g("Slice", g("Shape", h), g.ints(0), g.ints(2), g.ints(0))
    g.nodes.append(helper.make_node("Reshape", [flat, g("Concat", lead, g.ints(c.vocab), axis=0)],
                                    ["logits"], name="logits"))  # fmt: skip
    if logits == "last":  # the greedy pick on the device: a step then copies an id, not logits
        _greedy_pick(g, c.vocab)
    return _model(g, c, logits, static)


def _greedy_pick(g: _Graph, vocab: int) -> None:
    """next_token = ArgMax(logits) (first index of the largest; a NaN's first, as numpy). A
    vocabulary of 64k or more goes in two rounds, so the device's blocks share it: each of R
    chunks of C its ArgMax (a block a row), then the ArgMax of the chunks' values; one block
    scanning 262,144 logits took 204 us on the H200."""
    from onnx import helper

    chunk = next((k for k in (512, 1024, 256, 2048, 4096) if vocab % k == 0), 0)
    if vocab < 65536 or not chunk:
        g.nodes.append(helper.make_node("ArgMax", ["logits"], ["next_token"], name="next_token",
                                        axis=-1, keepdims=1))  # fmt: skip
        return
    rows = g("Reshape", "logits", g.ints(vocab // chunk, chunk))
    at = g("ArgMax", rows, axis=-1, keepdims=1)  # (R, 1): each chunk's first extreme
    best = g("Reshape", g("GatherElements", rows, at, axis=1), g.ints(1, vocab // chunk))
    c = g("ArgMax", best, axis=-1, keepdims=1)  # (1, 1): the first chunk holding the extreme
    pick = g(
        "Add",
        g("Mul", c, g.ints(chunk)),
        g("GatherElements", g("Reshape", at, g.ints(1, -1)), c, axis=1),
    )
    g.nodes.append(
        helper.make_node("Reshape", [pick, g.ints(1, 1, 1)], ["next_token"], name="next_token")
    )


def _stored(c: Gemma3Config, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The initializers by name, float32: each layer's q, k and v matrices as one (attn_qkv, its
    rows q's, k's, then v's), q's and k's norm scales as one (attn_qk_norm, a row of scales per
    head), the gate and up matrices as one (ffn_gate_up)."""
    out = {}
    for name, shape in weight_shapes(c).items():
        w = weights.get(name)
        if w is None or tuple(w.shape) != shape:
            got = "missing" if w is None else f"shape {tuple(w.shape)}"
            raise ModelLoadError(f"gemma3 weight {name!r}: {got}, expected {shape}")
        out[name] = np.asarray(w, np.float32)
    for i in range(c.layers):
        q, k, v = (out.pop(f"blk.{i}.attn_{t}.weight") for t in "qkv")
        qn, kn = (out.pop(f"blk.{i}.attn_{t}_norm.weight") for t in "qk")
        out[f"blk.{i}.attn_qkv.weight"] = np.concatenate([q, k, v])
        gate, up = (out.pop(f"blk.{i}.ffn_{t}.weight") for t in ("gate", "up"))
        out[f"blk.{i}.ffn_gate_up.weight"] = np.concatenate([gate, up])
        out[f"blk.{i}.attn_qk_norm.weight"] = np.stack([qn] * c.heads + [kn] * c.kv_heads)
    return out


def state_map(config: Gemma3Config) -> dict[str, str]:
    """A static-cache decoder's ``state`` option: each present aliases its past."""
    return {f"present.{i}.{t}": f"past_key_values.{i}.{t}"
            for i in range(config.layers) for t in ("key", "value")}  # fmt: skip


def _store_cast(g: _Graph, name: str, w: np.ndarray, precision: str) -> None:
    from onnx import TensorProto

    if precision == "fp16":
        g.inits.append(g.nh.from_array(w.astype(np.float16), name + ".half"))
    else:  # bf16: the top 16 bits of each float32, rounded to nearest even
        bits = w.view(np.uint32)
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
        t = g.h.make_tensor(name + ".half", TensorProto.BFLOAT16, w.shape, bits.tobytes(), raw=True)
        g.inits.append(t)
    g.nodes.append(g.h.make_node("Cast", [name + ".half"], [name], name=name + ".cast", to=1))


def _model(g: _Graph, c: Gemma3Config, logits: str, static: int | None):
    from onnx import TensorProto, helper

    f32, i64 = TensorProto.FLOAT, TensorProto.INT64
    b, past, total = (1, static, static) if static else ("batch", "past", "total")
    inputs = [helper.make_tensor_value_info("input_ids", i64, [b, "seq"]),
              helper.make_tensor_value_info("attention_mask", i64, [b, total]),
              helper.make_tensor_value_info("position_ids", i64, [b, "seq"])]  # fmt: skip
    outputs = [helper.make_tensor_value_info(
        "logits", f32, [b, "seq" if logits == "all" else 1, c.vocab])]  # fmt: skip
    if logits == "last":
        outputs.append(helper.make_tensor_value_info("next_token", i64, [b, 1, 1]))
    for i in range(c.layers):
        for t in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(
                f"past_key_values.{i}.{t}", f32, [b, c.kv_heads, past, c.head_dim]))  # fmt: skip
            outputs.append(helper.make_tensor_value_info(
                f"present.{i}.{t}", f32, [b, c.kv_heads, total, c.head_dim]))  # fmt: skip
    graph = helper.make_graph(g.nodes, "gemma3_decoder", inputs, outputs, g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model
