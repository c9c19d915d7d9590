"""``pyforge export MODEL.gguf -o decoder.onnx``: a GGUF file as an ONNX decoder."""

from __future__ import annotations


def add_commands(sub) -> None:
    """Register the ``export`` command."""
    p = sub.add_parser(
        "export", help="write a Gemma 3 GGUF file as an ONNX decoder with a KV cache"
    )
    p.add_argument("model", metavar="MODEL.gguf")
    p.add_argument("-o", "--output", required=True, metavar="DECODER.onnx")
    p.add_argument("--precision", choices=["fp32", "fp16", "bf16"], default="fp32",
                   help="how the matrices are stored (each Cast to float32 in the graph)")  # fmt: skip
    p.add_argument("--logits", choices=["all", "last"], default="all",
                   help="logits for every new position, or the last one only")  # fmt: skip
    p.add_argument("--max-context", type=int, default=None, help="rotary table rows (default 8192)")
    p.set_defaults(fn=run_export)


def run_export(args) -> int:
    import time

    import onnx

    from .gemma3 import build_decoder
    from .gguf import read_gguf

    start = time.perf_counter()
    config, weights, _ = read_gguf(args.model)
    model = build_decoder(config, weights, args.precision, args.logits, args.max_context)
    onnx.save(model, args.output)
    print(
        f"wrote {args.output}: gemma3, {config.layers} layers, hidden {config.hidden}, vocab "
        f"{config.vocab}, {len(model.graph.node)} nodes, {args.precision}, logits {args.logits} "
        f"({time.perf_counter() - start:.1f} s)"
    )
    return 0
