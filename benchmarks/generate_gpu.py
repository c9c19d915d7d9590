"""Gemma 3 270M text generation on one GPU: pyforge (cuda) against HF transformers, eager and
static cache + torch.compile, on the same random weights (speed does not depend on the values;
the GGUF file is too large to send to the GPU machine). Greedy, batch 1, fp32 (pyforge also at
each of ``--precision``: fp16 compiles with precision="fp16", GEMMs on float16 weights).

    python benchmarks/generate_gpu.py            # prompts 5, 128, 1024; 128 new tokens
    python benchmarks/generate_gpu.py --quick    # prompts 5, 128; 32 new tokens
    python benchmarks/generate_gpu.py --device cpu --tiny --skip eager,compile   # a smoke test
    python benchmarks/generate_gpu.py --quick --ctx 256 --caches static --precision fp32,fp16 \
        --skip eager,compile   # pyforge's decode, fp32 against fp16, alternated

pyforge runs twice, with the KV cache kept in place (``cache="static"``: state slots, one decode
plan and one CUDA graph for every step) and in the concat layout (past fed, present copied
back, a plan per 64-row bucket), the two alternated call by call (medians of --rounds runs).

Needs torch, transformers (5.x), onnx, numba-cuda; nothing from the network and no file. Every
peer runs under one deadline (--budget seconds, default 420); a peer that fails or runs out of
time is a row saying so. The table is printed last. ``benchmarks/generate_peers.py`` imports
the weight mapping and the HF timing from here.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# GGUF tensor name (as pyforge/generate/gemma3.py reads weights) -> transformers' Gemma 3 name
_LAYER = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "post_attention_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
    "post_ffw_norm": "post_feedforward_layernorm",
}  # fmt: skip


def hf_names(layers: int) -> dict[str, str]:
    names = {
        "token_embd.weight": "model.embed_tokens.weight",
        "output_norm.weight": "model.norm.weight",
    }
    for i in range(layers):
        names.update(
            {f"blk.{i}.{g}.weight": f"model.layers.{i}.{h}.weight" for g, h in _LAYER.items()}
        )
    return names


def is_norm(name: str) -> bool:  # GGUF stores Gemma's RMSNorm scales as 1 + w
    return name.endswith("norm.weight")


def hf_config(c, attn: str = "eager"):
    import transformers

    rope = {"sliding_attention": {"rope_type": "default", "rope_theta": c.rope_local},
            "full_attention": {"rope_type": "default", "rope_theta": c.rope_global}}  # fmt: skip
    kinds = ["sliding_attention" if c.sliding(i) else "full_attention" for i in range(c.layers)]
    cfg = transformers.Gemma3TextConfig(
        hidden_size=c.hidden, num_hidden_layers=c.layers, num_attention_heads=c.heads,
        num_key_value_heads=c.kv_heads, head_dim=c.head_dim, intermediate_size=c.ffn,
        vocab_size=c.vocab, rms_norm_eps=c.eps, sliding_window=c.window, layer_types=kinds,
        query_pre_attn_scalar=int(c.query_pre_attn_scalar), max_position_embeddings=c.context,
        rope_parameters=rope, hidden_activation="gelu_pytorch_tanh",
    )  # fmt: skip
    cfg._attn_implementation = attn
    return cfg


def hf_model(c, weights: dict[str, np.ndarray], device: str, attn: str = "eager", dtype="fp32"):
    """transformers' Gemma3ForCausalLM holding ``weights`` (GGUF-named, as gemma3.py takes),
    its parameters in ``dtype`` (fp32, bf16 or fp16)."""
    import torch
    import transformers

    model = transformers.Gemma3ForCausalLM(hf_config(c, attn))
    state = {
        hf: torch.from_numpy(weights[g] - 1 if is_norm(g) else weights[g])
        for g, hf in hf_names(c.layers).items()
    }
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise RuntimeError(f"weights do not fit: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    kind = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    model = model.to(device=device, dtype=kind).eval()
    return model


def gguf_weights(model) -> dict[str, np.ndarray]:
    """The inverse: a transformers Gemma 3's weights, GGUF-named, for gemma3.build_decoder."""
    state = model.state_dict()
    out = {}
    for g, hf in hf_names(model.config.num_hidden_layers).items():
        w = state[hf].detach().float().cpu().numpy()
        out[g] = (w + 1 if is_norm(g) else w).astype(np.float32)
    return out


def prompt(n: int, vocab: int, seed: int = 0) -> list[int]:
    return [2] + [
        int(t) for t in np.random.default_rng(seed + n).integers(10, min(vocab, 30000), n - 1)
    ]


def measure_hf(model, ids: list[int], new: int, device: str, static: bool = False):
    """(prefill ms, decode ms/token, tokens) of transformers' generate(), greedy, no early eos:
    prefill = a generate of one token; decode = the rest of a generate of ``new`` / (new - 1)."""
    import torch

    x = torch.tensor([ids], device=device)
    kw = dict(do_sample=False, pad_token_id=0, eos_token_id=None)
    if static:
        import transformers

        kw["cache_implementation"] = "static"
        compile_config = transformers.CompileConfig(fullgraph=True, mode="reduce-overhead")
        compile_config._compile_all_devices = True  # generate() compiles on cuda only otherwise
        kw["compile_config"] = compile_config

    def run(n):
        sync(device)
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(x, max_new_tokens=n, min_new_tokens=n, **kw)
        sync(device)
        return (time.perf_counter() - t0) * 1e3, out[0, len(ids) :].tolist()

    run(new)  # warm-up: compiles (static) and allocates
    one, _ = run(1)
    full, tokens = run(new)
    return one, (full - one) / (new - 1), tokens


def measure_hf_eager_loop(model, ids: list[int], new: int, device: str):
    """The eager forward loop itself (no generate() overhead): prefill, then one token per call."""
    import torch

    def run():
        with torch.no_grad():
            sync(device)
            t0 = time.perf_counter()
            out = model(torch.tensor([ids], device=device), use_cache=True)
            tok = int(out.logits[0, -1].argmax())
            t1 = time.perf_counter()
            tokens = [tok]
            for _ in range(new - 1):
                out = model(
                    torch.tensor([[tok]], device=device),
                    past_key_values=out.past_key_values,
                    use_cache=True,
                )
                tok = int(out.logits[0, -1].argmax())
                tokens.append(tok)
            t2 = time.perf_counter()
        return (t1 - t0) * 1e3, (t2 - t1) * 1e3 / (new - 1), tokens

    run()
    return run()


class _HostGreedy:
    """A generator run as before next_token: the logits copied each step, argmax on the host,
    no step queued ahead (the A/B of the device-side pick)."""

    def __init__(self, gen):
        self.gen = gen

    def reset(self):
        self.gen.reset()

    def generate(self, ids, **kw):
        self.gen._next = False
        try:
            return self.gen.generate(ids, **kw)
        finally:
            self.gen._next = True


def measure_pyforge(gen, ids: list[int], new: int):
    gen.reset()
    gen.generate(ids, max_new_tokens=new)  # warm-up: compiles the plans of every bucket used
    gen.reset()
    r = gen.generate(ids, max_new_tokens=new)
    return r.prefill_ms, r.decode_ms_per_token, r.tokens


def measure_alternating(gens: dict, ids: list[int], new: int, rounds: int) -> dict:
    """name -> (prefill ms, decode ms/token, tokens): medians over ``rounds`` generates, the
    generators taking turns call by call (a shared machine's drift hits each alike)."""
    for gen in gens.values():  # warm-up: compiles the plans of every bucket used
        gen.reset()
        gen.generate(ids, max_new_tokens=new)
    runs: dict = {name: [] for name in gens}
    for _ in range(rounds):
        for name, gen in gens.items():
            gen.reset()
            runs[name].append(gen.generate(ids, max_new_tokens=new))
    return {
        name: (float(np.median([r.prefill_ms for r in rs])),
               float(np.median([r.decode_ms_per_token for r in rs])), rs[-1].tokens)
        for name, rs in runs.items()
    }  # fmt: skip


def profile_steps(gen, reps: int = 20, seq: int = 1) -> list[tuple[str, int, float]]:
    """A plan's device time by step kind (the decode step's, or the prefill bucket holding
    ``seq`` tokens): each step's launches ``reps`` times in a CUDA graph of its own, timed by
    events (no host gaps). (kind, steps, us a run), the largest first; a GEMM's kind names
    m x n x k and its dtype."""
    from numba import cuda

    from pyforge.exec.cuda.graph import CudaGraph

    bound, at = gen.model._plans, gen.model._names.index("input_ids")  # {input shapes: plan}
    keys = [k for k in bound if k[at][-1] >= seq]
    key = min(keys, key=lambda k: k[at][-1]) if seq > 1 else None
    rt, rows = (bound[key].runtime if key is not None else gen.model.runtime).first, {}
    t0, t1 = cuda.event(), cuda.event()
    t0.record(rt.stream)
    for _ in range(reps):
        rt.graph.replay()
    t1.record(rt.stream)
    t1.synchronize()
    rows["(the plan's own graph, all steps)"] = 0, cuda.event_elapsed_time(t0, t1) * 1e3 / reps
    for step, call in zip(rt.plan.steps, rt.calls, strict=True):
        if hasattr(step, "m"):
            kind = f"GEMM {step.m}x{step.n}x{step.k} {rt.plan.slots[step.d].dtype}"
        else:
            kind = step.label.split(" ")[0]
        g, t0, t1 = CudaGraph(rt.stream), cuda.event(), cuda.event()
        g.capture(lambda call=call: [call() for _ in range(reps)])
        g.replay()
        t0.record(rt.stream)
        g.replay()
        t1.record(rt.stream)
        t1.synchronize()
        n, us = rows.get(kind, (0, 0.0))
        rows[kind] = n + 1, us + cuda.event_elapsed_time(t0, t1) * 1e3 / reps
        g.close()
    return sorted(((k, n, us) for k, (n, us) in rows.items()), key=lambda r: -r[2])


def sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


class Table:
    def __init__(self, lengths, new: int, deadline: float):
        self.lengths, self.new, self.deadline, self.rows = lengths, new, deadline, []
        self.reference: dict[int, list[int]] = {}

    def run(self, name: str, fn, need_s: float = 5.0) -> None:
        """One peer: fn(ids) -> (prefill ms, decode ms/token, tokens) per prompt length."""
        cells = []
        for n in self.lengths:
            if time.monotonic() + need_s > self.deadline:
                cells.append("out of time")
                continue
            try:
                t0 = time.monotonic()
                pre, dec, tokens = fn(n)
                ref = self.reference.setdefault(n, tokens)
                same = next((i for i, (a, b) in enumerate(zip(ref, tokens)) if a != b), len(ref))
                cells.append(f"{pre:9.2f} {dec:8.3f} {same:4d}")
                print(f"  {name} prompt {n}: prefill {pre:.2f} ms, decode {dec:.3f} ms/token, "
                      f"{same}/{len(ref)} tokens as the first peer ({time.monotonic() - t0:.0f} s)",
                      file=sys.stderr, flush=True)  # fmt: skip
            except Exception as e:  # noqa: BLE001  (a peer that fails is a row saying why)
                cells.append(f"failed: {type(e).__name__}: {str(e)[:60]}")
                print(f"  {name} prompt {n}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        self.rows.append((name, cells))

    def print(self, title: str) -> None:
        print(f"\n{title}")
        print("cells: prefill ms, decode ms/token, greedy tokens equal to the first row's (of "
              f"{self.new}); prompt lengths {list(self.lengths)}")  # fmt: skip
        head = "".join(f" | prompt {n:<22d}" for n in self.lengths)
        print(f"{'peer':34s}{head}")
        for name, cells in self.rows:
            print(f"{name:34s}" + "".join(f" | {c:29s}" for c in cells))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="prompts 5 and 128, 32 new tokens")
    ap.add_argument("--budget", type=float, default=420, help="seconds for every peer together")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--tiny", action="store_true", help="the tiny config (a smoke test)")
    ap.add_argument("--skip", default="", help="comma-separated peers to skip: eager,compile")
    ap.add_argument("--caches", default="static,concat", help="pyforge's cache layouts to run")
    ap.add_argument("--ctx", type=int, default=0, help="max_context (default: what fits)")
    ap.add_argument("--rounds", type=int, default=3, help="pyforge generates per layout")
    ap.add_argument("--new", type=int, default=0, help="new tokens (default 128, --quick 32)")
    ap.add_argument("--precision", default="fp32", help="pyforge's precisions: fp32,fp16,bf16")
    ap.add_argument("--profile", action="store_true", help="cuda: decode device time by step")
    ap.add_argument("--profile-prefill", type=int, default=0, help="cuda: a prefill's, this long")
    ap.add_argument("--host-greedy", action="store_true",
                    help="also each decoder picking greedy from the copied logits, step by step")  # fmt: skip
    ap.add_argument("--hf-dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    args = ap.parse_args(argv)
    deadline = time.monotonic() + args.budget
    skip = set(args.skip.split(","))
    if {"eager", "compile"} <= skip and args.device == "cpu":  # pyforge alone: no torch needed
        torch = None
    else:
        import torch

    import pyforge
    from pyforge.generate import gemma3

    device = args.device if torch is None or torch.cuda.is_available() else "cpu"
    config = gemma3.Gemma3Config.tiny() if args.tiny else gemma3.Gemma3Config()
    lengths = (5, 128) if args.quick else (5, 128, 1024)
    new = 32 if args.quick else 128
    ctx = max(lengths) + new + 64
    if args.tiny:
        lengths, new, ctx = (5, 128), 32, 224
    new = args.new or new
    ctx = args.ctx or ctx
    t0 = time.monotonic()
    weights = gemma3.random_weights(config, seed=0)
    table = Table(lengths, new, deadline)
    target = "cuda" if device == "cuda" else "cpu"
    gens = {}
    for p in filter(None, args.precision.split(",")):
        for cache in filter(None, args.caches.split(",")):
            name = f"pyforge {target} {p}, {cache} cache"
            try:  # one that fails to build or run is reported; the others still run
                gens[name] = pyforge.TextGenerator.from_config(
                    config, weights, target=target, max_context=ctx, precision=p, cache=cache
                )
                gens[name].generate(prompt(5, config.vocab), max_new_tokens=2)
            except Exception as e:  # noqa: BLE001
                gens.pop(name, None)
                print(f"  {name}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
    if args.host_greedy:  # the same decoders, greedy from the copied logits, step by step
        gens.update({f"{n} (host greedy)": _HostGreedy(g) for n, g in list(gens.items())})
    print(f"decoders built and compiled in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    done = {}
    for n in lengths:  # each length's figures printed as they come: a long run may be cut
        done[n] = measure_alternating(gens, prompt(n, config.vocab), new, args.rounds)
        for name, (pre, dec, _) in done[n].items():
            print(f"  {name} prompt {n}: prefill {pre:.2f} ms, decode {dec:.3f} ms/token "
                  f"({time.monotonic() - t0:.0f} s)", file=sys.stderr, flush=True)  # fmt: skip
    for name in gens:
        table.run(name, lambda n, name=name: done[n][name])
    for name, gen in gens.items() if args.profile and target == "cuda" else ():
        if isinstance(gen, _HostGreedy):
            continue
        for seq in [1] + ([args.profile_prefill] if args.profile_prefill else []):
            try:
                rows = profile_steps(gen, seq=seq)
            except Exception as e:  # noqa: BLE001  (the table below still prints)
                print(f"  {name}: profile failed: {type(e).__name__}: {e}", file=sys.stderr)
                continue
            what = "decode" if seq == 1 else f"prefill ({seq} tokens)"
            print(
                f"\n{name}: {what} device time by step kind (a graph per step, whose sum "
                f"{sum(r[2] for r in rows if r[1]):.1f} us leaves out the gaps between steps)"
            )
            for kind, n, us in rows[:16]:
                print(f"  {kind:40s} {n:4d} steps {us:9.1f} us")
    gens = None  # their plans and caches go before the next peer loads
    if "eager" not in skip:
        model = hf_model(config, weights, device, dtype=args.hf_dtype)
        table.run("HF eager (forward loop)",
                  lambda n: measure_hf_eager_loop(model, prompt(n, config.vocab), new, device))  # fmt: skip
        table.run("HF eager generate()",
                  lambda n: measure_hf(model, prompt(n, config.vocab), new, device))  # fmt: skip
        del model
    if "compile" not in skip:
        model = hf_model(config, weights, device, attn="sdpa", dtype=args.hf_dtype)
        table.run("HF static cache + torch.compile",
                  lambda n: measure_hf(model, prompt(n, config.vocab), new, device, static=True),
                  need_s=60)  # fmt: skip
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    version = torch.__version__ if torch else "(no torch)"
    table.print(f"Gemma 3 {'tiny' if args.tiny else '270M'} (random weights), batch 1, "
                f"HF {args.hf_dtype}, greedy, {new} new tokens, max_context {ctx}; {name}; torch {version}; "
                f"{time.strftime('%Y-%m-%d %H:%M')}; load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
