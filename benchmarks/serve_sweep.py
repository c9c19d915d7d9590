"""Tail-latency sweep of pyforge and ONNX Runtime behind the same Ray Serve (issue 15).

    python benchmarks/serve_sweep.py [--models mlp,resnet50,minilm] [--backends pyforge,ort]
        [--concurrency 1,8,16,32,64] [--rates 0.25,0.5,0.8] [--seconds 10] [--requests 2000]
        [--clients 2] [--max-batch-size 32] [--batch-wait-ms 10] [--seq 32] [--md BENCHMARKS.md]

One Serve on 127.0.0.1: first a no-op endpoint (reads the body, answers one byte), whose
closed-loop figures are the client's ceiling; then, per model, both backends deployed side by
side (/pyforge, /ort), each driven closed-loop at every concurrency (the backends alternate
within a level) and open-loop at fixed request rates (fractions of pyforge's best closed-loop
throughput, the same rate for both; latency counted from the scheduled send time, so a backlog
shows). Each request carries a unique seeded input (.npy, or .npz for several inputs); the
client processes (asyncio + aiohttp, keep-alive) pre-build their bodies before the clock
starts. Every answer is compared with a direct ``predict`` of the same input by the same
backend in this process (rtol 1e-4, atol 1e-5): ``wrong`` counts those that differ. ``--md``
appends the table to that file under "## Serving (issue 15)".
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import io
import multiprocessing as mp
import os
import platform
import socket
import sys
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

NPY, NPZ = "application/x-npy", "application/x-npz"
RTOL, ATOL = 1e-4, 1e-5


def make_input(specs: list, seed: int, seq: int) -> dict[str, np.ndarray]:
    """One request's seeded input (one row): free dims after the first take ``seq``."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, dims, dtype in specs:
        shape = [1] + [d if isinstance(d, int) else seq for d in dims[1:]]
        if "mask" in name:
            out[name] = np.ones(shape, dtype)
        elif np.issubdtype(dtype, np.integer):
            out[name] = rng.integers(0, 2 if "type" in name else 1000, shape).astype(dtype)
        else:
            out[name] = rng.standard_normal(shape).astype(dtype)
    return out


def encode(feeds: dict[str, np.ndarray]) -> tuple[bytes, str]:
    buf = io.BytesIO()
    if len(feeds) == 1:
        np.save(buf, next(iter(feeds.values())))
        return buf.getvalue(), NPY
    np.savez(buf, **feeds)
    return buf.getvalue(), NPZ


def decode(body: bytes) -> dict | np.ndarray:
    """An .npy answer as its array, an .npz one (several inputs or outputs) as a dict."""
    loaded = np.load(io.BytesIO(body), allow_pickle=False)
    return {k: loaded[k] for k in loaded.files} if hasattr(loaded, "files") else loaded


def client(job: dict) -> tuple[float, float, list[tuple]]:
    """One client process: build its bodies, then send them closed- or open-loop; returns the
    wall-clock times of its first send and last answer, and (seed, latency s, status, body)."""
    bodies = [(s, *encode(make_input(job["specs"], s, job["seq"]))) for s in job["seeds"]]
    start = time.time()
    results = asyncio.run(_drive(job, bodies))
    return start, time.time(), results


async def _drive(job: dict, bodies: list) -> list[tuple]:
    import aiohttp

    results: list[tuple] = []
    deadline = time.perf_counter() + job["seconds"]
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=timeout
    ) as http:

        async def one(seed: int, body: bytes, kind: str, t0: float) -> None:
            try:
                async with http.post(job["url"], data=body, headers={"Content-Type": kind}) as r:
                    got = await r.read()
                    status, timing = r.status, r.headers.get("server-timing", "")
            except (TimeoutError, aiohttp.ClientError) as e:
                got, status, timing = repr(e).encode(), -1, ""
            results.append((seed, time.perf_counter() - t0, status, got, timing))

        if job["rate"] is None:  # closed loop: each worker sends its next as the last answers
            pending = iter(bodies)

            async def worker() -> None:
                for seed, body, kind in pending:
                    if time.perf_counter() > deadline:
                        return
                    await one(seed, body, kind, time.perf_counter())

            await asyncio.gather(*(worker() for _ in range(job["concurrency"])))
        else:  # open loop: sends at fixed times, whatever the answers do
            start, tasks = time.perf_counter(), []
            for i, (seed, body, kind) in enumerate(bodies):
                at = start + i / job["rate"]
                if at > deadline:
                    break
                await asyncio.sleep(max(0.0, at - time.perf_counter()))
                tasks.append(asyncio.create_task(one(seed, body, kind, at)))
            await asyncio.gather(*tasks)
    return results


class Sweep:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.pool = mp.get_context("spawn").Pool(args.clients)
        self.next_seed = 0
        self.rows: list[dict] = []

    def level(self, url, specs, engine, label, concurrency=None, rate=None) -> dict:
        a = self.args
        before = scrape(url)
        total = (
            max(a.requests, 4 * (concurrency or 1)) if rate is None else int(rate * a.seconds) + 1
        )
        seeds = list(range(self.next_seed, self.next_seed + total))
        self.next_seed += total
        jobs = [
            {"url": url, "specs": specs, "seq": a.seq, "seeds": seeds[k :: a.clients], "seconds": a.seconds,
             "concurrency": max(1, (concurrency or 0) // a.clients + (k < (concurrency or 0) % a.clients)),
             "rate": None if rate is None else rate / a.clients}
            for k in range(a.clients)
        ]  # fmt: skip
        if concurrency is not None and concurrency < a.clients:  # c=1: one client process
            jobs = [dict(jobs[0], seeds=seeds, concurrency=concurrency)]
        parts = self.pool.map(client, jobs)
        results = [r for _, _, part in parts for r in part]
        wall = max(p[1] for p in parts) - min(p[0] for p in parts)
        ok = [r for r in results if r[2] == 200]
        lat = np.array([r[1] for r in ok]) * 1e3 if ok else np.array([np.nan])
        wrong = (
            sum(not _same(engine, specs, a.seq, seed, body) for seed, _, _, body, _ in ok)
            if engine
            else 0
        )
        row = {
            "what": label, "mode": "closed" if rate is None else "open",
            "level": concurrency if rate is None else f"{rate:.3g}/s", "n": len(results),
            "rps": len(ok) / max(wall, 1e-9), "p50": np.percentile(lat, 50), "p99": np.percentile(lat, 99),
            "p999": np.percentile(lat, 99.9), "errors": len(results) - len(ok), "wrong": wrong,
        }  # fmt: skip
        server = _server_spans(ok)
        if server:
            row["server"] = server
        after = scrape(url)
        if before and after:  # the replica's own view of the level: batches formed, padding, cpu
            d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
            batches, reqs = d["pyforge_batch_size_count"], d["pyforge_batch_size_sum"]
            pad, cpu = (
                d.get("pyforge_padded_rows_total", 0.0),
                d.get("process_cpu_seconds_total", 0.0),
            )
            row["replica"] = (
                f"mean batch {reqs / max(batches, 1):.1f} ({batches:.0f} batches), "
                + (
                    f"padding {pad / max(reqs + pad, 1):.0%} of rows, "
                    if "pyforge_padded_rows_total" in d
                    else ""
                )
                + (f"replica cpu {cpu / max(reqs, 1) * 1e3:.2f} ms/request" if cpu else "")
            )
        print(_fmt(row), flush=True)
        self.rows.append(row)
        return row


def _server_spans(ok: list[tuple]) -> str:
    """Medians of the replica's Server-Timing spans over a level's answers, and of what lies
    outside the replica (the client, the loopback, the HTTP server's own parse and write)."""
    got = []
    for _, latency, _, _, timing in ok:
        if not timing:
            continue
        parts = dict(p.strip().split(";", 1) for p in timing.split(","))
        spans = {n: float(parts[n].split("=")[1]) for n in SPANS}
        spans["batch"] = float(parts["batch"].split("=")[1])
        spans["outside"] = latency * 1e3 - sum(spans[n] for n in SPANS)
        got.append(spans)
    if not got:
        return ""
    med = {k: np.median([g[k] for g in got]) for k in got[0]}
    inside = ", ".join(f"{k} {med[k]:.2f}" for k in (*SPANS, "outside"))
    return f"medians ms: {inside}; batch {med['batch']:.0f}"


def _same(engine, specs, seq, seed, body) -> bool:
    feeds = make_input(specs, seed, seq)
    want = engine.predict(feeds)
    got = decode(body)
    got = got if isinstance(got, dict) else {next(iter(want)): got}
    return all(np.allclose(got[k], v, rtol=RTOL, atol=ATOL) for k, v in want.items())


def scrape(url: str) -> dict[str, float]:
    """A pyforge replica's /metrics as name -> value (unlabelled series only); {} elsewhere."""
    import urllib.request

    if not url.endswith("/predict"):
        return {}
    with urllib.request.urlopen(url[: -len("predict")] + "metrics", timeout=30) as r:
        lines = r.read().decode().splitlines()
    pairs = (line.rsplit(" ", 1) for line in lines if line and not line.startswith("#"))
    return {k: float(v) for k, v in pairs if "{" not in k}


def _fmt(row: dict) -> str:
    return (
        f"| {row['what']} | {row['mode']} | {row['level']} | {row['n']} | {row['rps']:,.1f} | "
        f"{row['p50']:.2f} | {row['p99']:.2f} | {row['p999']:.2f} | {row['errors']} | {row['wrong']} | "
        f"{'; '.join(filter(None, (row.get('replica', ''), row.get('server', ''))))} |"
    )


HEADER = (
    "| endpoint | loop | concurrency / rate | requests | req/s | p50 ms | p99 ms | p99.9 ms | errors | wrong | in the replica |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|"
)


def model_path(name: str) -> str:
    from pyforge.models import cached_model

    if name in ("mlp", "resnet50"):
        return cached_model(name, batch="batch")
    corpus = Path(os.environ.get("PYFORGE_CORPUS") or Path.home() / ".cache" / "pyforge-corpus")
    path = corpus / "minilm_l6.onnx"
    if not path.exists():
        sys.exit(f"{path} missing: build it with python benchmarks/corpus.py --models minilm_l6")
    return str(path)


def noop_deployment():
    from ray import serve
    from starlette.responses import Response

    @serve.deployment(max_ongoing_requests=256, ray_actor_options={"num_cpus": 0.1})
    class Noop:
        async def __call__(self, request):
            await request.body()
            return Response(b"\x00", media_type=NPY)

    return Noop


def ray_noop_deployment():
    from ray import serve

    @serve.deployment(ray_actor_options={"num_cpus": 0.1})
    class RayNoop:  # as Ray's own benchmark (ray/serve/_private/benchmarks/common.py) has it
        def __init__(self):
            import logging

            logging.getLogger("ray.serve").setLevel(logging.WARNING)

        def __call__(self, *args, **kwargs):
            return b""

    return RayNoop


def _plain_server(port: int) -> None:
    """The same no-op without Ray (aiohttp's server): loopback HTTP and this client's floor."""
    from aiohttp import web

    async def noop(request):
        await request.read()
        return web.Response(body=b"\x00")

    app = web.Application()
    app.router.add_post("/", noop)
    web.run_app(app, host="127.0.0.1", port=port, print=None)


def identity_path() -> str:
    """y = x over float32 [batch, 256]: a model that costs nothing, for the path's overhead."""
    import tempfile

    import onnx
    from onnx import TensorProto, helper

    io_ = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", 256]) for n in "xy"]
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "identity", io_[:1], io_[1:]
    )
    path = os.path.join(tempfile.gettempdir(), "pyforge_serve_identity.onnx")
    onnx.save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path
    )
    return path


SPANS = ("read", "decode", "queue", "model", "reply", "encode")


def hops(args, port: int) -> tuple[list[str], list[str]]:
    """Where a no-op request's time goes, at concurrency 1, the endpoints alternating request by
    request: aiohttp without Ray, Ray's own no-op, ours (reads the body), then an identity model
    behind pyforge's server (both backends, and pyforge with a 10 ms batch wait: the old
    default); for those, the replica's Server-Timing header splits the time into the hops
    before it (client and proxy), inside it and after it. Returns markdown rows and notes."""
    import http.client

    from ray import serve

    from pyforge.serve.deployment import ServeConfig, start
    from pyforge.serve.engine import Engine

    plain = free_port()
    server = mp.get_context("spawn").Process(target=_plain_server, args=(plain,), daemon=True)
    server.start()
    serve.run(ray_noop_deployment().bind(), name="raynoop", route_prefix="/raynoop")
    path = identity_path()
    # routes none of which is a prefix of another: direct ingress matches them as strings
    models = {"pyforge": ("pyforge", 0.0, False), "ort": ("ort", 0.0, False),
              "wait10": ("pyforge", 10.0, False), "log": ("pyforge", 0.0, True)}  # fmt: skip
    for name, (backend, wait, log) in models.items():
        config = ServeConfig(backend=backend, max_batch_size=args.max_batch_size,
                             batch_wait_ms=wait, cpus_per_replica=0.5, access_log=log)  # fmt: skip
        start(
            path, config, host="127.0.0.1", port=port, name=f"id-{name}", route_prefix=f"/id-{name}"
        )
    endpoints = {
        "aiohttp no-op, no Ray (client + loopback floor)": (plain, "/"),
        "Ray's own no-op deployment": (port, "/raynoop"),
        "our no-op deployment (reads the body)": (port, "/noop"),
        **{f"identity model, {b}{', batch wait 10 ms' if w else ''}{', access log on' if log else ''}":
           (port, f"/id-{n}/predict") for n, (b, w, log) in models.items()},
    }  # fmt: skip
    x = np.random.default_rng(0).standard_normal((1, 256)).astype(np.float32)
    body, kind = encode({"x": x})
    time.sleep(2)  # the plain server's start
    if os.environ.get("RAY_SERVE_THROUGHPUT_OPTIMIZED") == "1":  # Ray's direct ingress: each
        for k, (_, route) in list(endpoints.items())[1:]:  # replica serves HTTP on 30000+
            for p in range(30000, 30016):
                if _status(p, route, body, kind) == 200:
                    endpoints[f"{k}, direct ingress (no proxy)"] = (p, route)
                    break
    conns = {
        k: http.client.HTTPConnection("127.0.0.1", p, timeout=60) for k, (p, _) in endpoints.items()
    }
    got: dict[str, list] = {k: [] for k in endpoints}
    for i in range(args.hops + 20):  # the first 20 rounds warm up
        for k, (_, route) in endpoints.items():
            t_wall, t0 = time.time(), time.perf_counter()
            conns[k].request("POST", route, body=body, headers={"Content-Type": kind})
            r = conns[k].getresponse()
            r.read()
            total, t_done = (time.perf_counter() - t0) * 1e3, time.time()
            assert r.status == 200, (k, r.status)
            if i < 20:
                continue
            hop = {"total": total}
            timing = r.getheader("server-timing")
            if timing:
                parts = dict(p.strip().split(";", 1) for p in timing.split(","))
                spans = {n: float(parts[n].split("=")[1]) for n in SPANS}
                at = float(parts["at"].split("=")[1])
                hop.update(
                    spans,
                    before=(at - t_wall) * 1e3,
                    after=(t_done - at) * 1e3 - sum(spans.values()),
                )
            got[k].append(hop)
    server.terminate()
    engine = Engine(path, "pyforge", args.max_batch_size)
    direct = direct_p50(engine, [("x", ("batch", 256), np.dtype(np.float32))], 1, runs=500)
    for name in models:
        serve.delete(f"id-{name}")
    serve.delete("raynoop")
    cols = ("total", "before", *SPANS, "after")
    rows = []
    for k, hs in got.items():
        med = {c: np.median([h[c] for h in hs]) if c in hs[0] else None for c in cols}
        cells = [f"{med[c]:.2f}" if med[c] is not None else "" for c in cols]
        rows.append(
            f"| {k} | {len(hs)} | "
            + " | ".join(cells)
            + f" | {np.percentile([h['total'] for h in hs], 99):.2f} |"
        )
        print(rows[-1], flush=True)
    notes = [
        f"identity model direct `predict` (pyforge, batch 1, in the harness process) p50 {direct:.3f} ms"
    ]
    print(notes[-1], flush=True)
    return rows, notes


def generate_bench(args, port: int) -> list[str]:
    """``POST /generate`` of ``args.generate`` (a GGUF) beside a direct ``TextGenerator`` in this
    process, alternating request by request (greedy, ``--gen-tokens`` each, seeded prompts): time
    to the first token and per later token, both medians, and the requests whose tokens differ."""
    import http.client
    import json

    from ray import serve

    from pyforge.serve.deployment import ServeConfig
    from pyforge.serve.generation import open_generator, start_generator

    config = ServeConfig(target="cpu", cpus_per_replica=0.5, max_context=512)
    start_generator(
        args.generate, config, host="127.0.0.1", port=port, name="gen", route_prefix="/gen"
    )
    direct = open_generator(args.generate, config)
    rng = np.random.default_rng(5)
    words = ["hello", "world", "the", "at", "a", "tag", "red", "door"]
    got: dict[str, list] = {"served": [], "direct": []}
    wrong, inside = 0, []  # inside: the replica's own decode ms per token
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    for i in range(args.gen_requests + 2):  # two warm-up rounds
        prompt = " ".join(rng.choice(words, 6))
        t0, times = time.perf_counter(), []
        body = json.dumps({"prompt": prompt, "max_new_tokens": args.gen_tokens})
        conn.request("POST", "/gen/generate", body=body)
        r = conn.getresponse()
        lines = []
        while line := r.readline():
            times.append(time.perf_counter())
            lines.append(json.loads(line))
        direct.reset()
        t1, dtimes = time.perf_counter(), []
        tokens = [
            t
            for t in direct.stream(prompt, args.gen_tokens)
            if not dtimes.append(time.perf_counter())
        ]
        wrong += tokens != lines[-1]["tokens"]
        if i >= 2:
            inside.append(lines[-1]["decode_ms_per_token"])
            for k, (start, ts) in {"served": (t0, times[:-1]), "direct": (t1, dtimes)}.items():
                got[k].append(
                    ((ts[0] - start) * 1e3, np.diff(ts).mean() * 1e3 if len(ts) > 1 else np.nan)
                )
    serve.delete("gen")
    notes = []
    for k, v in got.items():
        first, per = np.median([a for a, _ in v]), np.nanmedian([b for _, b in v])
        notes.append(
            f"/generate {k}: {len(v)} requests of {args.gen_tokens} tokens, first token {first:.1f} ms, then {per:.2f} ms per token (medians)"
        )
        print(notes[-1], flush=True)
    notes.append(
        f"/generate: the replica's own decode, its last line: {np.median(inside):.2f} ms/token"
    )
    print(notes[-1], flush=True)
    notes.append(
        f"/generate: {wrong} of {args.gen_requests + 2} requests with tokens other than the direct generate's"
    )
    print(notes[-1], flush=True)
    return notes


def _status(port: int, route: str, body: bytes, kind: str) -> int:
    import http.client

    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("POST", route, body=body, headers={"Content-Type": kind})
        return conn.getresponse().status
    except OSError:
        return -1


HOPS_HEADER = (
    "| endpoint (concurrency 1, alternating) | requests | p50 ms | before the replica | read | decode | "
    "queue | model | reply | encode | after the replica | p99 ms |\n|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def direct_p50(engine, specs, seq: int, runs: int = 200) -> float:
    feeds = [make_input(specs, 10**9 + i, seq) for i in range(runs)]
    times = []
    for f in feeds:
        t0 = time.perf_counter()
        engine.predict(f)
        times.append(time.perf_counter() - t0)
    return float(np.median(times) * 1e3)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="mlp,resnet50,minilm")
    ap.add_argument("--backends", default="pyforge,ort")
    ap.add_argument("--concurrency", default="1,8,16,32,64")
    ap.add_argument("--rates", default="0.25,0.5,0.8", help="fractions of pyforge's best req/s")
    ap.add_argument("--seconds", type=float, default=10.0, help="at most this long per level")
    ap.add_argument("--requests", type=int, default=2000, help="at most this many per level")
    ap.add_argument("--clients", type=int, default=2, help="client processes")
    ap.add_argument("--max-batch-size", type=int, default=32)
    ap.add_argument("--batch-wait-ms", type=float, default=0.0)
    ap.add_argument("--variants", default="", help="ServeConfig overrides, ';' between variants "
                    "('fill_wait_ms=0;fill_wait_ms=2,inline_ms=1'): each backend once per "
                    "variant, alternating within a level")  # fmt: skip
    ap.add_argument(
        "--generate", metavar="MODEL.gguf", help="also: /generate beside a direct generate"
    )
    ap.add_argument("--gen-requests", type=int, default=10)
    ap.add_argument("--gen-tokens", type=int, default=32)
    ap.add_argument("--access-log", action="store_true", help="Serve's log line per request")
    ap.add_argument("--hops", type=int, default=0, help="first: this many requests per endpoint "
                    "at concurrency 1, where each no-op request's time goes (see hops())")  # fmt: skip
    ap.add_argument("--direct", action="store_true", help="each replica serves HTTP itself "
                    "(pyforge serve --direct), no Ray proxy; the ceiling: an identity model so")  # fmt: skip
    ap.add_argument("--seq", type=int, default=32, help="sequence length of text models")
    ap.add_argument("--md", help="append the table to this markdown file")
    args = ap.parse_args(argv)

    from ray import serve

    from pyforge.serve.deployment import ServeConfig, init_ray, start, stop
    from pyforge.serve.engine import Engine

    levels = [int(c) for c in args.concurrency.split(",") if c]
    sweep = Sweep(args)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    notes, hop_rows = [], []
    try:
        init_ray(num_cpus=8)
        logs = {"enable_access_log": args.access_log}  # the proxy's
        serve.start(http_options={"host": "127.0.0.1", "port": port}, logging_config=logs)
        serve.run(noop_deployment().bind(), name="noop", route_prefix="/noop")
        if args.hops:
            hop_rows, hop_notes = hops(args, port)
            notes += hop_notes
        if args.generate:
            notes += generate_bench(args, port)
        specs = [("x", ("batch", 256), np.dtype(np.float32))]
        if args.direct:  # the ceiling of that path: an identity model, its replica serving HTTP
            ceiling = free_port()
            config = ServeConfig(max_batch_size=args.max_batch_size, cpus_per_replica=0.5,
                                 max_queued=4096, direct=True)  # fmt: skip
            start(identity_path(), config, port=ceiling, name="id-direct", route_prefix="/idd")
            engine = Engine(identity_path(), "pyforge", args.max_batch_size)
            for c in levels:
                sweep.level(f"http://127.0.0.1:{ceiling}/predict", specs, engine,
                            "identity model, direct (no-op ceiling)", concurrency=c)  # fmt: skip
            serve.delete("id-direct")
        else:
            for c in levels:
                sweep.level(f"{base}/noop", specs, None, "no-op (client ceiling)", concurrency=c)
        for name in filter(None, args.models.split(",")):
            path = model_path(name)
            engines, config, urls, apps = {}, {}, {}, []
            variants = args.variants.split(";")
            for backend, variant in ((b, v) for b in args.backends.split(",") for v in variants):
                extra = {
                    k: int(v) if v.isdigit() else float(v)
                    for k, v in (kv.split("=") for kv in filter(None, variant.split(",")))
                }
                fields = dict(backend=backend, max_batch_size=args.max_batch_size,
                              batch_wait_ms=args.batch_wait_ms, max_queued=4096, cpus_per_replica=0.5, warm_length=args.seq, access_log=args.access_log, direct=args.direct)  # fmt: skip
                config = ServeConfig(**{**fields, **extra})
                at = free_port() if args.direct else port  # direct: each its own port
                key = backend if len(variants) == 1 else f"{backend} {variant or 'defaults'}"
                route = backend if len(variants) == 1 else f"{backend}-v{variants.index(variant)}"
                start(
                    path,
                    config,
                    host="127.0.0.1",
                    port=at,
                    name=f"{name}-{route}",
                    route_prefix=f"/{route}",
                )
                apps.append(f"{name}-{route}")
                urls[key] = f"http://127.0.0.1:{at}" + ("" if args.direct else f"/{route}")
                engines[key] = Engine(path, backend, args.max_batch_size)
            specs = [(s.name, s.dims, s.dtype) for s in next(iter(engines.values())).specs]
            for backend, engine in engines.items():
                notes.append(
                    f"{name} direct predict ({backend}, batch 1) p50 {direct_p50(engine, specs, args.seq):.3f} ms"
                )
                print(notes[-1], flush=True)
            best = {}
            for c in levels:
                order = list(engines) if c % 2 == 0 else list(engines)[::-1]
                for backend in order:
                    row = sweep.level(
                        f"{urls[backend]}/predict", specs, engines[backend], f"{name} {backend}", c
                    )
                    best[backend] = max(best.get(backend, 0.0), row["rps"])
            peak = best.get("pyforge", max(best.values()))
            for frac in [float(f) for f in args.rates.split(",") if f]:
                for backend, engine in engines.items():
                    sweep.level(
                        f"{urls[backend]}/predict",
                        specs,
                        engine,
                        f"{name} {backend}",
                        rate=frac * peak,
                    )
            for app in apps:
                serve.delete(app)
    finally:
        sweep.pool.terminate()
        stop()
        if args.md and (
            sweep.rows or hop_rows or notes
        ):  # what was measured, also when a level failed
            _append(args, notes, sweep.rows, hop_rows)
    return 0


def _append(args, notes: list[str], rows: list[dict], hop_rows: list[str]) -> None:
    import ray

    import pyforge

    load = os.getloadavg()
    text = [
        "",
        (
            f"Run of {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC on {platform.node()} "
            f"({os.cpu_count()} cores, load average {load[0]:.1f} at the end: shared with other sessions), "
            f"pyforge {pyforge.__version__}, Ray {ray.__version__}, one replica per backend, max batch "
            f"{args.max_batch_size}, batch wait {args.batch_wait_ms} ms, variants {args.variants or 'none'}, {args.clients} client processes, "
            f"{'direct ingress (no proxy)' if args.direct else 'through the proxy'}, "
            f"at most {args.seconds:.0f} s or {args.requests} requests per level, text models at seq {args.seq}:"
        ),
        "",
        "    python benchmarks/serve_sweep.py " + " ".join(sys.argv[1:]),
        "",
        *([HOPS_HEADER, *hop_rows, ""] if hop_rows else []),
        *([HEADER, *(_fmt(r) for r in rows), ""] if rows else []),
        *(f"- {n}" for n in notes),
        "",
    ]
    with open(args.md, "a") as f:
        f.write("\n".join(text))


if __name__ == "__main__":
    sys.exit(main())
