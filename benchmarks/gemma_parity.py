"""Gemma 3 270M from its GGUF: pyforge (cpu) and ORT on the exported decoder, greedy, side by side.

    python benchmarks/gemma_parity.py [--gguf PATH] [--tokens 16] [--past 64]

pyforge runs two plans: the prefill, and one decode step whose past is padded to a fixed
``--past`` rows (unused rows masked, as the decoder contract allows), so every step reuses it;
ORT runs the same file with an unpadded past that grows by one row per step. Prints each step's
logits difference (relative to the largest logit), whether the greedy tokens agree, and times.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

import pyforge
from pyforge.generate.gemma3 import build_decoder
from pyforge.generate.gguf import read_gguf
from pyforge.generate.tokenizer import Tokenizer

GGUF = Path.home() / ".cache" / "pyforge-gguf" / "gemma-3-270m-q4_k_m.gguf"


def feeds(config, ids, pos, mask, past):
    f = {
        "input_ids": np.asarray([ids], np.int64),
        "position_ids": np.arange(pos, pos + len(ids), dtype=np.int64)[None],
        "attention_mask": np.asarray([mask], np.int64),
    }
    for i in range(config.layers):
        f[f"past_key_values.{i}.key"], f[f"past_key_values.{i}.value"] = past[i]
    return f


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", type=Path, default=GGUF)
    ap.add_argument("--prompt", default="The capital of France is")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--past", type=int, default=64, help="rows of the padded past pyforge gets")
    args = ap.parse_args()

    t0 = time.perf_counter()
    config, weights, vocab = read_gguf(args.gguf)
    tok = Tokenizer(vocab)
    model = build_decoder(config, weights, logits="last")
    del weights
    t1 = time.perf_counter()
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    compiled = pyforge.compile(model, target="cpu")
    print(
        f"read + build {t1 - t0:.1f} s, ORT session + pyforge compile {time.perf_counter() - t1:.1f} s"
    )

    ids = tok.encode(args.prompt)
    n, kv, hd = len(ids), config.kv_heads, config.head_dim
    assert n + args.tokens <= args.past, "--past must hold the prompt and the new tokens"
    empty = [(np.zeros((1, kv, 0, hd), np.float32),) * 2] * config.layers
    # pyforge's cache: args.past rows, the rows after the valid ones filled with junk
    cache = np.random.default_rng(0).standard_normal((config.layers, 2, 1, kv, args.past, hd))
    cache = cache.astype(np.float32)
    ort_past, ort_ms, pf_ms, worst, agree = empty, [], [], 0.0, True
    step_ids, length, gen = ids, 0, []
    for step in range(args.tokens + 1):
        mask_ort = [1] * (length + len(step_ids))
        t = time.perf_counter()
        ref = dict(zip(names, sess.run(None, feeds(config, step_ids, length, mask_ort, ort_past))))
        ort_ms.append((time.perf_counter() - t) * 1e3)
        if step == 0:  # prefill: the same feeds for both
            pf_feeds = feeds(config, step_ids, 0, mask_ort, empty)
        else:
            mask = [1] * length + [0] * (args.past - length) + [1]
            pf_feeds = feeds(config, step_ids, length, mask, [tuple(c) for c in cache])
        t = time.perf_counter()
        got = compiled.predict(pf_feeds)
        pf_ms.append((time.perf_counter() - t) * 1e3)
        new_rows = slice(0 if step == 0 else args.past, None)
        for i in range(config.layers):
            for j, kind in enumerate(("key", "value")):
                rows = got[f"present.{i}.{kind}"][:, :, new_rows]
                cache[i, j, :, :, length : length + rows.shape[2]] = rows
        a, b = got["logits"][0, -1], ref["logits"][0, -1]
        worst = max(worst, float(np.abs(a - b).max() / np.abs(b).max()))
        agree &= int(a.argmax()) == int(b.argmax())
        length += len(step_ids)
        step_ids = [int(b.argmax())]
        gen += step_ids
        ort_past = [
            (ref[f"present.{i}.key"], ref[f"present.{i}.value"]) for i in range(config.layers)
        ]
    print(f"prompt {args.prompt!r} ({n} tokens) -> {tok.decode(gen)!r}")
    print(
        f"max |pyforge - ORT| / max|ORT| over {args.tokens + 1} steps: {worst:.2e}; greedy agree: {agree}"
    )
    print(f"prefill ms: pyforge {pf_ms[0]:.1f} (first call, JIT-warm), ORT {ort_ms[0]:.1f}")
    print(
        f"decode ms/token (median, steps 2..): pyforge {np.median(pf_ms[2:]):.1f}, ORT {np.median(ort_ms[2:]):.1f}"
    )
    print(
        f"pyforge weights bytes {compiled.stats['weights_bytes']:,}, plans {len(compiled.stats['plans'])}"
    )


if __name__ == "__main__":
    main()
