"""Gemma 3 270M text generation on this machine's cpu: pyforge beside its peers on the same
weights (the GGUF file's, dequantized to fp32 by transformers), greedy, batch 1.

    /work/venv-corpus/bin/python benchmarks/generate_peers.py [--quick] [--gguf PATH]
    /work/venv-corpus/bin/python benchmarks/generate_peers.py --buckets   # bucket sizes, measured

Peers: pyforge (cpu), ONNX Runtime on the same exported decoder (past grown by one row a step,
as optimum runs it), HF transformers eager and with a static cache + torch.compile, and
llama.cpp through llama-cpp-python on the Q4 file itself when a python with it is given
(--llama-python; it did not build here within 15 minutes). Prompt lengths 5, 128, 1024;
128 new tokens (--quick: 5 and 128, 32). Runs in a python with torch, transformers and gguf
beside pyforge's own dependencies. The table is printed last.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from generate_gpu import (
    Table,
    gguf_weights,
    measure_hf,
    measure_hf_eager_loop,
    measure_pyforge,
    prompt,
)

GGUF = os.path.expanduser("~/.cache/pyforge-gguf/gemma-3-270m-q4_k_m.gguf")


def gemma_config(hf):
    """pyforge's Gemma3Config from a transformers Gemma 3 config."""
    from pyforge.generate.gemma3 import Gemma3Config

    kinds = hf.layer_types
    full = [i for i, k in enumerate(kinds) if k == "full_attention"]
    rope = hf.rope_parameters
    return Gemma3Config(
        hidden=hf.hidden_size, layers=hf.num_hidden_layers, heads=hf.num_attention_heads,
        kv_heads=hf.num_key_value_heads, head_dim=hf.head_dim, ffn=hf.intermediate_size,
        vocab=hf.vocab_size, eps=hf.rms_norm_eps, window=hf.sliding_window,
        sliding_pattern=full[0] + 1 if full else hf.num_hidden_layers + 1,
        rope_global=rope["full_attention"]["rope_theta"],
        rope_local=rope["sliding_attention"]["rope_theta"],
        query_pre_attn_scalar=float(hf.query_pre_attn_scalar),
        context=hf.max_position_embeddings,
    )  # fmt: skip


def stored_config(kept, folder: str, name: str):
    """The Gemma3Config saved with the weights; else the GGUF's through transformers."""
    from pyforge.generate.gemma3 import Gemma3Config

    if kept is not None:
        return Gemma3Config(**json.loads(str(kept)))
    try:
        import transformers
    except ImportError:  # pyforge's python: Gemma3Config's defaults are Gemma 3 270M's
        return Gemma3Config()
    return gemma_config(transformers.AutoConfig.from_pretrained(folder, gguf_file=name))


def measure_ort(sess, ids: list[int], new: int):
    """ORT with the past exactly as long as the tokens fed: present becomes the next past."""
    names = [o.name for o in sess.get_outputs()]
    specs = [i for i in sess.get_inputs() if i.name.startswith("past_key_values")]

    def run():
        past = {i.name: np.zeros((1, i.shape[1], 0, i.shape[3]), np.float32) for i in specs}
        feed, held, tokens, times = list(ids), 0, [], []
        for _ in range(new):
            t0 = time.perf_counter()
            out = dict(zip(names, sess.run(None, {
                "input_ids": np.array([feed], np.int64),
                "attention_mask": np.ones((1, held + len(feed)), np.int64),
                "position_ids": np.arange(held, held + len(feed))[None], **past})))  # fmt: skip
            tokens.append(int(np.argmax(out["logits"][0, -1])))
            times.append((time.perf_counter() - t0) * 1e3)
            held += len(feed)
            past = {k: out[k.replace("past_key_values", "present")] for k in past}
            feed = [tokens[-1]]
        return times[0], float(np.mean(times[1:])), tokens

    run()
    return run()


LLAMA = """
import json, sys, time
import numpy as np
from llama_cpp import Llama
path, ids, new, threads = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
llm = Llama(model_path=path, n_ctx=2048, n_threads=threads, verbose=False)
def run():
    llm.reset()
    t0 = time.perf_counter(); llm.eval(ids); tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    t1 = time.perf_counter(); tokens = [tok]
    for _ in range(new - 1):
        llm.eval([tok]); tok = int(np.argmax(llm.scores[llm.n_tokens - 1])); tokens.append(tok)
    t2 = time.perf_counter()
    return (t1 - t0) * 1e3, (t2 - t1) * 1e3 / (new - 1), tokens
run()
print(json.dumps(run()))
"""


def measure_llama(python: str, path: str, ids: list[int], new: int):
    import json

    args = [python, "-c", LLAMA, path, json.dumps(ids), str(new), str(len(os.sched_getaffinity(0)))]
    out = subprocess.run(args, capture_output=True, text=True, timeout=600, check=True)
    return tuple(json.loads(out.stdout.strip().splitlines()[-1]))


def buckets(config, weights, budget_end: float) -> None:
    """Decode bucket and prefill padding, measured: decode ms/token over the same 64 tokens with
    past padded to multiples of 16, 64 and 256 (plans warm), and a 100-token prompt prefilled
    exactly against padded to 128 (first call, which compiles a plan, and warm)."""
    import pyforge
    from pyforge.generate import gemma3

    proto = gemma3.build_decoder(config, weights, logits="last", max_context=1024)
    ids = prompt(100, config.vocab)
    for bucket in (16, 64, 256):
        if time.monotonic() > budget_end:
            break
        gen = pyforge.TextGenerator.from_onnx(
            proto, target="cpu", max_context=1024, decode_bucket=bucket
        )
        t0 = time.perf_counter()
        gen.generate(ids, max_new_tokens=64)
        first = time.perf_counter() - t0
        gen.reset()
        r = gen.generate(ids, max_new_tokens=64)
        plans = len(gen.model.stats["plans"])
        print(f"decode bucket {bucket:3d}: {r.decode_ms_per_token:.2f} ms/token warm; first run "
              f"{first:.1f} s ({plans} plans)", flush=True)  # fmt: skip
    for label, sizes in (("exact", None), ("padded to 128", (128,))):
        if time.monotonic() > budget_end:
            break
        gen = pyforge.TextGenerator.from_onnx(
            proto, target="cpu", max_context=1024, prefill_buckets=sizes
        )
        t0 = time.perf_counter()
        gen.generate(ids, max_new_tokens=1)
        first = (time.perf_counter() - t0) * 1e3
        warm = []
        for _ in range(3):
            gen.reset()
            warm.append(gen.generate(ids, max_new_tokens=1).prefill_ms)
        print(
            f"prefill 100 tokens {label}: first {first:.0f} ms, warm {min(warm):.1f} ms", flush=True
        )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", default=GGUF, help=f"the GGUF file (default {GGUF})")
    ap.add_argument("--quick", action="store_true", help="prompts 5 and 128, 32 new tokens")
    ap.add_argument("--budget", type=float, default=3600, help="seconds for every peer together")
    ap.add_argument("--skip", default="", help="comma-separated: pyforge,ort,eager,compile,llama")
    ap.add_argument("--llama-python", default=os.environ.get("LLAMA_PYTHON", ""),
                    help="a python with llama-cpp-python (default: $LLAMA_PYTHON; none: skipped)")  # fmt: skip
    ap.add_argument("--weights", default="", metavar="NPZ",
                    help="keep the dequantized fp32 weights here and read them on later runs")  # fmt: skip
    ap.add_argument("--buckets", action="store_true", help="measure the bucket choices only")
    args = ap.parse_args(argv)
    deadline = time.monotonic() + args.budget
    t0 = time.monotonic()
    folder, name = os.path.split(os.path.abspath(args.gguf))
    hf = None
    if args.weights and os.path.exists(args.weights):  # the fp32 weights of an earlier run
        weights = dict(np.load(args.weights))
        config = stored_config(weights.pop("__config__", None), folder, name)
    else:
        import torch
        import transformers

        hf = transformers.AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=name, dtype=torch.float32
        ).eval()
        config, weights = gemma_config(hf.config), gguf_weights(hf)
        if args.weights:
            kept = np.array(json.dumps(dataclasses.asdict(config)))
            np.savez(args.weights, __config__=kept, **weights)
    print(f"{name}'s weights as fp32 in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    if args.buckets:
        buckets(config, weights, deadline)
        return 0
    import onnxruntime as ort

    import pyforge
    from pyforge.generate import gemma3

    lengths, new = ((5, 128), 32) if args.quick else ((5, 128, 1024), 128)
    ctx = max(lengths) + new + 64
    skip = set(args.skip.split(","))
    table = Table(lengths, new, deadline)
    proto = gemma3.build_decoder(config, weights, logits="last", max_context=ctx)
    if "pyforge" not in skip:
        gen = pyforge.TextGenerator.from_onnx(proto, target="cpu", max_context=ctx)
        table.run("pyforge cpu fp32", lambda n: measure_pyforge(gen, prompt(n, config.vocab), new))
        gen = None
    if "ort" not in skip:
        sess = ort.InferenceSession(proto.SerializeToString())
        table.run(
            "ONNX Runtime cpu (same decoder)",
            lambda n: measure_ort(sess, prompt(n, config.vocab), new),
        )
        sess = None
    proto = None
    if hf is None and not {"eager", "compile"} <= skip:
        from generate_gpu import hf_model

        hf = hf_model(config, weights, "cpu")
    if "eager" not in skip:
        table.run(
            "HF eager (forward loop)",
            lambda n: measure_hf_eager_loop(hf, prompt(n, config.vocab), new, "cpu"),
        )
        table.run(
            "HF eager generate()", lambda n: measure_hf(hf, prompt(n, config.vocab), new, "cpu")
        )
    if "compile" not in skip:
        table.run("HF static cache + torch.compile",
                  lambda n: measure_hf(hf, prompt(n, config.vocab), new, "cpu", static=True), need_s=120)  # fmt: skip
    if "llama" not in skip and args.llama_python:
        table.run("llama.cpp (Q4_K_M file)",
                  lambda n: measure_llama(args.llama_python, args.gguf, prompt(n, config.vocab), new))  # fmt: skip
    elif "llama" not in skip:
        table.rows.append(
            ("llama.cpp", ["not run: llama-cpp-python did not build here"] * len(lengths))
        )
    from importlib import metadata

    def version(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "absent"

    cores = len(os.sched_getaffinity(0))
    table.print(f"Gemma 3 270M ({name}, dequantized to fp32), batch 1, greedy, {new} new tokens; "
                f"cpu, {cores} cores; torch {version('torch')}, transformers "
                f"{version('transformers')}, onnxruntime {ort.__version__}; "
                f"{time.strftime('%Y-%m-%d %H:%M')}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
