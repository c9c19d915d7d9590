"""The replica's batcher without a server: a lone request runs at once, the requests that arrive
while the model runs form the next batch (up to the largest plan), every answer is its own
request's, an error in a batch reaches each of its requests, and /predict's answer says where
its time went (Server-Timing)."""

from __future__ import annotations

import asyncio
import io
import time

import numpy as np
import pytest

from pyforge import errors
from pyforge.serve.engine import example_inputs
from tests.helpers import ATOL, RTOL

from .common import mlp_path, npy

pytest.importorskip("ray.serve")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from pyforge.serve.deployment import ModelServer

    path = mlp_path(tmp_path_factory.mktemp("batcher"))
    return ModelServer(path, {"backend": "ort", "max_batch_size": 4, "cpus_per_replica": 0.5})


def test_batches_form_from_what_queues_while_the_model_runs(server, monkeypatch):
    sizes: list[int] = []
    run = server.engine.batch_predict

    def slow(requests):
        sizes.append(len(requests))
        time.sleep(0.2)  # the model busy: what arrives meanwhile waits for the next batch
        return run(requests)

    monkeypatch.setattr(server.engine, "batch_predict", slow)
    xs = [example_inputs(server.engine, seed=40 + i, rows=1 + i % 3)["x"] for i in range(7)]

    async def drive():
        first = asyncio.create_task(server._batched({"x": xs[0]}))
        await asyncio.sleep(0.05)  # the first batch (of one) is running
        rest = [server._batched({"x": x}) for x in xs[1:]]
        return [await first, *await asyncio.gather(*rest)]

    answers = asyncio.run(drive())
    assert sizes == [1, 4, 2]  # then the six queued: the largest plan (4), then the other 2
    assert [n for _, (_, _, n) in answers] == [1, 4, 4, 4, 4, 2, 2]
    for x, (out, _) in zip(xs, answers):
        want = server.engine.predict({"x": x})["y"]
        np.testing.assert_allclose(out["y"], want, rtol=RTOL, atol=ATOL)


def test_an_error_in_a_batch_reaches_each_request(server, monkeypatch):
    def broken(requests):
        raise errors.InputError("the model refused the batch")

    monkeypatch.setattr(server.engine, "batch_predict", broken)
    x = example_inputs(server.engine, seed=9)["x"]

    async def drive():
        calls = [server._batched({"x": x}) for _ in range(3)]
        return await asyncio.gather(*calls, return_exceptions=True)

    got = asyncio.run(drive())
    assert len(got) == 3 and all(isinstance(e, errors.InputError) for e in got)
    assert not server._busy and not server._pending


def test_predict_route_answers_with_where_its_time_went(server):
    from starlette.requests import Request

    x = example_inputs(server.engine, seed=17, rows=2)["x"]
    body = npy(x)
    headers = [(b"content-type", b"application/x-npy"), (b"content-length", b"%d" % len(body))]
    scope = {"type": "http", "method": "POST", "path": "/predict", "headers": headers,
             "query_string": b"", "scheme": "http", "server": ("127.0.0.1", 80)}  # fmt: skip

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    response = asyncio.run(server(Request(scope, receive)))
    assert response.status_code == 200
    got = np.load(io.BytesIO(response.body))
    np.testing.assert_allclose(got, server.engine.predict({"x": x})["y"], rtol=RTOL, atol=ATOL)
    spans = dict(p.strip().split(";", 1) for p in response.headers["server-timing"].split(","))
    assert set(spans) == {"read", "decode", "queue", "model", "reply", "encode", "batch", "at"}
    assert all(float(spans[k].split("=")[1]) >= 0 for k in ("read", "decode", "model", "encode"))
    assert spans["batch"] == "desc=1" and abs(float(spans["at"][5:]) - time.time()) < 60


def test_under_load_the_next_batch_waits_to_fill(tmp_path):
    from pyforge.serve.deployment import ModelServer

    # a fill wait far longer than this test's gaps, so a loaded machine cannot split the batch
    config = {"backend": "ort", "max_batch_size": 4, "fill_wait_ms": 5000, "cpus_per_replica": 0.5}
    server = ModelServer(mlp_path(tmp_path), config)
    sizes: list[int] = []
    run = server.engine.batch_predict
    server.engine.batch_predict = lambda requests: sizes.append(len(requests)) or run(requests)
    xs = [example_inputs(server.engine, seed=60 + i)["x"] for i in range(6)]

    async def drive():
        first = await asyncio.gather(*(server._batched({"x": x}) for x in xs[:3]))
        later = []
        for x in xs[3:]:  # the closed loop's clients coming back one by one
            later.append(asyncio.create_task(server._batched({"x": x})))
            await asyncio.sleep(0.05)
        return [*first, *await asyncio.gather(*later)]

    answers = asyncio.run(drive())
    assert sizes == [3, 3]  # without the fill wait: [3, 1, 2] or [3, 1, 1, 1]
    for x, (out, _) in zip(xs, answers):
        want = server.engine.predict({"x": x})["y"]
        np.testing.assert_allclose(out["y"], want, rtol=RTOL, atol=ATOL)


def test_a_fast_model_runs_on_the_loop_after_its_first_batch(tmp_path):
    import threading

    from pyforge.serve.deployment import ModelServer

    config = {"backend": "ort", "max_batch_size": 4, "inline_ms": 1e6, "cpus_per_replica": 0.5}
    server = ModelServer(mlp_path(tmp_path), config)
    threads: list[int] = []
    run = server.engine.batch_predict
    server.engine.batch_predict = lambda rs: threads.append(threading.get_ident()) or run(rs)
    x = example_inputs(server.engine, seed=70)["x"]

    async def drive():
        return [await server._batched({"x": x}) for _ in range(3)]

    answers = asyncio.run(drive())
    main = threading.get_ident()  # the loop's: asyncio.run runs it on this thread
    assert threads[0] != main and threads[1:] == [main, main]  # unknown cost first: a thread
    for out, _ in answers:
        np.testing.assert_allclose(
            out["y"], server.engine.predict({"x": x})["y"], rtol=RTOL, atol=ATOL
        )
