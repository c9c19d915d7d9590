"""``pyforge generate``: stream text from a decoder (a GGUF file or an ONNX decoder)."""

from __future__ import annotations

import sys


def add_commands(sub) -> None:
    """Register ``pyforge generate MODEL.gguf|DECODER.onnx --prompt TEXT ...``."""
    p = sub.add_parser("generate", help="stream text from a GGUF model or an ONNX decoder")
    p.add_argument("model", metavar="MODEL.gguf|DECODER.onnx")
    p.add_argument("--prompt", required=True, help="text (BOS added), or ids with --ids")
    p.add_argument("--ids", action="store_true", help="--prompt is comma-separated token ids")
    p.add_argument("--tokenizer", metavar="MODEL.gguf", help="for an ONNX decoder: its tokenizer")
    p.add_argument("--max-new-tokens", type=int, default=64, metavar="N")
    p.add_argument("--sample", action="store_true", help="sample (default: greedy)")
    p.add_argument("--temperature", type=float, default=1.0, metavar="T")
    p.add_argument("--top-k", type=int, default=None, metavar="K")
    p.add_argument("--top-p", type=float, default=None, metavar="P")
    p.add_argument("--seed", type=int, default=None, metavar="S")
    p.add_argument(
        "--target", choices=["cpu", "cuda"], default=None, help="default: cuda if usable"
    )
    p.add_argument("--max-context", type=int, default=2048, metavar="C")
    p.add_argument("--precision", choices=["fp32", "fp16", "bf16"], default="fp32",
                   help="GGUF: the weights' precision in the decoder")  # fmt: skip
    p.set_defaults(fn=cmd_generate)


def cmd_generate(args) -> int:
    import time

    from ..errors import InputError
    from .runtime import TextGenerator

    gguf = args.model.lower().endswith(".gguf")
    if not gguf and not args.ids and not args.tokenizer:
        raise InputError("an ONNX decoder needs --tokenizer MODEL.gguf, or --ids with token ids")
    if args.ids:
        try:
            prompt = [int(t) for t in args.prompt.split(",")]
        except ValueError:
            raise InputError(f"--ids: --prompt must be comma-separated ints, not {args.prompt!r}")
    else:
        prompt = args.prompt
    print(f"compiling {args.model} ...", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    kw = {"target": args.target, "max_context": args.max_context}
    if gguf:
        gen = TextGenerator.from_gguf(args.model, precision=args.precision, **kw)
    else:
        tok = None
        if args.tokenizer:
            from .tokenizer import from_gguf

            tok = from_gguf(args.tokenizer)
        gen = TextGenerator.from_onnx(args.model, tok, **kw)
    print(f"ready in {time.perf_counter() - t0:.1f} s ({gen.model.target})", file=sys.stderr)
    sampling = {"do_sample": args.sample, "temperature": args.temperature, "top_k": args.top_k}
    sampling.update(top_p=args.top_p, seed=args.seed)
    tokens, shown = [], ""
    stream = gen.stream(prompt, args.max_new_tokens, **sampling)
    for token in stream:
        tokens.append(token)
        if gen.tokenizer is None:
            print(token, end=" ", flush=True)
            continue
        text = gen.tokenizer.decode(tokens)  # whole: a piece may be half of a character
        if not text.endswith("\ufffd"):
            print(text[len(shown) :], end="", flush=True)
            shown = text
    r = gen.last
    print(file=sys.stdout)
    print(
        f"{r.prompt_tokens} prompt tokens ({r.reused_tokens} reused): prefill "
        f"{r.prefill_ms:.1f} ms; {len(r.tokens)} new tokens, decode "
        f"{r.decode_ms_per_token:.2f} ms/token; stopped: {r.stop_reason}",
        file=sys.stderr,
    )
    return 0
