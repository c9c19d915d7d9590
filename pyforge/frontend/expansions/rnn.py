"""RNN, GRU and LSTM, and com.microsoft's DynamicQuantizeLSTM, unrolled over their static sequence.

X is multiplied by W for every step at once; each step then emits the recurrent MatMul, the gate
split, activations and state update, and the steps' hidden states are concatenated into Y. ONNX
Runtime's CPU kernels are the reference (also for how activation_alpha/beta are consumed).
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from ..expand import Builder, expands

_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
_DEFAULT_ACTS = {"RNN": ("Tanh",), "GRU": ("Sigmoid", "Tanh"), "LSTM": ("Sigmoid", "Tanh", "Tanh")}
_UNARY = {"relu": "Relu", "tanh": "Tanh", "sigmoid": "Sigmoid", "softsign": "Softsign"}
_UNARY["softplus"] = "Softplus"
# name -> (alpha, beta) defaults, None where the function takes no such value (ORT's table)
_ARGS = {
    "affine": (0.0, 0.0),
    "scaledtanh": (0.0, 0.0),
    "hardsigmoid": (0.2, 0.5),
    "leakyrelu": (0.01, None),
    "thresholdedrelu": (0.0, None),
    "elu": (1.0, None),
}
_ACT_OPS = {"hardsigmoid": "HardSigmoid", "leakyrelu": "LeakyRelu", "elu": "Elu"}
_ACT_OPS["thresholdedrelu"] = "ThresholdedRelu"


def _i64(*values) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


class _Rnn:
    """One RNN/GRU/LSTM node being unrolled: its attributes read once, and emit helpers."""

    def __init__(self, b: Builder, kind: str, transposed: bool = False) -> None:
        """``transposed``: W and R come as [dirs, in|H, G*H] (DynamicQuantizeLSTM), not
        ONNX's [dirs, G*H, in|H]."""
        self.b, self.kind, a = b, kind, b.attrs
        xv = b.value(b.input(0))
        if len(xv.shape) != 3:
            b.bad(f"X has shape {xv.shape}; a 3-d [seq, batch, input] tensor is needed")
        self.dt = xv.dtype
        self.layout = int(a.get("layout", 0))
        if self.layout not in (0, 1):
            b.bad(f"layout {self.layout}: 0 or 1")
        self.seq, self.batch = xv.shape[self.layout], xv.shape[1 - self.layout]
        direction = a.get("direction", "forward")
        dirs = {"forward": [False], "reverse": [True], "bidirectional": [False, True]}
        if direction not in dirs:
            b.bad(f"direction {direction!r}: forward, reverse or bidirectional")
        self.reverse = dirs[direction]
        r_shape = b.value(b.input(2)).shape
        if len(r_shape) != 3:
            b.bad(f"R has shape {r_shape}, not 3-d")
        self.hidden = hid = int(a.get("hidden_size") or r_shape[1 if transposed else 2])
        nd, gh, n_in = len(self.reverse), _GATES[kind] * hid, xv.shape[2]
        state = (nd, self.batch, hid) if self.layout == 0 else (self.batch, nd, hid)
        w, r = ((n_in, gh), (hid, gh)) if transposed else ((gh, n_in), (gh, hid))
        expected = {1: (nd, *w), 2: (nd, *r), 3: (nd, 2 * gh), 5: state, 6: state}
        expected.update({7: (nd, 3 * hid)} if kind == "LSTM" else {})
        for k, shape in expected.items():
            got = None if b.input(k) is None else b.value(b.input(k)).shape
            if got not in (None, shape):
                b.bad(f"input {k} has shape {got}, not {shape}")
        clip = a.get("clip")
        self.clip = None if clip is None else (-float(clip), float(clip))
        self.acts = self._activations()
        self.lens = self._lengths()

    def c(self, value, dtype=None) -> str:
        """A constant; python numbers and lists take the node's float type."""
        if dtype is None and not isinstance(value, np.ndarray):
            dtype = self.dt
        return self.b.const(np.asarray(value, dtype=dtype))

    def op(self, op_type: str, *inputs: str, **attrs) -> str:
        return self.b.op(op_type, list(inputs), **attrs)

    def cols(self, t: str, start: int, end: int) -> str:
        """Columns [start, end) of ``t`` (its last axis)."""
        return self.op("Slice", t, self.c(_i64(start)), self.c(_i64(end)), self.c(_i64(-1)))

    def _activations(self) -> list[list]:
        b = self.b
        per = len(_DEFAULT_ACTS[self.kind])
        names = list(b.attrs.get("activations") or _DEFAULT_ACTS[self.kind] * len(self.reverse))
        if len(names) < per * len(self.reverse):  # RNN's schema default lists two
            b.bad(f"activations: {len(names)} given, {per * len(self.reverse)} expected")
        alphas = iter(b.attrs.get("activation_alpha") or ())
        betas = iter(b.attrs.get("activation_beta") or ())
        fns = []
        for name in names:
            key = name.lower()
            if key not in _UNARY and key not in _ARGS:
                b.fail(f"activation {name!r} (maps {sorted(_UNARY) + sorted(_ARGS)})")
            alpha, beta = _ARGS.get(key, (None, None))
            alpha = None if alpha is None else float(next(alphas, alpha))
            beta = None if beta is None else float(next(betas, beta))
            fns.append((key, alpha, beta))
        return [fns[d * per : (d + 1) * per] for d in range(len(self.reverse))]

    def act(self, fn: tuple, x: str, clip: bool = True) -> str:
        key, alpha, beta = fn
        if clip and self.clip is not None:
            x = self.op("Clip", x, self.c(self.clip[0]), self.c(self.clip[1]))
        if key in _UNARY:
            return self.op(_UNARY[key], x)
        if key == "affine":
            return self.op("Add", self.op("Mul", x, self.c(alpha)), self.c(beta))
        if key == "scaledtanh":
            return self.op("Mul", self.op("Tanh", self.op("Mul", x, self.c(beta))), self.c(alpha))
        return self.b.op(_ACT_OPS[key], [x], alpha=alpha, beta=beta)

    def _lengths(self):
        """sequence_lens as a constant array, or its name when only known at run time; None
        when every batch entry runs the whole sequence."""
        name = self.b.input(4)
        if name is None:
            return None
        v = self.b.value(name)
        if v.shape != (self.batch,):
            self.b.bad(f"sequence_lens has shape {v.shape}, not ({self.batch},)")
        if v.const is None:
            return name
        lens = np.asarray(v.const, np.int64)
        if lens.min() < 0 or lens.max() > self.seq:
            self.b.bad(f"sequence_lens {lens.tolist()} outside [0, {self.seq}]")
        return None if (lens == self.seq).all() else lens

    def mask(self, t: int):
        """Which batch entries step ``t`` advances: None (all), False (none) or a [batch, 1] bool
        tensor's name."""
        if self.lens is None:
            return None
        if isinstance(self.lens, np.ndarray):
            m = self.lens > t
            return None if m.all() else (False if not m.any() else self.c(m[:, None], bool))
        lens = self.op("Reshape", self.lens, self.c(_i64(self.batch, 1)))
        return self.op("Less", self.c(t, self.b.value(self.lens).dtype), lens)

    def nonempty(self, state: str | None) -> str | None:
        """ORT's final state of a zero-length batch entry is 0, not its initial state."""
        m = self.mask(0)
        if m is None or state is None:
            return state
        if m is False:
            return self.c(np.zeros((self.batch, self.hidden)), self.dt)
        return self.op("Where", m, state, self.c(0.0))

    def remap(self, t: str, idx_shape: tuple) -> str:
        """``t`` with each batch entry's first len steps reversed along the sequence axis (its
        own inverse); steps past len map among themselves."""
        lens = self.lens
        if isinstance(lens, np.ndarray):
            lens = self.c(lens, np.int64)
        else:
            lens = self.b.op("Cast", [lens], to=TensorProto.INT64)
        steps = np.arange(self.seq, dtype=np.int64)
        if self.layout == 0:
            steps, lens = steps[:, None], self.op("Reshape", lens, self.c(_i64(1, self.batch)))
        else:
            lens = self.op("Reshape", lens, self.c(_i64(self.batch, 1)))
        rev = self.op("Sub", self.op("Add", lens, self.c(self.seq - 1, np.int64)), self.c(steps))
        idx = self.op("Mod", rev, self.c(self.seq, np.int64))
        idx = self.op("Reshape", idx, self.c(_i64(*idx_shape)))
        shape = self.c(_i64(*self.b.value(t).shape))
        return self.op("GatherElements", t, self.op("Expand", idx, shape), axis=self.layout)

    def state0(self, k: int, d: int) -> str:
        """Initial hidden (k=5) or cell (k=6) state of direction ``d``, [batch, hidden]."""
        name = self.b.input(k)
        if name is None:
            return self.c(np.zeros((self.batch, self.hidden)), self.dt)
        return self.op("Gather", name, self.c(d, np.int64), axis=self.layout)

    def run(self, weights) -> None:
        """Emit the whole node; ``weights(d)`` gives direction d's (W^T, R^T), [in|H, G*H]."""
        b, hid = self.b, self.hidden
        x_shape = b.value(b.input(0)).shape
        n_in = x_shape[2]
        gh = _GATES[self.kind] * hid
        self.lbr = self.kind == "GRU" and bool(b.attrs.get("linear_before_reset", 0))
        groups = [(0, 2 * hid), (2 * hid, gh)] if self.kind == "GRU" else [(0, gh)]
        ys, hs, cs = [], [], []
        for d, reverse in enumerate(self.reverse):
            wt, rt = weights(d)
            bias = rbh = None
            if b.input(3) is not None:
                bd = self.op("Gather", b.input(3), self.c(d, np.int64), axis=0)
                wb, rb = self.cols(bd, 0, gh), self.cols(bd, gh, 2 * gh)
                if self.lbr:  # GRU's Rbh sits inside r * (h Rh + Rbh), not in X's bias
                    rbh = self.cols(rb, 2 * hid, gh)
                    rb = self.op("Mul", rb, self.c(np.arange(gh) < 2 * hid, self.dt))
                bias = self.op("Add", wb, rb)
            xws, rts = [], []
            x2 = self.op("Reshape", b.input(0), self.c(_i64(-1, n_in)))  # one 2-d GEMM, not seq
            for s, e in groups:
                xw = self.op("MatMul", x2, self.cols(wt, s, e))
                xw = xw if bias is None else self.op("Add", xw, self.cols(bias, s, e))
                xw = self.op("Reshape", xw, self.c(_i64(*x_shape[:2], e - s)))
                remapped = reverse and self.lens is not None
                xws.append(self.remap(xw, (*self.b.value(xw).shape[:2], 1)) if remapped else xw)
                rts.append(self.cols(rt, s, e))
            h, cell = self.state0(5, d), self.state0(6, d)
            peep = None
            if self.kind == "LSTM" and b.input(7) is not None:
                pd = self.op("Gather", b.input(7), self.c(d, np.int64), axis=0)
                peep = [self.cols(pd, k * hid, (k + 1) * hid) for k in range(3)]
            steps = range(self.seq)
            order = reversed(steps) if reverse and self.lens is None else steps
            y = [None] * self.seq
            for t in order:
                m = self.mask(t)
                if m is False:
                    y[t] = self.c(np.zeros((self.batch, hid)), self.dt)
                    continue
                xts = [self.op("Gather", xw, self.c(t, np.int64), axis=self.layout) for xw in xws]
                if self.kind == "LSTM":
                    h2, c2 = self.lstm(d, xts[0], rts[0], h, cell, peep)
                elif self.kind == "GRU":
                    h2, c2 = self.gru(d, xts, rts, h, rbh), None
                else:
                    pre = self.op("Add", self.op("MatMul", h, rts[0]), xts[0])
                    h2, c2 = self.act(self.acts[d][0], pre), None
                if m is None:
                    h, cell, y[t] = h2, c2, h2
                else:
                    y[t] = self.op("Where", m, h2, self.c(0.0))
                    h = self.op("Where", m, h2, h)
                    cell = None if c2 is None else self.op("Where", m, c2, cell)
            if b.output(0):
                axes = self.c(_i64(0, 1) if self.layout == 0 else _i64(1, 2))
                pieces = [self.op("Unsqueeze", yt, axes) for yt in y]
                yd = self.op("Concat", *pieces, axis=self.layout) if self.seq > 1 else pieces[0]
                if reverse and self.lens is not None:
                    shape = b.value(yd).shape
                    idx = (shape[0], 1, shape[2], 1) if self.layout == 0 else (*shape[:2], 1, 1)
                    yd = self.remap(yd, idx)
                ys.append(yd)
            hs.append(self.nonempty(h))
            cs.append(self.nonempty(cell))
        self.write(0, ys, self.layout + 1)
        self.write(1, hs, self.layout, unsqueeze=True)
        if self.kind == "LSTM":
            self.write(2, cs, self.layout, unsqueeze=True)

    def write(self, k: int, parts: list, axis: int, unsqueeze: bool = False) -> None:
        out = self.b.output(k)
        if not out:
            return
        if unsqueeze:
            parts = [self.op("Unsqueeze", p, self.c(_i64(axis))) for p in parts]
        if len(parts) == 1:
            self.b.op("Identity", parts, outputs=[out])
        else:
            self.b.op("Concat", parts, outputs=[out], axis=axis)

    def lstm(self, d, xt, rt, h, cell, peep):
        f, g, hact = self.acts[d]
        hid = self.hidden
        gates = self.op("Add", self.op("MatMul", h, rt), xt)
        zi, zo, zf, zc = self.b.op(
            "Split", [gates, self.c(_i64(hid, hid, hid, hid))], n_outputs=4, axis=1
        )
        if peep is not None:
            zi = self.op("Add", zi, self.op("Mul", peep[0], cell))
            zf = self.op("Add", zf, self.op("Mul", peep[2], cell))
        i = self.act(f, zi)
        if int(self.b.attrs.get("input_forget", 0)):
            fg = self.op("Sub", self.c(1.0), i)
        else:
            fg = self.act(f, zf)
        c2 = self.op("Add", self.op("Mul", fg, cell), self.op("Mul", i, self.act(g, zc)))
        if peep is not None:
            zo = self.op("Add", zo, self.op("Mul", peep[1], c2))
        h2 = self.op("Mul", self.act(f, zo), self.act(hact, c2, clip=False))
        return h2, c2

    def gru(self, d, xts, rts, h, rbh):
        f, g = self.acts[d]
        hid = self.hidden
        zr = self.op("Add", self.op("MatMul", h, rts[0]), xts[0])
        zp, rp = self.b.op("Split", [zr, self.c(_i64(hid, hid))], n_outputs=2, axis=1)
        z, r = self.act(f, zp), self.act(f, rp)
        if not self.lbr:  # (r * h) Rh
            pre = self.op("Add", self.op("MatMul", self.op("Mul", r, h), rts[1]), xts[1])
        else:  # r * (h Rh + Rbh)
            hr = self.op("MatMul", h, rts[1])
            hr = hr if rbh is None else self.op("Add", hr, rbh)
            pre = self.op("Add", xts[1], self.op("Mul", r, hr))
        cand = self.act(g, pre)
        return self.op("Add", cand, self.op("Mul", z, self.op("Sub", h, cand)))


def _onnx_weights(b: Builder):
    def weights(d: int) -> tuple[str, str]:
        idx = b.const(np.asarray(d, np.int64))
        w, r = (b.op("Gather", [b.input(k), idx], axis=0) for k in (1, 2))
        return b.op("Transpose", [w], perm=[1, 0]), b.op("Transpose", [r], perm=[1, 0])

    return weights


@expands("RNN", "GRU", "LSTM")
def _recurrent(b: Builder) -> None:
    _Rnn(b, b.op_type).run(_onnx_weights(b))


@expands("DynamicQuantizeLSTM", domain="com.microsoft")
def _dynamic_quantize_lstm(b: Builder) -> None:
    """int8/uint8 W [dirs, input, 4H] and R [dirs, H, 4H] with per-direction or per-column
    scales and zero points, dequantized here; then the float LSTM."""
    deq = []
    for k, s, z in ((1, 8, 9), (2, 10, 11)):
        vals = [None if b.input(j) is None else b.value(b.input(j)).const for j in (k, s, z)]
        if any(v is None for v in vals):
            b.fail(f"input {k}, its scale and zero point must be constant initializers")
        q, scale, zp = vals
        scale = np.asarray(scale, np.float32).reshape(q.shape[0], 1, -1)
        zp = np.asarray(zp, np.int32).reshape(q.shape[0], 1, -1)
        deq.append(((q.astype(np.int32) - zp) * scale).astype(np.float32))
    dv = b.value(b.input(0)).dtype
    weights = lambda d: (b.const(deq[0][d].astype(dv)), b.const(deq[1][d].astype(dv)))
    _Rnn(b, "LSTM", transposed=True).run(weights)
