"""com.microsoft ops of exported and ORT-optimised transformers, expanded into ONNX ops: the GELU
family, the skip / simplified / embedding layer norms, RotaryEmbedding and MatMulNBits (its
constant weight dequantized at import). ONNX Runtime's CPU kernels are the reference."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from ..expand import Builder, expands

MS = "com.microsoft"


def i64(*values) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


def required(b: Builder, *names: str) -> list[int]:
    """Positive int attributes the op cannot do without, or a BadAttributeError naming them."""
    values = [b.attrs.get(name) for name in names]
    for name, value in zip(names, values):
        if not isinstance(value, int) or value <= 0:
            b.bad(f"attribute {name!r} must be a positive int, got {value!r}")
    return values


def scalar(b: Builder, value: float, like: str) -> str:
    return b.const(np.asarray(value, dtype=b.value(like).dtype))


@expands("Gelu", domain=MS)
def _gelu(b: Builder) -> None:
    b.op("Gelu", [b.input(0)], outputs=[b.output(0)])


@expands("BiasGelu", domain=MS)
def _bias_gelu(b: Builder) -> None:
    b.op("Gelu", [b.op("Add", [b.input(0), b.input(1)])], outputs=[b.output(0)])


@expands("FastGelu", domain=MS)
def _fast_gelu(b: Builder) -> None:
    # ORT's 0.5x(1 + tanh(0.797885x + 0.035677x^3)) is ONNX's tanh-approximate Gelu
    x = b.input(0)
    if b.input(1) is not None:
        x = b.op("Add", [x, b.input(1)])
    b.op("Gelu", [x], outputs=[b.output(0)], approximate="tanh")


@expands("QuickGelu", domain=MS)
def _quick_gelu(b: Builder) -> None:
    x = b.input(0)
    ax = b.op("Mul", [x, scalar(b, b.attrs.get("alpha", 1.702), x)])
    b.op("Mul", [x, b.op("Sigmoid", [ax])], outputs=[b.output(0)])


def _skip_sum(b: Builder, bias_at: int) -> str:
    """input + skip (+ bias), written to output 3 (input_skip_bias_sum) when the model uses it."""
    out = [b.output(3)] if b.output(3) else None
    s = b.op("Add", [b.input(0), b.input(1)], outputs=None if b.input(bias_at) else out)
    return s if b.input(bias_at) is None else b.op("Add", [s, b.input(bias_at)], outputs=out)


def rms_norm(b: Builder, x: str, scale: str, eps: float, out: str, inv_out: str = "") -> str:
    """RMSNormalization over the last axis; ``inv_out`` gets 1/rms (float32), which it lacks."""
    y = b.op("RMSNormalization", [x, scale], outputs=[out] if out else None, axis=-1, epsilon=eps)
    if inv_out:
        if b.value(x).dtype != np.float32:
            x = b.op("Cast", [x], to=TensorProto.FLOAT)
        ms = b.op("ReduceMean", [b.op("Mul", [x, x]), b.const(i64(-1))], keepdims=1)
        root = b.op("Sqrt", [b.op("Add", [ms, scalar(b, eps, x)])])
        b.op("Reciprocal", [root], outputs=[inv_out])
    return y


@expands("SkipLayerNormalization", domain=MS)
def _skip_layer_norm(b: Builder) -> None:
    s = _skip_sum(b, 4)
    eps = b.attrs.get("epsilon", 1e-12)
    outs = [b.output(k) for k in range(3)]
    b.op("LayerNormalization", [s, b.input(2), b.input(3) or ""], outputs=outs, epsilon=eps)


@expands("SkipSimplifiedLayerNormalization", domain=MS)
def _skip_simplified_layer_norm(b: Builder) -> None:
    if b.used(1):
        b.fail("output 1 ('mean'): the simplified norm has no mean, and ORT leaves it unset")
    s = _skip_sum(b, 3)
    rms_norm(b, s, b.input(2), b.attrs.get("epsilon", 1e-12), b.output(0), b.output(2))


@expands("SimplifiedLayerNormalization")  # ORT registers it in the ONNX domain, not com.microsoft
def _simplified_layer_norm(b: Builder) -> None:
    x = b.input(0)
    axis = b.attrs.get("axis", -1) % len(b.value(x).shape)
    if axis != len(b.value(x).shape) - 1:
        b.fail(f"axis {b.attrs['axis']}: only the last axis is normalized")
    rms_norm(b, x, b.input(1), b.attrs.get("epsilon", 1e-5), b.output(0), b.output(1))


@expands("EmbedLayerNormalization", domain=MS)
def _embed_layer_norm(b: Builder) -> None:
    ids, seq = b.input(0), b.value(b.input(0)).shape[1]
    pos = b.input(8) if b.input(8) is not None else b.const(np.arange(seq, dtype=np.int64))
    emb = b.op("Add", [b.op("Gather", [b.input(2), ids]), b.op("Gather", [b.input(3), pos])])
    if b.input(1) is not None and b.input(4) is not None:
        emb = b.op("Add", [emb, b.op("Gather", [b.input(4), b.input(1)])])
    if b.output(2):
        emb = b.op("Identity", [emb], outputs=[b.output(2)])
    eps = b.attrs.get("epsilon", 1e-12)
    b.op("LayerNormalization", [emb, b.input(5), b.input(6)], outputs=[b.output(0)], epsilon=eps)
    if b.output(1):  # ORT's mask_index: the count of ones in each row of the mask, else zeros
        if b.input(7) is None:
            b.op(
                "Identity",
                [b.const(np.zeros(b.value(ids).shape[:1], np.int32))],
                outputs=[b.output(1)],
            )
        else:
            b.op("ReduceSum", [b.input(7), b.const(i64(1))], outputs=[b.output(1)], keepdims=0)


def rotate(b: Builder, x: str, cos: str, sin: str, interleaved: bool, out: str = "") -> str:
    """RoPE on the last axis of ``x`` (length 2 * cos's), cos/sin broadcasting against x."""
    shape, outs = b.value(x).shape, [out] if out else None
    half = shape[-1] // 2
    if interleaved:  # pairs (x[2i], x[2i+1]): a trailing axis of 2 holds them
        x = b.op("Reshape", [x, b.const(i64(*shape[:-1], half, 2))])
        cos, sin = (b.op("Unsqueeze", [t, b.const(i64(-1))]) for t in (cos, sin))
    split = b.const(i64(1, 1) if interleaved else i64(half, half))
    x1, x2 = b.op("Split", [x, split], n_outputs=2, axis=-1)
    r1 = b.op("Sub", [b.op("Mul", [x1, cos]), b.op("Mul", [x2, sin])])
    r2 = b.op("Add", [b.op("Mul", [x2, cos]), b.op("Mul", [x1, sin])])
    if not interleaved:
        return b.op("Concat", [r1, r2], outputs=outs, axis=-1)
    return b.op("Reshape", [b.op("Concat", [r1, r2], axis=-1), b.const(i64(*shape))], outputs=outs)


def rope(b: Builder, x: str, pos: str, caches: tuple, interleaved, heads_axis: int, out=""):
    """Rotary embedding of a 4-D x whose heads lie on ``heads_axis`` (BNSH: 1, BSNH: 2) at
    positions ``pos`` (B, S) or (S,); the first 2 * cos_cache.shape[1] features rotate."""
    rot, h = 2 * b.value(caches[0]).shape[1], b.value(x).shape[-1]
    cos, sin = (b.op("Gather", [c, pos]) for c in caches)
    at = heads_axis - 2 + len(b.value(pos).shape)  # a unit heads axis in cos and sin
    cos, sin = (b.op("Unsqueeze", [t, b.const(i64(at))]) for t in (cos, sin))
    if rot == h:
        return rotate(b, x, cos, sin, interleaved, out)
    head, tail = b.op("Split", [x, b.const(i64(rot, h - rot))], n_outputs=2, axis=-1)
    y = rotate(b, head, cos, sin, interleaved)
    return b.op("Concat", [y, tail], outputs=[out] if out else None, axis=-1)


@expands("RotaryEmbedding", domain=MS)
def _rotary_embedding(b: Builder) -> None:
    if b.attrs.get("is_packed_batching", 0):
        b.fail("is_packed_batching=1: ragged batches are not supported")
    x, pos = b.input(0), b.input(1)
    shape = b.value(x).shape
    seq = shape[1] if len(shape) == 3 else shape[2]
    if b.value(pos).shape in ((1,), ()):  # one start position: positions start + 0..S-1
        pos = b.op(
            "Add",
            [b.op("Reshape", [pos, b.const(i64(1))]), b.const(np.arange(seq, dtype=np.int64))],
        )
    caches, interleaved = (b.input(2), b.input(3)), b.attrs.get("interleaved", 0)
    if len(shape) == 4:
        rope(b, x, pos, caches, interleaved, 1, b.output(0))
        return
    heads = b.attrs.get("num_heads", 0) or shape[2] // (2 * b.value(caches[0]).shape[1])
    x4 = b.op("Reshape", [x, b.const(i64(shape[0], seq, heads, shape[2] // heads))])
    y = rope(b, x4, pos, caches, interleaved, 2)
    b.op("Reshape", [y, b.const(i64(*shape))], outputs=[b.output(0)])


def _unpack(packed: np.ndarray, bits: int) -> np.ndarray:
    """uint8 bytes -> their 8/bits values each, low bits first, along a new last-axis run."""
    shifts = np.arange(0, 8, bits, dtype=np.uint8)
    vals = (packed[..., None] >> shifts) & np.uint8((1 << bits) - 1)
    return vals.reshape(*packed.shape[:-1], -1)


@expands("MatMulNBits", domain=MS)
def _matmul_nbits(b: Builder) -> None:
    k, n, block = required(b, "K", "N", "block_size")
    bits = b.attrs.get("bits", 4)
    if bits not in (2, 4, 8):
        b.fail(f"bits={bits}: only 2, 4 and 8 are supported")
    if b.input(4) is not None:
        b.fail("input 4 (g_idx): act-order group indices are not supported")
    arrays = [None if b.input(i) is None else b.value(b.input(i)).const for i in (1, 2, 3)]
    for i, name, arr in zip((1, 2, 3), ("B", "scales", "zero_points"), arrays):
        if b.input(i) is not None and arr is None:
            b.fail(f"input {i} ({name}) is not a constant: only constant weights are dequantized")
    q, scales, zp = arrays
    blocks = -(-k // block)
    if q.size != n * blocks * block * bits // 8 or scales.size != n * blocks:
        b.bad(f"B {q.shape} / scales {scales.shape} do not hold N={n} x {blocks} blocks of {block}")
    q = _unpack(q.reshape(n, blocks, -1), bits).astype(np.float32)  # (N, blocks, block)
    if zp is None:
        zp = np.full((n, blocks), 2 ** (bits - 1), np.float32)
    elif zp.dtype == np.uint8:
        zp = _unpack(zp.reshape(n, -1), bits)[:, :blocks].astype(np.float32)
    w = (q - zp.reshape(n, blocks, 1)) * scales.reshape(n, blocks, 1).astype(np.float32)
    dtype = b.value(b.input(0)).dtype
    w = np.ascontiguousarray(w.reshape(n, -1)[:, :k].T).astype(dtype)
    if b.input(5) is None:
        b.op("MatMul", [b.input(0), b.const(w)], outputs=[b.output(0)])
    else:
        b.op("Add", [b.op("MatMul", [b.input(0), b.const(w)]), b.input(5)], outputs=[b.output(0)])
