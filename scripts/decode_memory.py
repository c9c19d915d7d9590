"""Issue 19's memory goal on cuda: a Gemma 3 TextGenerator's device memory is the weights once
plus the KV cache (plus each plan's arena), and nothing grows per token.

    python scripts/decode_memory.py [--ctx 1216] [--new 128] [--precision fp32] [--tiny]

Reads the driver's used bytes (free/total of the context) before the generator is built, after
its first generate (every plan of the prompt's bucket and the decode step compiled and bound)
and after each further generate of ``--new`` tokens, and lists what the plans hold: the weights
buffers (counted once per device buffer), the state (KV cache) buffer and each context's arena.
Random weights: the sizes do not depend on the values.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np


def used() -> int:
    from numba import cuda

    free, total = cuda.current_context().get_memory_info()
    return total - free


def held(gen) -> dict[str, int]:
    """Bytes the model's bound plans hold on the device, each buffer counted once."""
    seen: dict[int, tuple[str, int]] = {}
    for bound in gen.model._plans.values():
        rt = bound.runtime
        for ctx in rt.pool.contexts:
            for kind, buf in (("weights", ctx.weights), ("arena", ctx.arena)):
                seen[buf.device_ctypes_pointer.value] = (kind, buf.nbytes)
        seen[rt.state.device_ctypes_pointer.value] = ("state (KV cache)", rt.state.nbytes)
    out: dict[str, int] = {}
    for kind, n in seen.values():
        out[kind] = out.get(kind, 0) + n
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ctx", type=int, default=1216)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--tiny", action="store_true")
    args = ap.parse_args(argv)

    import pyforge
    from pyforge.generate import gemma3

    config = gemma3.Gemma3Config.tiny() if args.tiny else gemma3.Gemma3Config()
    weights = gemma3.random_weights(config, seed=0)
    host_weights = sum(int(np.asarray(w).nbytes) for w in weights.values())
    kv = 2 * config.layers * config.kv_heads * config.head_dim * args.ctx * 4
    ids = [int(i) for i in np.random.default_rng(0).integers(3, config.vocab, args.prompt)]
    base = used()
    gen = pyforge.TextGenerator.from_config(
        config, weights, target="cuda", max_context=args.ctx, precision=args.precision
    )
    gen.generate(ids, max_new_tokens=args.new)
    rows = [("after the first generate", used() - base)]
    for k in range(3):  # continuing the conversation: the cache fills further, nothing is made
        if len(gen.conversation) + args.new + 1 > args.ctx:
            gen.reset()
        gen.generate(list(gen.conversation) or ids, max_new_tokens=args.new)
        rows.append(
            (f"after generate {k + 2} ({len(gen.conversation)} tokens held)", used() - base)
        )
    parts = held(gen)
    mib = 1 << 20
    print(f"Gemma 3 {'tiny' if args.tiny else '270M'}, cuda {args.precision}, max_context "
          f"{args.ctx}, prompt {args.prompt}, {args.new} new tokens a generate; "
          f"{len(gen.model._plans)} plans bound")  # fmt: skip
    print(f"  weights on the host (fp32 arrays as built): {host_weights / mib:9.1f} MiB")
    print(f"  KV cache, float32 at max_context:           {kv / mib:9.1f} MiB")
    for kind, n in sorted(parts.items()):
        print(f"  held by the plans, {kind:24s} {n / mib:9.1f} MiB")
    print(f"  held by the plans, together                 {sum(parts.values()) / mib:9.1f} MiB")
    for name, n in rows:
        print(f"  device memory used {name:40s} {n / mib:9.1f} MiB")
    growth = rows[-1][1] - rows[0][1]
    print(f"  growth over the last {len(rows) - 1} generates: {growth / mib:.2f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
