"""Gemma 3 270M text generation on this machine's cpu: pyforge beside its peers on the same
weights (the GGUF file's, dequantized to fp32 by pyforge's reader), greedy, batch 1.

    python benchmarks/generate_peers.py [--lengths 5,100,128] [--new 64] [--rounds 3]
    python benchmarks/generate_peers.py --buckets         # bucket sizes, measured

Peers, each on --threads (2) threads: pyforge cpu fp32; ONNX Runtime on the same exported
decoder (past grown by one row a step, as optimum runs it); HF transformers eager (a forward
loop, torch from --torch-python, default /work/venv-corpus's, in its own process: torch's
OpenMP beside pyforge's OpenBLAS in one process slows pyforge ~10x); llama.cpp on the Q4_K_M
file itself and on an F32 copy of it (written once with every tensor dequantized), through
node-llama-cpp's prebuilt binaries (``benchmarks/llama_node.mjs``; --llama-node DIR holds
``npm i -E node-llama-cpp@3.21.1``; llama-cpp-python did not build here). HF static cache +
torch.compile with ``--peers ...,hf-compile``.

Every peer runs each prompt once untimed first (pyforge compiles its plans there: compile is
excluded from the figures and its time printed apart), then --rounds rounds alternate the peers
call by call; the table gives medians of prefill ms and decode ms/token (the mean of the later
tokens of one call) and how many greedy tokens equal pyforge's. All peers read the prompt as
the same token ids (llama.cpp reads the file's own vocabulary, as pyforge's tokenizer does).
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from generate_gpu import hf_model, measure_hf, prompt

GGUF = os.path.expanduser("~/.cache/pyforge-gguf/gemma-3-270m-q4_k_m.gguf")
HERE = os.path.dirname(os.path.abspath(__file__))


def read_weights(path: str):
    from pyforge.generate.gguf import read_gguf

    config, weights, _ = read_gguf(path)
    return config, weights


def f32_gguf(src: str, dst: str) -> None:
    """``src`` with every tensor dequantized to F32; the metadata bytes are copied as they are
    (their types kept), but general.file_type, set to 0 (all F32)."""
    from pyforge.generate.gguf import GGUFFile

    f = GGUFFile(src)
    infos = sum(8 + len(n.encode()) + 4 + 8 * len(d) + 12 for n, (d, _, _) in f.tensors.items())
    head = bytearray(f.mm[: f.pos - infos])
    key = b"general.file_type"
    at = head.find(struct.pack("<Q", len(key)) + key) + 8 + len(key)
    if struct.unpack_from("<I", head, at)[0] == 4:  # uint32
        struct.pack_into("<I", head, at + 4, 0)
    align = int(f.fields.get("general.alignment", 32))
    table, offset = bytearray(), 0
    for name, (dims, _, _) in f.tensors.items():
        table += struct.pack("<Q", len(name.encode())) + name.encode()
        table += struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, 0, offset)
        offset += -(-int(np.prod(dims)) * 4 // align) * align
    with open(dst + ".part", "wb") as out:
        out.write(head + table)
        out.write(b"\0" * (-out.tell() % align))
        for name in f.tensors:
            data = np.ascontiguousarray(f.tensor(name), np.float32).tobytes()
            out.write(data + b"\0" * (-len(data) % align))
    os.replace(dst + ".part", dst)


def pyforge_run(gen, ids: list[int], new: int):
    gen.reset()
    r = gen.generate(ids, max_new_tokens=new)
    return r.prefill_ms, r.decode_ms_per_token, r.tokens


def ort_run(sess, ids: list[int], new: int):
    """ORT with the past exactly as long as the tokens fed: present becomes the next past."""
    names = [o.name for o in sess.get_outputs()]
    specs = [i for i in sess.get_inputs() if i.name.startswith("past_key_values")]
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


def hf_run(model, ids: list[int], new: int):
    """transformers' eager forward loop (no generate() overhead): prefill, then a token a call."""
    import torch

    with torch.no_grad():
        t0 = time.perf_counter()
        out = model(torch.tensor([ids]), use_cache=True)
        tok = int(out.logits[0, -1].argmax())
        t1 = time.perf_counter()
        tokens = [tok]
        for _ in range(new - 1):
            out = model(torch.tensor([[tok]]), past_key_values=out.past_key_values, use_cache=True)
            tok = int(out.logits[0, -1].argmax())
            tokens.append(tok)
        t2 = time.perf_counter()
    return (t1 - t0) * 1e3, (t2 - t1) * 1e3 / (new - 1), tokens


def hf_worker(args) -> int:
    """The HF peer in torch's python: one JSON line in ({"ids", "new", "mode"}), one out."""
    import torch
    import transformers

    torch.set_num_threads(args.threads)
    config, weights = read_weights(args.gguf)
    model = hf_model(config, weights, "cpu")
    del weights
    ready = f"torch {torch.__version__}, transformers {transformers.__version__}"
    print(json.dumps({"ready": ready}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        if req.get("mode") == "compile":  # measure_hf warms up (compiles) inside each call
            out = measure_hf(model, req["ids"], req["new"], "cpu", static=True)
        else:
            out = hf_run(model, req["ids"], req["new"])
        print(json.dumps(out), flush=True)
    return 0


class Worker:
    """A peer in another process: it prints {"ready": what} once loaded (read by ``ready``, so
    workers load side by side), then answers each request line with one JSON line [prefill ms,
    decode ms/token, tokens]."""

    def __init__(self, argv: list[str]):
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._ready = None

    @property
    def ready(self) -> str:
        if self._ready is None:
            self._ready = self._answer()["ready"]
        return self._ready

    def _answer(self):
        for line in self.proc.stdout:
            if line.startswith(("[", "{")):
                return json.loads(line)
        raise RuntimeError(f"the worker exited with {self.proc.wait()}")

    def __call__(self, ids: list[int], new: int, **extra):
        self.ready  # noqa: B018  (loaded)
        self.proc.stdin.write(json.dumps({"ids": ids, "new": new, **extra}) + "\n")
        self.proc.stdin.flush()
        return tuple(self._answer())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=120)


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


def make_peers(args, config, weights, lengths, new):
    """name -> fn(ids, new) and name -> what it is (versions), for the peers asked for."""
    want = args.peers.split(",")
    peers, about, workers = {}, {}, []
    if "hf" in want or "hf-compile" in want:  # started first: it loads while pyforge compiles
        argv = [args.torch_python, os.path.abspath(__file__), "--hf-worker", "--gguf", args.gguf,
                "--threads", str(args.threads)]  # fmt: skip
        hf = Worker(argv)
        workers.append(hf)
        if "hf" in want:
            peers["HF eager (forward loop)"] = hf
        if "hf-compile" in want:
            peers["HF static cache + torch.compile"] = lambda i, n: hf(i, n, mode="compile")
    files = {"llama": ("Q4_K_M", args.gguf), "llama-f32": ("F32", args.f32_gguf)}
    for peer, (kind, path) in files.items():
        if peer not in want:
            continue
        if not os.path.isdir(os.path.join(args.llama_node, "node_modules", "node-llama-cpp")):
            print(f"{peer}: no node-llama-cpp under {args.llama_node}: skipped", file=sys.stderr)
            continue
        if not os.path.exists(path):
            t0 = time.monotonic()
            f32_gguf(args.gguf, path)
            print(f"wrote {path} in {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
        for threads in args.llama_threads.split(","):
            script = os.path.join(HERE, "llama_node.mjs")
            w = Worker(["node", script, args.llama_node, path, threads])
            workers.append(w)
            peers[f"llama.cpp {kind}, {threads} thread{'s' * (threads != '1')}"] = w
    if "pyforge" in want or "ort" in want:
        import numba
        import onnxruntime as ort

        import pyforge
        from pyforge.generate import gemma3

        ctx = max(lengths) + new + 64
        proto = gemma3.build_decoder(config, weights, logits="last", max_context=ctx)
        if "pyforge" in want:
            numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
            gen = pyforge.TextGenerator.from_onnx(proto, target="cpu", max_context=ctx)
            peers["pyforge cpu fp32"] = lambda ids, n, gen=gen: pyforge_run(gen, ids, n)
            about["pyforge"] = f"numba {numba.__version__}, {numba.get_num_threads()} threads"
        if "ort" in want:
            so = ort.SessionOptions()
            so.intra_op_num_threads, so.inter_op_num_threads = args.threads, 1
            sess = ort.InferenceSession(proto.SerializeToString(), so)
            peers["ONNX Runtime cpu (same decoder)"] = lambda ids, n: ort_run(sess, ids, n)
            about["ORT"] = f"onnxruntime {ort.__version__}"
    rank = ("pyforge", "ONNX", "HF eager", "HF static", "llama.cpp Q4", "llama.cpp F32")
    order = sorted(
        peers, key=lambda name: next(i for i, r in enumerate(rank) if name.startswith(r))
    )
    return {name: peers[name] for name in order}, about, workers


def median_row(results: list[tuple], ref: list[int] | None) -> str:
    pre = np.median([r[0] for r in results])
    dec = np.median([r[1] for r in results])
    tokens = results[-1][2]
    same = len(tokens) if ref is None else next(
        (i for i, (a, b) in enumerate(zip(ref, tokens)) if a != b), min(len(ref), len(tokens))
    )  # fmt: skip
    return f"{pre:9.1f} {dec:8.2f} {same:3d}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", default=GGUF, help=f"the GGUF file (default {GGUF})")
    ap.add_argument("--f32-gguf", default=GGUF.replace("q4_k_m", "f32"),
                    help="its F32 copy for llama.cpp (written when missing)")  # fmt: skip
    ap.add_argument("--lengths", default="5,100,128", help="prompt lengths")
    ap.add_argument("--new", type=int, default=64, help="new tokens per call")
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds, peers alternated")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--peers", default="pyforge,ort,hf,llama,llama-f32",
                    help="of pyforge,ort,hf,hf-compile,llama,llama-f32")  # fmt: skip
    ap.add_argument("--llama-node", default=os.environ.get("LLAMA_NODE_DIR", "/work/llama-node"),
                    help="a folder with node_modules/node-llama-cpp")  # fmt: skip
    ap.add_argument("--llama-threads", default="2", help="comma-separated: one peer each")
    ap.add_argument("--torch-python", default="/work/venv-corpus/bin/python")
    ap.add_argument("--budget", type=float, default=3600, help="seconds for the timed rounds")
    ap.add_argument("--buckets", action="store_true", help="measure the bucket choices only")
    ap.add_argument("--hf-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.hf_worker:
        return hf_worker(args)
    t0 = time.monotonic()
    config, weights = read_weights(args.gguf)
    print(f"weights as fp32 in {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    if args.buckets:
        buckets(config, weights, time.monotonic() + args.budget)
        return 0
    lengths, new = [int(n) for n in args.lengths.split(",")], args.new
    peers, about, workers = make_peers(args, config, weights, lengths, new)
    weights = None
    for w in workers:
        about["HF" if "--hf-worker" in w.proc.args else "llama.cpp"] = w.ready
    if "llama.cpp" in about:
        about["llama.cpp"] += " (node-llama-cpp 3.21.1)"
    ids = {n: prompt(n, config.vocab) for n in lengths}
    for name, fn in peers.items():  # untimed: plans compiled, caches sized, weights paged in
        for n in lengths:  # a plan per decode bucket: pyforge and torch.compile run them all
            t0 = time.monotonic()
            try:
                fn(ids[n], new if name.startswith(("pyforge", "HF static")) else 2)
            except Exception as e:  # noqa: BLE001
                print(f"  {name} prompt {n}: {type(e).__name__}: {e}", file=sys.stderr)
            print(f"  {name} prompt {n}: first call {time.monotonic() - t0:.1f} s (untimed)",
                  file=sys.stderr, flush=True)  # fmt: skip
    results = {(name, n): [] for name in peers for n in lengths}
    loads, deadline = [os.getloadavg()[0]], time.monotonic() + args.budget
    for r in range(args.rounds):
        if r and time.monotonic() > deadline:
            break
        for n in lengths:
            for name, fn in peers.items():
                try:
                    results[name, n].append(fn(ids[n], new))
                except Exception as e:  # noqa: BLE001  (a peer that fails says why, once)
                    print(f"  {name} prompt {n}: {type(e).__name__}: {e}", file=sys.stderr)
                    continue
                pre, dec, _ = results[name, n][-1]
                print(f"  round {r} {name} prompt {n}: {pre:.1f} ms, {dec:.2f} ms/token",
                      file=sys.stderr, flush=True)  # fmt: skip
        loads.append(os.getloadavg()[0])
    for w in workers:
        w.close()
    first = next(iter(peers))
    print(f"\nGemma 3 270M ({os.path.basename(args.gguf)}; fp32 = its tensors dequantized), batch "
          f"1, greedy, {new} new tokens; cpu, {len(os.sched_getaffinity(0))} cores, "
          f"{args.threads} threads a peer; {len(results[first, lengths[0]])} rounds alternated, "
          f"medians; 1-min load average {min(loads):.1f}-{max(loads):.1f}; "
          f"{time.strftime('%Y-%m-%d %H:%M')}")  # fmt: skip
    print("; ".join(f"{k}: {v}" for k, v in about.items()))
    print(f"cells: prefill ms, decode ms/token, greedy tokens equal to {first}'s")
    print(f"{'peer':34s}" + "".join(f" | prompt {n:<16d}" for n in lengths))
    for name in peers:
        cells = [
            median_row(results[name, n], results[first, n][-1][2] if results[first, n] else None)
            if results[name, n]
            else "failed"
            for n in lengths
        ]
        print(f"{name:34s}" + "".join(f" | {c:23s}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
