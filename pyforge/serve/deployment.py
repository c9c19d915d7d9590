"""A model behind Ray Serve: ``ModelServer`` (one replica: an ``Engine`` and the dynamic
batcher) and ``start`` (Ray on this machine, Serve on loopback, the deployment running).

    POST /predict  {"inputs": {name: nested list}}  -> {"outputs": {name: nested list}}
                   application/x-npy (one input) or x-npz (several) -> the same format back
    GET  /healthz  -> "ok" once the replica's plans are built
    GET  /metrics  -> this replica's Prometheus text: requests, batch sizes, latency, queue depth

Through Ray's HTTP proxy by default; ``direct=True`` has each replica serve ``host:port``
itself (``direct.py``) and starts no proxy.

>>> app = start("mlp_dynamic.onnx", backend="pyforge", port=8000, max_batch_size=32)
>>> # curl -s localhost:8000/predict -d '{"inputs": {"x": [[...256 floats...]]}}'
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import time
from dataclasses import asdict

import numpy as np
from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from .. import errors
from .direct import DirectServer
from .engine import Engine, ServeConfig, example_inputs

NPY, NPZ = "application/x-npy", "application/x-npz"


class _Metrics:
    """Per-replica Prometheus metrics in their own registry (served at /metrics)."""

    def __init__(self) -> None:
        import prometheus_client as pc

        self.registry = pc.CollectorRegistry()
        self.requests = pc.Counter(
            "pyforge_requests", "requests by status", ["status"], registry=self.registry
        )
        self.batch = pc.Histogram(
            "pyforge_batch_size",
            "requests per batch",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128),
            registry=self.registry,
        )
        self.latency = pc.Histogram(
            "pyforge_latency_seconds",
            "time in the replica, parse to reply",
            buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5),
            registry=self.registry,
        )
        self.queue = pc.Gauge(
            "pyforge_queue_depth", "requests in this replica", registry=self.registry
        )
        self.padded = pc.Counter(
            "pyforge_padded_rows", "rows run as padding to a plan size", registry=self.registry
        )
        pc.ProcessCollector(registry=self.registry)  # the replica's cpu seconds and memory

    def text(self) -> bytes:
        import prometheus_client as pc

        return pc.generate_latest(self.registry)


class ModelServer:
    """One replica: the model, its dynamic batcher and the HTTP routes.

    The batcher: requests that arrive while the model runs queue; when it frees, all of them
    (up to the largest plan) run as the next batch. A lone request on an idle replica runs at
    once, so batches grow with the load instead of waiting on a timer (``batch_wait_ms`` adds a
    wait before a batch that is not full). Under load (the last batch, just ended, held several
    requests) the next waits up to ``fill_wait_ms`` for as many: its clients' next requests,
    which a closed loop sends only once their answers are out. Ray's ``serve.batch`` forms each batch when its timer
    ends, model busy or not: a 10 ms wait on every lone request, and under load many small
    batches queued behind the running one."""

    def __init__(self, model: str, config: dict, ingress: tuple[str, int] | None = None):
        self.config = ServeConfig(**config)
        c = self.config
        self.engine = Engine(model, c.backend, c.max_batch_size, c.target, c.threads)
        self.engine.warm_up(example_inputs(self.engine, free=c.warm_length))
        self.metrics = _Metrics()
        self._pending: list[tuple[dict, asyncio.Future]] = []
        self._busy = False
        self._last = (0, 0.0)  # the last batch's size and when it ended
        self._row_s = float("inf")  # the last batch's run time per row: on a thread till known
        self._filled: tuple[int, asyncio.Event] | None = None  # the fill wait's target
        self._in_replica = 0
        self._direct = DirectServer(self.__call__, *ingress, c.access_log) if ingress else None

    def __del__(self):
        """Ray calls this at shutdown and awaits what it returns: the direct server's drain."""
        if getattr(self, "_direct", None) is not None:
            direct, self._direct = self._direct, None
            return direct.close()

    async def _batched(self, request: dict) -> tuple[dict, tuple]:
        """``request``'s outputs and (batch start, end, size) of the batch it ran in."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._pending.append((request, future))
        if self._filled and len(self._pending) >= self._filled[0]:
            self._filled[1].set()
        if not self._busy:
            self._busy = True
            self._drainer = loop.create_task(self._drain())  # held: a task is weakly referenced
        return await future

    async def _drain(self) -> None:
        loop, top = asyncio.get_running_loop(), self.engine.sizes[-1]
        try:
            while self._pending:
                await self._fill(top)
                batch = [(r, f) for r, f in self._pending[:top] if not f.done()]  # not cancelled
                del self._pending[:top]
                if not batch:
                    continue
                self.metrics.batch.observe(len(batch))
                padded, t0 = self.engine.padded_rows, time.perf_counter()
                try:
                    outs = await self._run_batch(loop, [r for r, _ in batch])
                except Exception as e:  # noqa: BLE001  (each request of the batch hears it)
                    for _, f in batch:
                        f.done() or f.set_exception(e)
                    continue
                self.metrics.padded.inc(self.engine.padded_rows - padded)
                timing = (t0, time.perf_counter(), len(batch))
                for (_, f), out in zip(batch, outs):
                    f.done() or f.set_result((out, timing))
                self._last = (len(batch), time.perf_counter())
        finally:
            self._busy = False

    async def _run_batch(self, loop, requests: list[dict]) -> list[dict]:
        """On a worker thread, so the loop takes requests meanwhile; on the loop itself when the
        last batch's time per row says this one takes under ``inline_ms``: a thread's turn at the
        GIL can cost a switch interval (5 ms) while the loop parses requests, 30x a small batch."""
        rows = sum(len(next(iter(r.values()))) for r in requests)

        def run() -> list[dict]:
            t0 = time.perf_counter()
            outs = self.engine.batch_predict(requests)
            self._row_s = (time.perf_counter() - t0) / max(rows, 1)
            return outs

        if self._row_s * rows * 1e3 < self.config.inline_ms:
            return run()
        return await loop.run_in_executor(None, run)

    async def _fill(self, top: int) -> None:
        """The wait before a batch: ``batch_wait_ms`` when set, else the fill wait under load."""
        c = self.config
        if c.batch_wait_ms:
            if len(self._pending) < top:
                await asyncio.sleep(c.batch_wait_ms / 1000)
            return
        want, ended = min(self._last[0], top), self._last[1]
        recent = time.perf_counter() - ended < 10 * c.fill_wait_ms / 1000
        if want < 2 or len(self._pending) >= want or not recent:
            return
        self._filled = (want, asyncio.Event())
        try:
            await asyncio.wait_for(self._filled[1].wait(), c.fill_wait_ms / 1000)
        except TimeoutError:
            pass
        finally:
            self._filled = None

    async def predict(self, inputs) -> dict:
        """One request through the batcher (for ``DeploymentHandle`` callers)."""
        return (await self._batched(self.engine.check(inputs)))[0]

    async def batch_predict(self, requests: list) -> list[dict]:
        """Several requests at once, batched together, past the batcher."""
        checked = [self.engine.check(r) for r in requests]
        return await asyncio.get_running_loop().run_in_executor(
            None, self.engine.batch_predict, checked
        )

    async def __call__(self, request: Request) -> Response:
        path = request.url.path.rstrip("/").rsplit("/", 1)[-1]
        if path == "healthz":
            return PlainTextResponse("ok")
        if path == "metrics":
            return Response(self.metrics.text(), media_type="text/plain; version=0.0.4")
        if path != "predict":
            return _error(
                404, f"no route {request.url.path!r}: POST /predict, GET /healthz, /metrics"
            )
        if request.method != "POST":
            return _error(405, "/predict takes POST")
        if self._direct and self._in_replica >= self.config.max_queued:  # Ray's bound is not
            self.metrics.requests.labels("503").inc()  # in front of the direct path: this is
            return _error(503, f"{self._in_replica} requests in this replica: over max_queued")
        t0 = time.perf_counter()
        self.metrics.queue.inc()
        self._in_replica += 1
        try:
            response = await self._predict_http(request)
        finally:
            self._in_replica -= 1
            self.metrics.queue.dec()
        self.metrics.requests.labels(str(response.status_code)).inc()
        self.metrics.latency.observe(time.perf_counter() - t0)
        return response

    async def _predict_http(self, request: Request) -> Response:
        limit = self.config.max_body_bytes
        if int(request.headers.get("content-length") or 0) > limit:
            return _error(413, f"body over the limit of {limit:,} bytes")
        at, t0 = time.time(), time.perf_counter()
        body = await request.body()
        if len(body) > limit:
            return _error(413, f"body over the limit of {limit:,} bytes")
        kind = request.headers.get("content-type", "application/json").split(";")[0].strip()
        t1 = time.perf_counter()
        try:
            inputs, cast = _decode(kind, body, self.engine.input_names)
            checked = self.engine.check(inputs, cast=cast)
            t2 = time.perf_counter()
            outputs, (b0, b1, n) = await self._batched(checked)
        except errors.PyforgeError as e:
            return _error(400, str(e), type(e).__name__)
        t3 = time.perf_counter()
        response = _encode(kind, outputs)
        # where a request's time went, in ms: the sweep's --hops reads it; "at" is the wall
        # clock at arrival, so a client on this machine can tell the hops before and after
        spans = {"read": t1 - t0, "decode": t2 - t1, "queue": b0 - t2, "model": b1 - b0,
                 "reply": t3 - b1, "encode": time.perf_counter() - t3}  # fmt: skip
        timing = [f"{k};dur={v * 1e3:.3f}" for k, v in spans.items()]
        response.headers["server-timing"] = ", ".join(
            [*timing, f"batch;desc={n}", f"at;desc={at:.6f}"]
        )
        return response


def _decode(kind: str, body: bytes, names: list[str]) -> tuple[dict, bool]:
    """The request's inputs (a dict name -> value) and whether to cast them (JSON lists)."""
    if kind in ("application/json", ""):
        try:
            data = json.loads(body)
        except (ValueError, UnicodeDecodeError) as e:
            raise errors.InputError(f"body is not JSON: {e}") from None
        if not isinstance(data, dict) or not isinstance(data.get("inputs"), dict):
            raise errors.InputError('JSON body must be {"inputs": {name: nested list}}')
        return data["inputs"], True
    if kind not in (NPY, NPZ):
        raise errors.InputError(f"content type {kind!r}: send application/json, {NPY} or {NPZ}")
    try:
        loaded = np.load(io.BytesIO(body), allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise errors.InputError(f"body is not a {kind} file: {e}") from None
    if kind == NPY:
        if not isinstance(loaded, np.ndarray):
            raise errors.InputError(f"{NPY} body holds no single array")
        if len(names) != 1:
            raise errors.InputError(f"model takes inputs {names}: send them as {NPZ}")
        return {names[0]: loaded}, False
    if not hasattr(loaded, "files"):
        raise errors.InputError(f"{NPZ} body is not an .npz archive")
    return {k: loaded[k] for k in loaded.files}, False


def _encode(kind: str, outputs: dict) -> Response:
    if kind in (NPY, NPZ):
        buf = io.BytesIO()
        if kind == NPY and len(outputs) == 1:
            np.save(buf, next(iter(outputs.values())))
        else:
            np.savez(buf, **outputs)
            kind = NPZ
        return Response(buf.getvalue(), media_type=kind)
    # json.dumps, not JSONResponse: an output may hold NaN or Inf, which Python's JSON writes
    body = json.dumps({"outputs": {k: v.tolist() for k, v in outputs.items()}})
    return Response(body, media_type="application/json")


def _error(status: int, message: str, kind: str = "RequestError") -> JSONResponse:
    return JSONResponse({"error": message, "type": kind}, status_code=status)


def deployment(config: ServeConfig, name: str = "pyforge"):
    """The Serve deployment of ``ModelServer`` with this config's replicas and bounds."""
    c = config
    return serve.deployment(ModelServer, name=name).options(
        num_replicas=c.replicas,
        ray_actor_options={"num_cpus": c.cpus_per_replica, "num_gpus": c.gpus_per_replica},
        max_ongoing_requests=2 * c.max_batch_size,
        max_queued_requests=c.max_queued,
        graceful_shutdown_timeout_s=10,
        graceful_shutdown_wait_loop_s=0.5,
        health_check_period_s=2,
        logging_config=c.logging(),
    )


def start(
    model: str,
    config: ServeConfig | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    name: str = "pyforge",
    route_prefix: str = "/",
    num_cpus: int | None = None,
    **fields,
):
    """Start Ray here (unless connected), Serve on ``host:port`` and the model's deployment;
    returns its ``DeploymentHandle``. Stop with ``stop()``. With ``direct=True`` the replicas
    answer on ``host:port`` themselves (Serve's proxy is not started, if this starts Serve)."""
    config = config or ServeConfig(**fields)
    ingress = (host, port) if config.direct else None
    app = deployment(config, name).bind(os.path.abspath(model), asdict(config), ingress)
    return run_app(app, config, host, port, name, route_prefix, num_cpus)


def run_app(app, config: ServeConfig, host, port, name, route_prefix, num_cpus):
    """Check ``config``, start Ray and Serve (its proxy on ``host:port``, none for a direct
    config) and run the bound application ``app``; returns its handle."""
    config.check()
    init_ray(num_cpus)
    proxy = {"proxy_location": "Disabled"} if config.direct else {}
    serve.start(http_options={"host": host, "port": port}, logging_config=config.logging(), **proxy)
    return serve.run(app, name=name, route_prefix=route_prefix)


def init_ray(num_cpus: int | None = None) -> None:
    """Ray on this machine (unless already up), its replicas importing pyforge from where this
    process found it."""
    import ray

    if ray.is_initialized():
        return
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    paths = [root, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    ray.init(
        num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, configure_logging=False
    )


def stop() -> None:
    """Delete every application first (its replicas finish what they hold while the proxy still
    answers: ``serve.shutdown`` alone drops requests in flight), then shut Serve and Ray down."""
    import ray

    if ray.is_initialized():
        for name in list(serve.status().applications):
            serve.delete(name)
        serve.shutdown()
        ray.shutdown()
