"""Keep-alive connections end after a drawn number of requests, so that a client pool spreads over
the service's workers (service.connections)."""

from __future__ import annotations

import http.client
import json
import random
import subprocess
import sys
from urllib.parse import urlsplit

import pytest

from service.connections import TRACKED, SpreadConnections
from service.process import free_port
from service.settings import Settings
from tests.asgi_calls import call, run_async, scripted_app
from tests.service_server import REPO, ServiceServer, base_env, shared_server, tiny_model_dir_quickly


def ends(middleware: SpreadConnections, clients: list[tuple[str, int]]) -> list[bool]:
    """For a request from each client in turn: whether its response ended the connection."""
    async def go() -> list[bool]:
        out = []
        for client in clients:
            start, body = await call(middleware, client=client)
            assert start["status"] == 200 and body["body"] == b"ok"
            out.append((b"connection", b"close") in start["headers"])
        return out

    return run_async(go())


def test_a_connection_ends_after_the_number_of_requests_drawn_for_it():
    draws = random.Random(7)
    middleware = SpreadConnections(scripted_app(), requests=4, rng=random.Random(7))
    closed = ends(middleware, [("10.0.0.1", 5000)] * 60)
    lengths, run = [], 0
    for end in closed:
        run += 1
        if end:
            lengths.append(run)
            run = 0
    # each connection (the same client port once the last one ended) draws 1 to 2 x 4 - 1 requests
    assert lengths == [draws.randint(1, 7) for _ in lengths]
    assert len(lengths) >= 60 // 7


def test_connections_are_counted_apart_and_other_traffic_passes_untouched():
    middleware = SpreadConnections(scripted_app(), requests=3, rng=random.Random(0))
    a, b = ("10.0.0.1", 5000), ("10.0.0.2", 5000)
    c = ("10.0.0.1", 5001)  # another connection of a's host: counted apart from a's too
    order = random.Random(1)
    clients = [order.choice([a, b, c]) for _ in range(60)]
    closed = ends(middleware, clients)
    # Each connection, when first seen (and again once its last one ended), draws its own 1 to 2 x 3 - 1
    # requests from the one generator; its responses end it after exactly that many of its own requests,
    # whatever the others send between them.
    draws, left, expected = random.Random(0), {}, []
    for client in clients:
        if client not in left:
            left[client] = draws.randint(1, 5)
        left[client] -= 1
        expected.append(left[client] == 0)
        if left[client] == 0:
            del left[client]
    assert closed == expected
    assert all(sum(end for k, end in zip(clients, closed, strict=True) if k == client) >= 2 for client in (a, b, c))
    never = SpreadConnections(scripted_app(), requests=0)
    assert not any(ends(never, [a] * 50))
    start, _ = run_async(call(middleware, client=None))  # a Unix socket: no client address
    assert (b"connection", b"close") not in start["headers"]


def test_the_setting_is_a_whole_number_or_a_clear_error():
    assert Settings.read({}).requests_per_connection == 32
    assert Settings.read({"HAN_REQUESTS_PER_CONNECTION": " 0 "}).requests_per_connection == 0
    with pytest.raises(ValueError, match="HAN_REQUESTS_PER_CONNECTION must be a whole number.*'ten'"):
        Settings.read({"HAN_REQUESTS_PER_CONNECTION": "ten"})


def test_the_connections_remembered_are_bounded():
    middleware = SpreadConnections(scripted_app(), requests=1000)
    ends(middleware, [("10.0.0.1", port) for port in range(TRACKED + 100)])
    assert len(middleware._left) == TRACKED


@pytest.mark.slow
def test_the_service_ends_a_keep_alive_connection_after_some_requests(request):
    """Through a real server: within 2 x the mean - 1 requests a response says
    Connection: close and the server closes the connection; the client reconnects and goes on."""
    server: ServiceServer = shared_server(request.config, tiny_model_dir_quickly(request))
    url = urlsplit(server.url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    body = json.dumps({"documents": ["A fine film."], "explain": False})
    since, longest, ended = 0, 0, 0
    mean = Settings.read().requests_per_connection  # what the server read from the same environment
    for _ in range(2 * mean):
        connection.request("POST", "/classify", body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        assert response.status == 200, response.read()
        assert json.loads(response.read())["results"][0]["label"]
        since += 1
        if response.getheader("Connection") == "close":
            assert connection.sock is None  # http.client closed it, as the header asks
            ended, longest, since = ended + 1, max(longest, since), 0
    connection.close()
    assert ended >= 1 and longest <= 2 * mean - 1


@pytest.mark.slow
@pytest.mark.parametrize(("name", "value", "error"), [
    ("HAN_REQUESTS_PER_CONNECTION", "ten",
     "HAN_REQUESTS_PER_CONNECTION must be a whole number of requests (0: never end a connection), not 'ten'"),
    ("HAN_BATCH_WAIT_MS", "0.5", "HAN_BATCH_WAIT_MS must be a whole number of milliseconds (0: never wait), not '0.5'"),
    ("HAN_WORKERS", "0", "HAN_WORKERS must be a whole number of processes (at least 1), not '0'"),
])
def test_a_bad_setting_stops_the_service_in_one_line(tmp_path, name, value, error):
    env = {**base_env(tmp_path / "bentoml"), "HAN_MODEL_TAG": "han-test:latest", name: value}
    command = [sys.executable, "-m", "bentoml", "serve", "service.service:HANClassifier", "--port", str(free_port())]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines == [f"error: {error}"], done.stderr
