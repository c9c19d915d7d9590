"""A decoder behind Ray Serve: ``POST /generate`` streams tokens as newline-delimited JSON.

    POST /generate  {"prompt": str or [ids], "max_new_tokens": n, "do_sample": bool,
                     "temperature": t, "top_k": k, "top_p": p, "seed": s, "stop": [str]}
      -> one line per token  {"token": id, "text": new text, for display (a half character
                              waits for the rest; the last line's text is the whole)}
         then a last line    {"done": true, "stop_reason": ..., "tokens": [...], "text": ...,
                              "prompt_tokens": n, "queue_ms": ..., "prefill_ms": ...,
                              "decode_ms_per_token": ..., "total_ms": ...}
    GET  /healthz, /metrics as for /predict

One ``TextGenerator`` per replica; requests wait their turn (one generation at a time in its
cache, which is reset for each, so an answer does not depend on the request before it). Bad
options get 400 with pyforge's error text before anything streams.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict

from ray import serve
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse

from .. import errors
from .deployment import ModelServer, _error, _Metrics, run_app
from .direct import DirectServer
from .engine import ServeConfig

NDJSON = "application/x-ndjson"


def open_generator(model: str, config: ServeConfig):
    """A ``TextGenerator`` for a GGUF file or an ONNX decoder (``config.tokenizer``: a GGUF
    whose vocabulary it uses, for str prompts)."""
    import pyforge

    kw = {"target": config.target, "max_context": config.max_context}
    if model.lower().endswith(".gguf"):
        return pyforge.TextGenerator.from_gguf(model, **kw)
    tok = None
    if config.tokenizer:
        from ..generate.tokenizer import from_gguf

        tok = from_gguf(config.tokenizer)
    return pyforge.TextGenerator.from_onnx(model, tok, **kw)


def parse_request(body: bytes) -> tuple:
    """(prompt, max_new_tokens, sampling keywords) of a /generate body, or an ``InputError``."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise errors.InputError(f"body is not JSON: {e}") from None
    if not isinstance(data, dict) or "prompt" not in data:
        raise errors.InputError('JSON body must be {"prompt": str or [ids], "max_new_tokens": n}')
    prompt = data.pop("prompt")
    return prompt, data.pop("max_new_tokens", 32), data


class GeneratorServer:
    """One replica: a text generator, its queue and the HTTP routes."""

    def __init__(self, model: str, config: dict, ingress: tuple[str, int] | None = None):
        self.config = ServeConfig(**config)
        self.gen = open_generator(model, self.config)
        self.gen.generate([0], max_new_tokens=2)  # build the first prefill and decode plans
        self.gen.reset()
        self.metrics = _Metrics()
        self._turn = asyncio.Lock()
        self._thread = ThreadPoolExecutor(1)  # every step on one thread, one at a time
        access_log = self.config.access_log
        self._direct = DirectServer(self.__call__, *ingress, access_log) if ingress else None

    __del__ = ModelServer.__del__

    async def __call__(self, request: Request) -> Response:
        path = request.url.path.rstrip("/").rsplit("/", 1)[-1]
        if path == "healthz":
            return PlainTextResponse("ok")
        if path == "metrics":
            return Response(self.metrics.text(), media_type="text/plain; version=0.0.4")
        if path != "generate" or request.method != "POST":
            return _error(404, f"no route {request.method} {request.url.path!r}: POST /generate")
        t0 = time.perf_counter()
        try:
            prompt, n, sampling = parse_request(await request.body())
            tokens = self.gen.stream(prompt, n, **sampling)  # checks everything, runs nothing
        except (errors.PyforgeError, TypeError) as e:  # TypeError: a keyword of the wrong kind
            self.metrics.requests.labels("400").inc()
            return _error(400, str(e), type(e).__name__)
        self.metrics.requests.labels("200").inc()
        return StreamingResponse(self._lines(tokens, t0), media_type=NDJSON)

    async def _lines(self, tokens, t0: float):
        loop, came, stop = asyncio.get_running_loop(), asyncio.Queue(), threading.Event()

        def produce() -> None:  # the whole generation on the model's thread, never waiting on
            try:  # the stream: tokens that come faster than it sends go out as one chunk
                self.gen.reset()
                for token in tokens:
                    loop.call_soon_threadsafe(came.put_nowait, token)
                    if stop.is_set():  # the client went away
                        break
            finally:
                loop.call_soon_threadsafe(came.put_nowait, None)

        self.metrics.queue.inc()
        try:
            async with self._turn:
                queued = time.perf_counter()
                running = loop.run_in_executor(self._thread, produce)
                ids, shown, done = [], "", False
                while not done:
                    got = [await came.get()]
                    while not came.empty():
                        got.append(came.get_nowait())
                    done = got[-1] is None
                    chunk = []
                    for token in got[:-1] if done else got:
                        ids.append(token)
                        text = self.gen.tokenizer.decode(ids) if self.gen.tokenizer else ""
                        whole = text.startswith(shown) and not text.endswith("\ufffd")
                        piece = text[len(shown) :] if whole else ""  # else wait: half a character
                        shown += piece
                        chunk.append(json.dumps({"token": token, "text": piece}) + "\n")
                    if chunk:
                        yield "".join(chunk)
                await running  # its error, if it had one
                r = self.gen.last
            total = time.perf_counter() - t0
            yield json.dumps({
                "done": True, "stop_reason": r.stop_reason, "tokens": r.tokens, "text": r.text,
                "prompt_tokens": r.prompt_tokens, "queue_ms": (queued - t0) * 1e3,
                "prefill_ms": r.prefill_ms, "decode_ms_per_token": r.decode_ms_per_token,
                "total_ms": total * 1e3,
            }) + "\n"  # fmt: skip
            self.metrics.latency.observe(total)
        except errors.PyforgeError as e:  # after the 200: the last line says what went wrong
            yield json.dumps({"error": str(e), "type": type(e).__name__}) + "\n"
        finally:
            stop.set()
            self.metrics.queue.dec()


def start_generator(
    model: str,
    config: ServeConfig | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    name: str = "generate",
    route_prefix: str = "/",
    num_cpus: int | None = None,
    **fields,
):
    """Start Ray here (unless up), Serve on ``host:port`` and the decoder's deployment; returns
    its handle (``direct=True``: the replicas answer on ``host:port``). Stop with
    ``deployment.stop()``."""
    c = config or ServeConfig(**fields)
    app = serve.deployment(GeneratorServer, name=name).options(
        num_replicas=c.replicas,
        ray_actor_options={"num_cpus": c.cpus_per_replica, "num_gpus": c.gpus_per_replica},
        max_ongoing_requests=8,  # one generating, the rest waiting their turn in the replica
        max_queued_requests=c.max_queued,
        graceful_shutdown_timeout_s=60,
        health_check_period_s=2,
        logging_config=c.logging(),
    )
    ingress = (host, port) if c.direct else None
    bound = app.bind(os.path.abspath(model), asdict(c), ingress)
    return run_app(bound, c, host, port, name, route_prefix, num_cpus)
