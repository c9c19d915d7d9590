"""The decoder runtime: ``TextGenerator`` runs an ONNX decoder (optimum's layout) on pyforge's
per-shape plans with a KV cache kept between calls.

The cache holds, per layer, key and value rows for the tokens already fed (the conversation).
Each step feeds that cache as ``past`` padded to a bucket (rows past the valid ones are masked
off by ``attention_mask``, as the decoder layout allows), so one plan serves every step of a
bucket; the new rows are copied out of ``present`` into the cache. A prompt is left-padded to
its prefill bucket with masked tokens, so a few plans serve every prompt length.

That is the concat layout (any optimum-style decoder): each step ``predict`` copies ``past``
into its plan's arena, the decoder's Concat writes ``present`` and the new rows are copied back.
A decoder compiled with ``state`` (present aliasing past: ``gemma3.build_decoder(...,
cache="static")``) keeps the cache in place instead: ``max_context`` rows in the model's state
buffer, the new rows scattered at their positions by the decoder itself, nothing fed or copied
per step, one plan (one captured CUDA graph) for every decode step.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import errors
from .sampling import Sampling

# measured (benchmarks/generate_peers.py --buckets, Gemma 3 270M, cpu, a loaded 2-core host):
# decode 100 + 64 tokens with past padded to multiples of 16 / 64 / 256: 109 / 83 / 88 ms per
# token warm, 7 / 4 / 3 plans (first run 209 / 58 / 32 s); a 100-token prompt exact 632 ms,
# padded to 128 736 ms, but each new exact length compiles a plan (~10 s)
DECODE_BUCKET = 64  # past rows fed per decode plan: a multiple of this
# from_config on the cpu keeps the cache in place up to this many rows, else the concat layout
# (cuda: always in place). Measured (BENCHMARKS.md, KV cache in place), tiny config, 32 tokens:
# max_context 224: static 6.6 / 8.0 ms per token at 5 / 128 of context, concat 6.8 / 8.8; at
# 2048 static 22.1 / 42.7 (attention over every row), concat 11.5 / 17.0
CPU_STATIC_ROWS = 256
PREFILL_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048)  # prompt lengths padded up to these
_PAST = re.compile(r"past_key_values\.(\d+)\.(key|value)")


@dataclass
class Generation:
    """What ``generate`` returns: the new token ids and their text, why it stopped (``"eos"``,
    ``"stop"``, ``"length"``, ``"max_context"``) and its timings."""

    tokens: list[int] = field(default_factory=list)
    text: str = ""
    stop_reason: str = "length"
    prompt_tokens: int = 0
    reused_tokens: int = 0  # prompt tokens whose cache rows were kept from the last call
    prefill_ms: float = 0.0  # the prompt's new suffix, up to the first token's logits
    decode_ms: list[float] = field(default_factory=list)  # one per later token

    @property
    def decode_ms_per_token(self) -> float:
        return float(np.mean(self.decode_ms)) if self.decode_ms else float("nan")


@dataclass(frozen=True)
class _Layout:
    """What the runtime reads from the decoder's inputs."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype: np.dtype
    inputs: tuple[str, ...]
    static: int = 0  # a static cache's rows (its past is the model's state), else 0


def _layout(model) -> _Layout:
    from .. import TensorSpec

    specs = {s.name: s for s in model.inputs}
    state = set(getattr(model, "state", {}).values())
    for name in state:  # a static cache: kept in the model, never fed
        slot = model.plan.slots[name]
        specs[name] = TensorSpec(name, slot.shape, np.dtype(slot.dtype))
    found = {(int(m[1]), m[2]) for m in map(_PAST.fullmatch, specs) if m}
    layers = len({i for i, _ in found})
    missing = [n for n in ("input_ids", "attention_mask") if n not in specs]
    if not layers or missing or found != {(i, k) for i in range(layers) for k in ("key", "value")}:
        raise errors.ModelLoadError(
            f"not a decoder in the past_key_values layout: inputs {sorted(specs)} (needs "
            "input_ids, attention_mask and past_key_values.{i}.key/value for i = 0..layers-1)"
        )
    shape = specs["past_key_values.0.key"].shape
    if len(shape) != 4 or not all(isinstance(d, int) for d in shape[1::2]):
        raise errors.ModelLoadError(
            f"past_key_values.0.key has shape {shape}: (batch, kv_heads, past, head_dim) with "
            "kv_heads and head_dim fixed is needed"
        )
    dtype = np.dtype(specs["past_key_values.0.key"].dtype)
    static = shape[2] if state else 0
    if state and (state != {n for n in specs if _PAST.fullmatch(n)} or "position_ids" not in specs):
        raise errors.ModelLoadError("a static cache needs every past as state and position_ids")
    return _Layout(layers, shape[1], shape[3], dtype, tuple(specs), static)


class _Cache:
    """Per layer key and value rows, preallocated to ``max_context``. The rows of one head lie
    together with ``stride`` rows between heads, so the fed ``past`` (all ``stride`` rows) is one
    dense array; growing the stride moves rows into a second buffer (none when kv_heads is 1).

    On cuda the buffers are device memory: ``past`` is fed as device arrays (predict copies
    them device to device into its plan) and the new rows of ``present`` are copied back device
    to device; nothing crosses to the host but the ids, the mask and the last logits."""

    def __init__(self, lay: _Layout, max_context: int, device: bool):
        self.lay, self.device = lay, device
        self.raw = device and os.environ.get("NUMBA_ENABLE_CUDASIM") != "1"  # raw pointers
        zeros = np.zeros(lay.kv_heads * max_context * lay.head_dim, lay.dtype)
        if device:  # zeroed: a masked row still meets a weight of 0, and 0 * NaN is NaN
            from numba import cuda

            alloc = lambda: cuda.to_device(zeros)
        else:
            alloc = zeros.copy
        self.bufs = [
            [alloc() for _ in range(1 + (lay.kv_heads > 1))] for _ in range(2 * lay.layers)
        ]
        self.stride, self._views = 0, None
        self.tokens: list[int] = []  # the ids whose rows are held, in order

    def past(self) -> dict[str, Any]:
        if self._views is None:  # made once per layout: a device array costs ~10 us to make
            shape = (1, self.lay.kv_heads, self.stride, self.lay.head_dim)
            size = int(np.prod(shape))
            view = _DeviceView if self.raw else lambda b: b[:size].reshape(shape)
            self._views = {
                _name("past_key_values", i): view(b[0], shape, self.lay.dtype)
                if self.raw
                else view(b[0])
                for i, b in enumerate(self.bufs)
            }
        return self._views

    def append(self, outs: dict[str, Any], first: int, ids: Sequence[int], stride: int) -> None:
        """Rows ``first..first+len(ids)`` of each ``present`` become the rows after the held
        ones; the layout moves to ``stride`` first if it grows."""
        held, hd, kv = len(self.tokens), self.lay.head_dim, self.lay.kv_heads
        for i, pair in enumerate(self.bufs):
            present = outs[_name("present", i)]
            if stride != self.stride and kv > 1:  # the held rows to the other buffer's layout
                for h in range(kv):
                    self._copy(pair[1], h * stride * hd, pair[0], h * self.stride * hd, held * hd)
                pair.reverse()
            rows = present.shape[2]
            for h in range(kv):
                dst, src = (h * stride + held) * hd, (h * rows + first) * hd
                self._copy(pair[0], dst, present, src, len(ids) * hd)
        if stride != self.stride:
            self.stride, self._views = stride, None
        self.tokens.extend(ids)

    def _copy(self, dst, at: int, src, frm: int, n: int) -> None:
        if n == 0:
            return
        if not self.device:
            dst[at : at + n] = src.reshape(-1)[frm : frm + n]
        elif isinstance(src, np.ndarray):  # predict gave host outputs (every past was empty)
            dst[at : at + n].copy_to_device(np.ascontiguousarray(src.reshape(-1)[frm : frm + n]))
        elif self.raw:
            from cuda.bindings import driver as drv

            size = self.lay.dtype.itemsize  # on the legacy stream: after predict's, before the next
            dptr = dst.device_ctypes_pointer.value + at * size
            sptr = src.device_ctypes_pointer.value + frm * size
            (err,) = drv.cuMemcpyDtoDAsync(dptr, sptr, n * size, 0)
            if err != drv.CUresult.CUDA_SUCCESS:
                raise RuntimeError(f"CUDA error copying the KV cache rows: {err}")
        else:
            dst[at : at + n].copy_to_device(src.reshape(-1)[frm : frm + n])


class _DeviceView:
    """A dense (1, kv_heads, stride, head_dim) window on a cache buffer, exporting the CUDA
    array interface as a plain attribute (a Numba array builds that dict anew per read)."""

    def __init__(self, buf, shape: tuple[int, ...], dtype: np.dtype):
        self.shape, self.dtype, self._buf = shape, dtype, buf
        ptr = buf.device_ctypes_pointer.value
        self.__cuda_array_interface__ = {"shape": shape, "typestr": dtype.str, "data": (ptr, False),
                                         "strides": None, "version": 3, "stream": None}  # fmt: skip


def _name(prefix: str, i: int) -> str:
    return f"{prefix}.{i // 2}.{'value' if i % 2 else 'key'}"


def _bucket(n: int, sizes: Sequence[int] | None, limit: int) -> int:
    if not sizes:
        return n
    return min(next((s for s in sizes if s >= n), n), max(limit, n))


class TextGenerator:
    """A decoder with its KV cache. The cache is kept between calls: a prompt whose first tokens
    equal the conversation so far (the last prompt and what was generated) prefills only the
    rest; ``reset()`` starts a fresh conversation.

    >>> gen = pyforge.TextGenerator.from_gguf("gemma-3-270m-q4_k_m.gguf", target="cpu")
    >>> r = gen.generate("The capital of France is", max_new_tokens=16)
    >>> r.text, r.prefill_ms, r.decode_ms_per_token
    >>> for tok in gen.stream([2, 651, 6037], max_new_tokens=8, do_sample=True, seed=0): ...
    >>> gen.reset()                                  # a new conversation: nothing reused
    """

    def __init__(
        self,
        model,
        tokenizer=None,
        *,
        max_context: int = 2048,
        eos_id: int | None = None,
        decode_bucket: int = DECODE_BUCKET,
        prefill_buckets: Sequence[int] | None = PREFILL_BUCKETS,
    ):
        if not isinstance(max_context, int) or max_context < 2:
            raise errors.OptionError("max_context", f"max_context={max_context!r}: an int >= 2")
        if not isinstance(decode_bucket, int) or decode_bucket < 1:
            raise errors.OptionError("decode_bucket", f"decode_bucket={decode_bucket!r}: int >= 1")
        self.model, self.tokenizer, self.max_context = model, tokenizer, max_context
        self.eos_id = eos_id if eos_id is not None else getattr(tokenizer, "eos_id", None)
        self.decode_bucket = decode_bucket
        self.prefill_buckets = tuple(sorted(prefill_buckets)) if prefill_buckets else None
        self.layout = lay = _layout(model)
        self.max_context = min(max_context, lay.static) if lay.static else max_context
        self._cache = _Held() if lay.static else _Cache(lay, max_context, model.target == "cuda")
        self.last: Generation | None = None
        # a decoder's own greedy pick (gemma3's next_token): greedy steps copy it, not the logits
        self._next = "next_token" in model.output_names
        self._want: tuple[str, ...] | None = None

    @classmethod
    def from_onnx(
        cls, decoder, tokenizer=None, target: str | None = None, max_context: int = 2048, **kw
    ) -> TextGenerator:
        """Any decoder in the layout (a path, bytes or ModelProto); ``tokenizer`` (encode,
        decode, eos_id) is needed for str prompts and ``.text`` only. Takes ``__init__``'s
        keywords (eos_id, decode_bucket, prefill_buckets); the rest go to ``pyforge.compile``
        (max_plans defaults to 64: one plan per decode bucket and prompt bucket used)."""
        import pyforge

        mine = {k: kw.pop(k) for k in ("eos_id", "decode_bucket", "prefill_buckets") if k in kw}
        model = pyforge.compile(decoder, target=target, **{"max_plans": 64, **kw})
        return cls(model, tokenizer, max_context=max_context, **mine)

    @classmethod
    def from_gguf(
        cls, path, target: str | None = None, max_context: int = 2048, precision: str = "fp32", **kw
    ) -> TextGenerator:
        """A Gemma 3 GGUF file: its weights as a decoder that returns the last position's
        logits only, and its own tokenizer; ``from_config``'s keywords."""
        from . import gguf, tokenizer

        config, weights, _ = gguf.read_gguf(os.fspath(path))
        tok = tokenizer.from_gguf(os.fspath(path))
        return cls.from_config(config, weights, tok, target, max_context, precision, **kw)

    @classmethod
    def from_config(
        cls, config, weights, tokenizer=None, target: str | None = None, max_context: int = 2048,
        precision: str = "fp32", cache: str | None = None, **kw
    ) -> TextGenerator:  # fmt: skip
        """A Gemma 3 decoder (``gemma3.Gemma3Config`` and its GGUF-named weights), the cache
        ``"static"`` (kept in place: the default on cuda, and on the cpu up to
        ``CPU_STATIC_ROWS`` of max_context) or ``"concat"``; the rest as ``from_onnx``.
        ``precision``: as ``gemma3.build_decoder`` (matrices stored so, computed in float32),
        but "fp16" on cuda compiles the float32 decoder with precision="fp16": its GEMMs read
        float16 weights and activations on cuBLASLt's fp16 tensor cores (float32 accumulate);
        the KV cache, norms, attention and the residual stream stay float32 (the logits come
        back float32, rounded to float16 by the vocabulary GEMM).

        >>> c = gemma3.Gemma3Config.tiny()
        >>> gen = TextGenerator.from_config(c, gemma3.random_weights(c), target="cpu")"""
        import pyforge

        from . import gemma3

        target = target or pyforge.default_target()
        static = target == "cuda" or max_context <= CPU_STATIC_ROWS
        cache = cache or ("static" if static else "concat")
        if cache == "static":
            kw["state"] = gemma3.state_map(config)
        if half := target == "cuda" and precision == "fp16":
            kw["precision"] = "fp16"
        proto = gemma3.build_decoder(
            config, weights, "fp32" if half else precision, "last", max_context, cache
        )
        return cls.from_onnx(proto, tokenizer, target=target, max_context=max_context, **kw)

    def reset(self) -> None:
        """Forget the conversation: the next call prefills its whole prompt (a static cache's
        rows stay as they were, masked off until overwritten)."""
        self._cache.tokens, self._cache.stride, self._cache._views = [], 0, None

    @property
    def conversation(self) -> list[int]:
        """The token ids whose cache rows are held (what a next prompt may continue)."""
        return list(self._cache.tokens)

    def generate(self, prompt: str | Sequence[int], max_new_tokens: int = 32, **kw) -> Generation:
        """Generate up to ``max_new_tokens`` after ``prompt`` (a str, tokenised with BOS, or a
        list of ids used as given). Keywords: do_sample, temperature, top_k, top_p, seed (see
        ``Sampling``) and stop (strings that end the text, cut before them). Stops at eos."""
        result = Generation()
        for _ in self._run(result, *self._check(prompt, max_new_tokens, **kw)):
            pass
        return result

    def stream(self, prompt: str | Sequence[int], max_new_tokens: int = 32, **kw) -> Iterator[int]:
        """``generate``'s tokens one by one as they come; the same keywords (checked at once).
        ``last`` is the ``Generation`` of the latest call (timings, stop_reason), filled as it runs."""
        return self._run(Generation(), *self._check(prompt, max_new_tokens, **kw))

    def _check(self, prompt, max_new_tokens, *, stop=None, **sampling):
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise errors.OptionError("max_new_tokens", f"max_new_tokens={max_new_tokens!r}: >= 1")
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        if not all(isinstance(s, str) and s for s in stops):
            raise errors.OptionError("stop", f"stop={stop!r}: a str or a list of non-empty strs")
        if stops and self.tokenizer is None:
            raise errors.OptionError("stop", "stop strings need a tokenizer")
        unknown = sorted(set(sampling) - {"do_sample", "temperature", "top_k", "top_p", "seed"})
        if unknown:
            raise errors.OptionError(unknown[0], f"generate takes no option {unknown[0]!r}")
        sampler = Sampling(**sampling)
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise errors.InputError("a str prompt needs a tokenizer: pass token ids instead")
            ids = list(self.tokenizer.encode(prompt, add_bos=True))
        elif isinstance(prompt, Sequence | np.ndarray) and all(
            isinstance(t, int | np.integer) and not isinstance(t, bool) for t in prompt
        ):
            ids = [int(t) for t in prompt]
        else:
            raise errors.InputError(
                f"prompt must be a str or a list of int ids, not {prompt!r:.80}"
            )
        if not ids or len(ids) > self.max_context:
            raise errors.InputError(
                f"the prompt has {len(ids)} tokens: 1 to max_context={self.max_context} fit "
                "(pass a larger max_context for a longer one)"
            )
        choose = None if self._next and not sampler.do_sample else sampler.chooser()
        return ids, max_new_tokens, choose, stops

    def _run(self, result: Generation, ids, max_new_tokens, choose, stops) -> Iterator[int]:
        self.last, result.prompt_tokens = result, len(ids)
        self._want = ("next_token",) if choose is None else None  # then a step returns the id
        t0 = time.perf_counter()
        logits = self._prefill(ids, result)
        ahead = _RunAhead(self) if choose is None and not stops and self.layout.static else None
        try:
            yield from self._steps(result, logits, max_new_tokens, choose, stops, t0, ahead)
        finally:
            if ahead is not None:
                ahead.close()

    def _steps(self, result, logits, max_new_tokens, choose, stops, t0, ahead) -> Iterator[int]:
        for step in range(max_new_tokens):
            token = choose(logits) if choose else logits
            if step == 0:
                result.prefill_ms = (time.perf_counter() - t0) * 1e3
            else:
                result.decode_ms.append((time.perf_counter() - t0) * 1e3)
            if token == self.eos_id:
                result.stop_reason = "eos"
                break
            result.tokens.append(token)
            if stops:
                text = self.tokenizer.decode(result.tokens)
                at = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
                if at >= 0:
                    result.text, result.stop_reason = text[:at], "stop"
                    yield token
                    return
            yield token
            if step == max_new_tokens - 1:
                break
            if len(self._cache.tokens) >= self.max_context:
                result.stop_reason = "max_context"
                break
            t0 = time.perf_counter()
            if ahead is not None:
                logits = ahead.step(token, max_new_tokens - 2 - step)
            else:
                logits = self._step([token], 1)
        if self.tokenizer is not None:
            result.text = self.tokenizer.decode(result.tokens)

    def _prefill(self, ids: list[int], result: Generation) -> np.ndarray:
        held = self._cache.tokens
        keep = next(
            (i for i, (a, b) in enumerate(zip(held, ids)) if a != b), min(len(held), len(ids))
        )
        keep = min(keep, len(ids) - 1)  # at least one token is fed: its logits come next
        del held[keep:]
        result.reused_tokens = keep
        new = ids[keep:]
        return self._step(new, _bucket(len(new), self.prefill_buckets, self.max_context - keep))

    def _step(self, ids: list[int], width: int) -> np.ndarray:
        """Feed ``ids`` after the held rows, left-padded to ``width`` with masked tokens; their
        rows join the cache; returns the last token's logits (its greedy id when ``_want``)."""
        cache, held, pad = self._cache, len(self._cache.tokens), width - len(ids)
        if self.layout.static:
            return self._static_step(ids, width)
        stride = cache.stride
        mask = np.zeros((1, stride + width), np.int64)
        mask[0, :held] = 1
        mask[0, stride + pad :] = 1
        # a pad token sits at the first new position: it attends the held rows or the first
        # new token, never nothing (an all-masked row could be NaN, and NaN times 0 is NaN)
        positions = np.full((1, width), held, np.int64)
        positions[0, pad:] = np.arange(held, held + len(ids))
        feeds = {"input_ids": np.array([[ids[0]] * pad + ids], np.int64), "attention_mask": mask}
        if "position_ids" in self.layout.inputs:
            feeds["position_ids"] = positions
        feeds.update(cache.past())
        outs = self.model.predict(feeds)
        grown = -(-(held + len(ids)) // self.decode_bucket) * self.decode_bucket
        cache.append(outs, stride + pad, ids, max(stride, min(grown, self.max_context)))
        if self._want:
            return int(np.asarray(outs["next_token"]).reshape(-1)[-1])
        logits = outs["logits"]
        logits = logits.copy_to_host() if hasattr(logits, "copy_to_host") else np.asarray(logits)
        return logits[0, -1]

    def _static_step(self, ids: list[int], width: int) -> np.ndarray:
        """Feed ``ids`` at the rows after the held ones, left-padded to ``width`` with tokens
        placed at the rows after them (masked off; later tokens overwrite them)."""
        held, n = len(self._cache.tokens), len(ids)
        mask = np.zeros((1, self.layout.static), np.int64)
        mask[0, : held + n] = 1
        pos = np.concatenate([np.arange(held + n, held + width), np.arange(held, held + n)])
        feeds = {"input_ids": np.array([[ids[0]] * (width - n) + ids], np.int64),
                 "attention_mask": mask, "position_ids": pos[None]}  # fmt: skip
        outs = self.model.predict(feeds, outputs=self._want)
        self._cache.tokens.extend(ids)
        if self._want:
            return int(np.asarray(outs["next_token"]).reshape(-1)[-1])
        logits = outs["logits"]
        logits = logits.copy_to_host() if hasattr(logits, "copy_to_host") else np.asarray(logits)
        return logits[0, -1]


class _RunAhead:
    """Greedy decode with a static cache on cuda, one step queued ahead: each step's inputs are
    copied on the device (its id from the last step's next_token, its mask and position from
    tables), so step k+1 is on the stream before step k's id reaches the host, and the device
    never waits for the host. The first step runs as usual (it binds the decode plan); without
    a captured graph (the simulator) every step does. A queued step whose id is never taken
    (the generation stopped) wrote a row past the held ones: masked off, overwritten later."""

    def __init__(self, gen: TextGenerator):
        self.gen, self.ctx, self.queued = gen, None, None
        self.slots, self.k = None, 0

    def step(self, token: int, more: int) -> int:
        """Feed ``token`` (queued already, unless this is the first call) and return the next id;
        ``more``: how many calls may follow (a step is queued only when one may)."""
        gen, held = self.gen, self.gen._cache.tokens
        if self.ctx is None:
            nxt = gen._static_step([token], 1)
            ctx = getattr(gen.model.runtime, "first", None)
            if not getattr(ctx, "use_graph", False):
                self.ctx = False
                return nxt
            self._bind(ctx)
            self._queue(more)
            return nxt
        if self.ctx is False or self.queued is None:
            return gen._static_step([token], 1)
        queued, self.queued = self.queued, None
        held.append(token)  # the queued step fed it: its row now counts
        self._queue(more)
        queued[1].synchronize()
        return int(queued[0][0])

    def _bind(self, ctx) -> None:
        from numba import cuda

        from ..exec.cuda.gemm import pointer

        S = self.gen.layout.static
        self.ctx, self.tok = ctx, pointer(ctx.views["next_token"])
        ones = np.concatenate([np.ones(S, np.int64), np.zeros(S, np.int64)])
        self.tables = cuda.to_device(ones), cuda.to_device(np.arange(S, dtype=np.int64))
        self.mask, self.pos = (pointer(t) for t in self.tables)
        self.slots = [(cuda.pinned_array(1, np.int64), cuda.event(timing=False)) for _ in "ab"]

    def _queue(self, more: int) -> None:
        from cuda.bindings import driver as drv

        row, S = len(self.gen._cache.tokens), self.gen.layout.static
        if more <= 0 or row >= self.gen.max_context:
            return
        # mask row r: its first r + 1 entries 1, a window of [1] * S + [0] * S
        self.ctx.enqueue({"input_ids": self.tok, "attention_mask": self.mask + 8 * (S - row - 1),
                          "position_ids": self.pos + 8 * row})  # fmt: skip
        host, done = self.slots[self.k]
        self.k ^= 1
        drv.cuMemcpyDtoHAsync(host.ctypes.data, self.tok, 8, self.ctx._handle)
        done.record(stream=self.ctx.stream)
        self.queued = host, done

    def close(self) -> None:
        if self.ctx:
            self.ctx.finish()


class _Held:
    """A static cache's host side: the ids whose rows the model's state holds."""

    def __init__(self):
        self.tokens: list[int] = []
        self.stride, self._views = 0, None
