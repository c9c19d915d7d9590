"""A real Ray Serve on 127.0.0.1: the HTTP API in JSON, .npy and .npz, bad requests refused with
pyforge's error text, bounded queues answering 503, and a replica killed under load."""

from __future__ import annotations

import io
import json
import socket
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from pyforge.serve.engine import Engine, example_inputs
from tests.helpers import ATOL, RTOL

from .common import free_port, mlp_path, npy, pair_path, post

pytest.importorskip("ray.serve")
MAIN = {
    "replicas": 2,
    "max_batch_size": 8,
    "batch_wait_ms": 5,
    "max_body_bytes": 1 << 20,
    "cpus_per_replica": 0.5,
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from pyforge.serve import deployment

    d = tmp_path_factory.mktemp("serve_http")
    paths = {"mlp": mlp_path(d), "pair": pair_path(d)}
    port = free_port()
    start = lambda path, name, route, **kw: deployment.start(
        path, host="127.0.0.1", port=port, name=name, route_prefix=route, num_cpus=8, **kw
    )
    try:
        start(paths["mlp"], "main", "/", **MAIN)
        start(paths["pair"], "pair", "/pair", backend="ort", max_batch_size=4, cpus_per_replica=0.5)
        # one replica, batches of 1, one queued request: 2,048-row requests run ~2,048 plans each
        start(paths["mlp"], "overload", "/overload", backend="ort", max_batch_size=1, max_queued=1,
              cpus_per_replica=0.5)  # fmt: skip
        # two replicas serving one port themselves, no proxy (the proxy above stays up)
        ingress = free_port()
        deployment.start(paths["mlp"], host="127.0.0.1", port=ingress, name="ingress",
                         route_prefix="/ingress", direct=True, replicas=2, max_batch_size=8,
                         cpus_per_replica=0.5)  # fmt: skip
        yield {"url": f"http://127.0.0.1:{port}", "paths": paths,
               "ingress": f"http://127.0.0.1:{ingress}"}  # fmt: skip
    finally:
        deployment.stop()


@pytest.fixture(scope="module")
def direct(server):
    """Direct predict on the same backends, for every answer to be checked against."""
    return {
        "mlp": Engine(server["paths"]["mlp"], "pyforge", 8),
        "pair": Engine(server["paths"]["pair"], "ort", 4),
    }


def check_concurrent_npy(url: str, mlp, inputs: list) -> None:
    """POST every input as .npy at once, one thread each; every answer is a direct predict's."""
    answers: list = [None] * len(inputs)

    def send(i: int) -> None:
        answers[i] = post(url + "/predict", npy(inputs[i]), "application/x-npy")

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    for x, (status, body) in zip(inputs, answers):
        assert status == 200, body
        np.testing.assert_allclose(
            np.load(io.BytesIO(body)), mlp.predict({"x": x})["y"], rtol=RTOL, atol=ATOL
        )


def test_json_npy_npz_answers_equal_direct_predict(server, direct):
    mlp, url = direct["mlp"], server["url"]
    x = example_inputs(mlp, seed=11, rows=3)["x"]
    want = mlp.predict({"x": x})["y"]
    status, body = post(url + "/predict", json.dumps({"inputs": {"x": x.tolist()}}).encode())
    assert status == 200
    np.testing.assert_allclose(
        np.array(json.loads(body)["outputs"]["y"], np.float32), want, rtol=RTOL, atol=ATOL
    )
    status, body = post(url + "/predict", npy(x), "application/x-npy")
    assert status == 200
    np.testing.assert_allclose(np.load(io.BytesIO(body)), want, rtol=RTOL, atol=ATOL)
    feeds = example_inputs(direct["pair"], seed=12, rows=2)
    buf = io.BytesIO()
    np.savez(buf, **feeds)
    status, body = post(url + "/pair/predict", buf.getvalue(), "application/x-npz")
    assert status == 200
    got = np.load(io.BytesIO(body))
    for name, ref in direct["pair"].predict(feeds).items():
        np.testing.assert_allclose(got[name], ref, rtol=RTOL, atol=ATOL)


def test_direct_ingress_answers_equal_direct_predict(server, direct):
    mlp, url = direct["mlp"], server["ingress"]
    assert post(url + "/healthz", b"")[1] == b"ok"
    x = example_inputs(mlp, seed=31, rows=2)["x"]
    want = mlp.predict({"x": x})["y"]
    status, body = post(url + "/predict", json.dumps({"inputs": {"x": x.tolist()}}).encode())
    assert status == 200
    np.testing.assert_allclose(
        np.array(json.loads(body)["outputs"]["y"], np.float32), want, rtol=RTOL, atol=ATOL
    )
    # concurrent connections, spread by the kernel over both replicas, each batched and right
    inputs = [example_inputs(mlp, seed=200 + i, rows=1 + i % 3)["x"] for i in range(32)]
    check_concurrent_npy(url, mlp, inputs)
    status, body = post(url + "/predict", npy(np.ones((1, 3), np.float32)), "application/x-npy")
    assert status == 400 and "dim 1 must be 256" in json.loads(body)["error"]
    from ray import serve  # the handle still reaches the direct replicas

    got = serve.get_app_handle("ingress").predict.remote({"x": x}).result(timeout_s=60)
    np.testing.assert_allclose(got["y"], want, rtol=RTOL, atol=ATOL)


def test_direct_ingress_refuses_a_port_in_use():
    from pyforge import errors
    from pyforge.serve.direct import listen

    with socket.socket() as taken:  # bound without SO_REUSEPORT: no one may share it
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(errors.OptionError, match="cannot listen on 127.0.0.1"):
            listen("127.0.0.1", taken.getsockname()[1])


def test_handle_predict_and_batch_predict(server, direct):
    from ray import serve

    mlp, handle = direct["mlp"], serve.get_app_handle("main")
    xs = [example_inputs(mlp, seed=s, rows=r)["x"] for s, r in ((21, 1), (22, 3))]
    got = handle.predict.remote({"x": xs[0]}).result(timeout_s=60)
    np.testing.assert_allclose(got["y"], mlp.predict({"x": xs[0]})["y"], rtol=RTOL, atol=ATOL)
    got = handle.batch_predict.remote([{"x": x} for x in xs]).result(timeout_s=60)
    for x, out in zip(xs, got):
        np.testing.assert_allclose(out["y"], mlp.predict({"x": x})["y"], rtol=RTOL, atol=ATOL)


def test_concurrent_requests_are_batched_and_right(server, direct):
    mlp, url = direct["mlp"], server["url"]
    inputs = [example_inputs(mlp, seed=100 + i, rows=1 + i % 2)["x"] for i in range(48)]
    check_concurrent_npy(url, mlp, inputs)
    metrics = "".join(
        urllib.request.urlopen(url + "/metrics", timeout=30).read().decode() for _ in range(4)
    )
    assert "pyforge_batch_size_bucket" in metrics and "pyforge_latency_seconds_count" in metrics


@pytest.mark.parametrize(
    ("body", "kind", "status", "words"),
    [
        (b"{not json", "application/json", 400, "body is not JSON"),
        (b'{"x": [1]}', "application/json", 400, '{"inputs"'),
        (
            json.dumps({"inputs": {"x": [[1.0, 2.0]]}}).encode(),
            "application/json",
            400,
            "dim 1 must be 256",
        ),
        (
            json.dumps({"inputs": {"y": [[1.0] * 256]}}).encode(),
            "application/json",
            400,
            "missing ['x']",
        ),
        (
            npy(np.ones((2, 256), np.float64)),
            "application/x-npy",
            400,
            "dtype float64, expected float32",
        ),
        (b"\x93NUMPY garbage", "application/x-npy", 400, "not a application/x-npy file"),
        (b"abc", "text/plain", 400, "content type 'text/plain'"),
        (npy(np.ones((1100, 256), np.float32)), "application/x-npy", 413, "over the limit"),
    ],
)
def test_bad_requests_get_4xx_with_the_error_text(server, body, kind, status, words):
    got, text = post(server["url"] + "/predict", body, kind)
    assert got == status, text
    assert words in json.loads(text)["error"]


def test_nan_in_and_out_of_json(server, direct):
    x = np.full((1, 256), 0.5, np.float32)
    x[0, 0] = np.nan
    status, body = post(
        server["url"] + "/predict", json.dumps({"inputs": {"x": x.tolist()}}).encode()
    )
    assert status == 200, body
    got = np.array(json.loads(body)["outputs"]["y"], np.float32)
    want = direct["mlp"].predict({"x": x})["y"]
    assert np.isnan(want).any()
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)  # NaN where the direct one has NaN


def test_healthz_and_unknown_route(server):
    assert urllib.request.urlopen(server["url"] + "/healthz", timeout=30).read() == b"ok"
    status, text = post(server["url"] + "/nowhere", b"{}")
    assert status == 404 and "POST /predict" in json.loads(text)["error"]


REFUSED = 0  # a request whose upload the server cut off (see send)


def test_overload_answers_503_not_an_unbounded_queue(server, direct):
    x = example_inputs(direct["mlp"], seed=5, rows=2048)["x"]
    want = direct["mlp"].predict({"x": x})["y"]
    answers: list = []

    def send() -> None:
        try:  # a request kept queued past its timeout is an answer too: the assertion names it
            answers.append(post(server["url"] + "/overload/predict", npy(x), "application/x-npy",
                                timeout=240))  # fmt: skip
        except OSError as e:
            # the proxy may answer 503 and close before it has read this 2 MB body: the client
            # then sees its upload cut (a broken pipe or reset), a refusal it cannot read
            cut = isinstance(getattr(e, "reason", e), (BrokenPipeError, ConnectionResetError))
            answers.append((REFUSED if cut else -1, repr(e).encode()))

    threads = [threading.Thread(target=send) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    statuses = sorted(s for s, _ in answers)
    errors = [body for s, body in answers if s == -1]  # a timeout's or other error's text
    assert len(answers) == 12 and set(statuses) <= {200, 503, REFUSED}, (statuses, errors)
    # at most 2 running + 1 queued at a time: the rest refused
    assert statuses.count(503) + statuses.count(REFUSED) >= 6, statuses
    for status, body in answers:
        if status == 200:
            np.testing.assert_allclose(np.load(io.BytesIO(body)), want, rtol=RTOL, atol=ATOL)


def test_replica_killed_under_load(server, direct):
    import ray
    from ray import serve

    mlp, url = direct["mlp"], server["url"]
    results: list = []
    stop = threading.Event()

    def load(worker: int) -> None:
        for i in range(10_000):
            if stop.is_set():
                return
            x = example_inputs(mlp, seed=worker * 10_000 + i)["x"]
            t0 = time.perf_counter()
            try:
                status, body = post(url + "/predict", npy(x), "application/x-npy", timeout=30)
            except (urllib.error.URLError, OSError) as e:  # refused or reset: an error, not a hang
                status, body = -1, repr(e).encode()
            results.append((x, status, body, time.perf_counter() - t0))

    threads = [threading.Thread(target=load, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    time.sleep(2)
    replicas = [
        a
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["name"].startswith("SERVE_REPLICA::main#")
    ]
    assert len(replicas) == 2
    ray.kill(
        ray.get_actor(replicas[0]["name"], namespace=replicas[0]["namespace"]), no_restart=True
    )
    time.sleep(6)
    stop.set()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a request hung"
    ok = [(x, body) for x, status, body, _ in results if status == 200]
    failed = [(status, body[:200]) for _, status, body, _ in results if status != 200]
    assert len(ok) > 20
    assert all(s in (-1, 500, 502, 503) for s, _ in failed), failed
    for x, body in ok:
        np.testing.assert_allclose(
            np.load(io.BytesIO(body)), mlp.predict({"x": x})["y"], rtol=RTOL, atol=ATOL
        )
    deadline = time.monotonic() + 120  # Serve replaces the replica
    while time.monotonic() < deadline:
        app = serve.status().applications["main"]
        running = app.deployments["main"].replica_states.get("RUNNING", 0)
        if app.status == "RUNNING" and running == 2:
            break
        time.sleep(1)
    assert running == 2
    print(
        f"replica kill: {len(ok)} answered right, {len(failed)} failed: {sorted({s for s, _ in failed})}"
    )
