"""``pyforge serve``: a model behind Ray Serve on this machine."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading


def add_commands(sub) -> None:
    """Register ``serve`` (Ray is imported only when it runs)."""
    p = sub.add_parser("serve", help="serve a model over HTTP with Ray Serve (dynamic batching)")
    p.add_argument(
        "model", metavar="MODEL", help="an .onnx path or a built-in model (batch dim free)"
    )
    p.add_argument("--backend", choices=["pyforge", "ort"], default="pyforge")
    p.add_argument("--target", choices=["cpu", "cuda"], default=None, help="pyforge's target")
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--max-batch-size", type=int, default=32, help="plans for 1, 2, 4, ... up to it")
    p.add_argument("--batch-wait-ms", type=float, default=0.0,
                   help="a wait before a batch that is not full (default none: batches form "
                   "from the requests that queue while the model runs)")  # fmt: skip
    p.add_argument("--fill-wait-ms", type=float, default=0.0,
                   help="under load (the last batch held several requests), a wait of up to T "
                   "for as many before the next batch")  # fmt: skip
    p.add_argument("--inline-ms", type=float, default=1.0,
                   help="a batch expected to take under T ms runs on the replica's event loop, "
                   "not a worker thread (0: always a thread)")  # fmt: skip
    p.add_argument("--max-queued", type=int, default=256, help="queued requests before 503")
    p.add_argument("--cpus-per-replica", type=float, default=1.0)
    p.add_argument("--gpus-per-replica", type=float, default=0.0)
    p.add_argument("--generate", action="store_true",
                   help="MODEL is a decoder: POST /generate streams tokens (on for a .gguf)")  # fmt: skip
    p.add_argument("--tokenizer", metavar="MODEL.gguf", help="a decoder ONNX's vocabulary")
    p.add_argument("--max-context", type=int, default=2048, metavar="C")
    p.add_argument("--access-log", action="store_true", help="Serve's log line per request")
    p.add_argument("--direct", action="store_true",
                   help="each replica serves HTTP on --host:--port itself, without Ray's proxy "
                   "(a no-op model 0.5-0.8 ms p50 here instead of 12-16; replicas share the port)")  # fmt: skip
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.set_defaults(fn=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    from ..cli import BUILTIN, CliError
    from ..models import cached_model

    if args.model in BUILTIN and not os.path.exists(args.model):
        path = cached_model(args.model, batch="batch")  # the batch dim left free, for batching
    elif os.path.isfile(args.model):
        path = args.model
    else:
        raise CliError(f"{args.model}: no such ONNX file, and not a built-in model {list(BUILTIN)}")
    from .engine import ServeConfig

    config = ServeConfig(
        backend=args.backend,
        target=args.target,
        replicas=args.replicas,
        max_batch_size=args.max_batch_size,
        batch_wait_ms=args.batch_wait_ms,
        fill_wait_ms=args.fill_wait_ms,
        inline_ms=args.inline_ms,
        max_queued=args.max_queued,
        cpus_per_replica=args.cpus_per_replica,
        gpus_per_replica=args.gpus_per_replica,
        max_context=args.max_context,
        tokenizer=args.tokenizer,
        access_log=args.access_log,
        direct=args.direct,
    )
    generate = args.generate or path.lower().endswith(".gguf")
    config.check()
    try:
        from .deployment import start, stop

        if generate:
            from .generation import start_generator as start
    except ImportError as e:
        raise CliError(f"pyforge serve needs Ray Serve: pip install 'ray[serve]' ({e})") from None
    done = threading.Event()
    try:
        start(path, config, host=args.host, port=args.port)
        for sig in (signal.SIGINT, signal.SIGTERM):  # after ray.init, which sets its own
            signal.signal(sig, lambda *_: done.set())
        url = f"http://{args.host}:{args.port}"
        what = f"generate) at {url}/generate" if generate else f"{args.backend}) at {url}/predict"
        what = what.replace(")", ", direct)", 1) if args.direct else what
        print(f"serving {args.model} ({what}; Ctrl-C stops", flush=True)
        done.wait()
        print("stopping: draining requests in flight", file=sys.stderr, flush=True)
    finally:
        stop()
    return 0
