"""Who may call the service: API keys, refusing to be exposed without them, TLS, and a hostile-input
suite, each against a real ``bentoml serve`` on loopback (keys on and off)."""

from __future__ import annotations

import http.client
import json
import re
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from han import SavedModel
from service.api import MAX_BODY_BYTES, MAX_DOCUMENTS, without_paths
from service.auth import ApiKeyGuard, KeysError, bound_host, exposure_problem, load_keys
from service.process import free_port, stop_process_group, wait_ready
from service.settings import Settings
from tests.service_server import REPO, ServiceServer, base_env, register_model, shared_server, tiny_model_dir_quickly

pytestmark = pytest.mark.slow

KEYS = ["key-one-0123456789abcdef", "key-two-fedcba9876543210"]
PRIVATE = "/home/ana/private/reviews-2026.csv"  # a path of the training machine, in the model's metadata
DOCUMENT = "A wonderful film. The acting was superb."
MONITOR_KEY = "monitor-only-key-0123456789"  # the keyed server's third key, limited to the monitor


# -- units: where the keys come from, when exposure is refused, what GET /model hides ---------------

def test_keys_come_from_a_file_or_the_variable_and_bad_ones_are_named(tmp_path: Path) -> None:
    (path := tmp_path / "keys").write_text(f"# rotated monthly\n{KEYS[0]}\n\n  {KEYS[1]}  \n")
    both = {"HAN_API_KEYS_FILE": str(path), "HAN_API_KEYS": "ignored-when-a-file-is-given"}
    assert load_keys(Settings.read(both)) == [k.encode() for k in KEYS]
    assert load_keys(Settings.read({"HAN_API_KEYS": f"{KEYS[0]}, {KEYS[1]}"})) == [k.encode() for k in KEYS]
    assert load_keys(Settings.read({})) == []
    with pytest.raises(KeysError, match=r"HAN_API_KEYS_FILE=.*missing: cannot read the keys"):
        load_keys(Settings(keys_file=str(tmp_path / "missing")))
    (empty := tmp_path / "empty").write_text("# nothing yet\n")
    with pytest.raises(KeysError, match="holds no key"):
        load_keys(Settings(keys_file=str(empty)))
    for bad in ("short", "has a space in it here", "clé-non-ascii-0123456789"):
        with pytest.raises(KeysError, match="at least 16 printable ASCII characters"):
            load_keys(Settings.read({"HAN_API_KEYS": bad}))


def test_exposure_without_keys_is_refused_unless_anonymous_is_asked_for() -> None:
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        assert exposure_problem(host, [], False) is None
    problem = exposure_problem("0.0.0.0", [], False)
    assert problem and "HAN_API_KEYS_FILE" in problem and "--allow-anonymous" in problem
    assert exposure_problem("0.0.0.0", [b"k" * 16], False) is None
    assert exposure_problem("192.168.1.5", [], True) is None
    assert bound_host(["bentoml", "serve", "x", "--host", "0.0.0.0"], Settings()) == "0.0.0.0"
    assert bound_host(["bentoml", "serve", "--host=::"], Settings()) == "::"
    assert bound_host(["bentoml", "serve", "x"], Settings.read({"BENTOML_HOST": "10.0.0.1"})) == "10.0.0.1"
    assert bound_host(["bentoml", "serve", "x"], Settings.read({})) == "127.0.0.1"


def test_model_information_keeps_file_names_but_not_the_machines_paths() -> None:
    meta = {"train_data": PRIVATE, "config": {"data": {"train": "data/mine.jsonl", "cache_dir": "C:\\Users\\ana\\c"}},
            "advice": "stop at 1/16 of it", "source": "https://example.org/a/b", "epochs": 3}
    assert without_paths(meta) == {"train_data": "reviews-2026.csv", "config": {"data": {"train": "mine.jsonl",
                                   "cache_dir": "c"}}, "advice": "stop at 1/16 of it",
                                   "source": "https://example.org/a/b", "epochs": 3}


def test_metrics_can_be_opened_alone_for_a_scraper() -> None:
    async def ok(_: object) -> PlainTextResponse:
        return PlainTextResponse("ok")

    app = Starlette(routes=[Route(p, ok) for p in ("/metrics", "/model", "/livez")])
    for open_metrics, expected in ((False, 401), (True, 200)):
        client = TestClient(ApiKeyGuard(app, Settings(keys=KEYS[0], metrics_open=open_metrics)))
        assert client.get("/metrics").status_code == expected
        assert client.get("/model").status_code == 401 and client.get("/livez").status_code == 200
        assert client.get("/model", headers={"Authorization": f"Bearer {KEYS[0]}"}).status_code == 200
        assert client.get("/model", headers={"Authorization": f"Basic {KEYS[0]}"}).status_code == 401


# -- a real server with keys ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def keyed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> ServiceServer:
    """The tiny model, its metadata naming a private path, served with two keys from a file and every
    request logged (so that the log can be searched for the keys)."""
    tmp = tmp_path_factory.mktemp("keyed")
    saved = SavedModel.load(tiny_model_dir_quickly(request))
    saved.metadata.update(train_data=PRIVATE, config={"data": {"train": PRIVATE}})
    (keys := tmp / "keys").write_text(KEYS_TEXT)
    server = ServiceServer.start(saved.save(tmp / "model"), env={"HAN_API_KEYS_FILE": str(keys), "HAN_ACCESS_LOG": "1"})
    server.extra["keys_file"] = keys
    request.addfinalizer(server.stop)
    return server


KEYS_TEXT = "\n".join(KEYS) + f"\n{MONITOR_KEY} monitor\n"


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}


def test_a_request_without_the_key_gets_401_and_either_key_works(keyed: ServiceServer) -> None:
    body = json.dumps({"documents": [DOCUMENT]}).encode()
    for headers, challenge in (({"Content-Type": "application/json"}, 'Bearer realm="han"'),
                               (auth("not-a-key-0123456789"), 'Bearer realm="han", error="invalid_token"'),
                               (auth(KEYS[0] + "x"), 'Bearer realm="han", error="invalid_token"')):
        status, response_headers, raw = keyed.request("POST", "/classify", body, headers)
        assert status == 401 and response_headers["www-authenticate"] == challenge
        assert "API key" in json.loads(raw)["error"]
    for key in KEYS:  # two keys at once: one can be rotated while the other works
        status, _, raw = keyed.request("POST", "/classify", body, auth(key))
        assert status == 200 and json.loads(raw)["results"][0]["label"] in ("neg", "pos")
    for path, status in (("/model", 401), ("/metrics", 401), ("/livez", 200), ("/readyz", 200), ("/", 200),
                         ("/static_content/swagger-ui-bundle.js", 200),  # /docs's scripts: no key from a browser
                         ("/static_content/../model", 401)):
        assert keyed.request("GET", path)[0] == status, path
    assert keyed.request("GET", "/metrics", headers=auth(KEYS[1]))[0] == 200
    assert "Traceback" not in keyed.log()
    assert not any(key in keyed.log() for key in KEYS)  # never logged, even with the access log on


def test_a_key_limited_to_classifying_cannot_write_feedback(keyed: ServiceServer) -> None:
    """A key handed to a client app (``KEY classify``) classifies; /feedback, /monitor and /metrics refuse it
    with a 403 naming its scope, while a key without scopes reaches them."""
    limited = "client-app-key-0123456789abcdef"
    keys_file = keyed.extra["keys_file"]
    keys_file.write_text("\n".join(KEYS) + f"\n{limited} classify\n")
    try:
        body = json.dumps({"documents": [DOCUMENT]}).encode()
        deadline = time.monotonic() + 10
        while keyed.request("POST", "/classify", body, auth(limited))[0] != 200 and time.monotonic() < deadline:
            time.sleep(0.2)  # the keys file is read again within a second
        time.sleep(1.5)  # ... by each worker: one that read it less than a second ago reads it at its next request
        for _ in range(4):
            keyed.request("POST", "/classify", body, auth(limited))
        assert keyed.request("POST", "/classify", body, auth(limited))[0] == 200
        assert keyed.request("GET", "/model", headers=auth(limited))[0] == 200
        feedback = json.dumps({"feedback": [{"id": "no-such-id", "label": "pos"}]}).encode()
        status, _, raw = keyed.request("POST", "/feedback", feedback, auth(limited))
        assert status == 403 and "limited to: classify" in json.loads(raw)["error"]
        for path in ("/monitor", "/metrics"):
            assert keyed.request("GET", path, headers=auth(limited))[0] == 403, path
        status, _, raw = keyed.request("POST", "/feedback", feedback, auth(KEYS[0]))  # all scopes: reaches the store
        assert status == 404 and json.loads(raw)["unknown"] == ["no-such-id"]
        assert keyed.request("GET", "/monitor", headers=auth(KEYS[0]))[0] == 200
    finally:
        keys_file.write_text(KEYS_TEXT)
    with pytest.raises(KeysError, match="unknown scope 'admin'"):
        load_keys(Settings.read({"HAN_API_KEYS": f"{KEYS[0]} admin"}))


def test_get_model_shows_no_path_of_the_training_machine(keyed: ServiceServer) -> None:
    status, _, raw = keyed.request("GET", "/model", headers=auth(KEYS[0]))
    assert status == 200
    assert "/home/ana" not in raw.decode() and "reviews-2026.csv" in raw.decode()


def test_exposed_without_keys_the_service_refuses_to_start_in_one_line(request: pytest.FixtureRequest,
                                                                        tmp_path: Path) -> None:
    register_model(tiny_model_dir_quickly(request), tmp_path / "bentoml")  # BentoML finds the model first
    env = {k: v for k, v in base_env(tmp_path / "bentoml").items() if not k.startswith("HAN_API_KEYS")}
    for command in ([sys.executable, "-m", "service.run", "--host", "0.0.0.0", "--port", str(free_port())],
                    [sys.executable, "-m", "bentoml", "serve", "service.service:HANClassifier", "--host", "0.0.0.0",
                     "--port", str(free_port())]):
        done = subprocess.run(command, cwd=REPO, env={**env, "HAN_MODEL_TAG": "han-test:latest"},
                              capture_output=True, text=True, timeout=120)
        assert done.returncode != 0
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: --host 0.0.0.0 exposes the service"), done.stderr
        assert "HAN_API_KEYS_FILE" in lines[0] and "--allow-anonymous" in lines[0]


# -- TLS ----------------------------------------------------------------------------------------------

def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for localhost and 127.0.0.1 and its key, made with openssl as CI does."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    return cert, key


def test_tls_with_a_checked_chain_exposed_anonymously_on_purpose(request: pytest.FixtureRequest,
                                                                  tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    home = tmp_path / "bentoml"
    register_model(tiny_model_dir_quickly(request), home)
    port = free_port()
    log = (tmp_path / "server.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "service.run", "--host", "0.0.0.0", "--port", str(port), "--tag", "han-test:latest",
         "--allow-anonymous", "--ssl-certfile", str(cert), "--ssl-keyfile", str(key)],
        cwd=REPO, env=base_env(home), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        context = ssl.create_default_context(cafile=str(cert))  # the chain and the host name are checked
        ready = wait_ready(f"https://127.0.0.1:{port}", process, 120, context=context)
        assert ready, (tmp_path / "server.log").read_text()
        connection = http.client.HTTPSConnection("localhost", port, context=context, timeout=60)
        connection.request("POST", "/classify", json.dumps({"documents": [DOCUMENT]}),
                           {"Content-Type": "application/json"})
        response = connection.getresponse()
        assert response.status == 200 and json.loads(response.read())["results"][0]["label"] in ("neg", "pos")
        with pytest.raises(ssl.SSLCertVerificationError):  # a client that trusts only the system's CAs refuses it
            http.client.HTTPSConnection("localhost", port, context=ssl.create_default_context(), timeout=10).request(
                "GET", "/livez")
    finally:
        stop_process_group(process)
        log.close()
    output = (tmp_path / "server.log").read_text(errors="replace")
    assert "without API keys: anyone who can reach it may call it" in output


# -- the hostile suite, keys on and off -----------------------------------------------------------------

@pytest.fixture(params=["keys on", "keys off"])
def target(request: pytest.FixtureRequest) -> tuple[ServiceServer, dict[str, str]]:
    if request.param == "keys on":
        return request.getfixturevalue("keyed"), {"Authorization": f"Bearer {KEYS[0]}"}
    return shared_server(request.config, tiny_model_dir_quickly(request)), {}


def raw_exchange(server: ServiceServer, data: bytes, pause: float = 0.0, pieces: int = 1) -> bytes:
    """Send raw bytes (in ``pieces`` with ``pause`` seconds between them) and read the whole answer."""
    parts = urlsplit(server.url)
    with socket.create_connection((parts.hostname, parts.port), timeout=60) as s:
        step = -(-len(data) // pieces)
        for i in range(0, len(data), step):
            try:
                s.sendall(data[i:i + step])
            except (BrokenPipeError, ConnectionResetError):
                break  # the server refused early (a 4xx) and closed: its answer is waiting to be read
            time.sleep(pause)
        answer = b""
        try:
            while chunk := s.recv(65536):
                answer += chunk
        except ConnectionResetError:
            pass  # the server answered and closed while our bytes were still arriving
    return answer


def status_of(answer: bytes) -> int:
    match = re.match(rb"HTTP/1\.1 (\d{3}) ", answer)
    assert match, f"no HTTP answer (the connection was dropped): {answer[:200]!r}"
    return int(match.group(1))


def http_request(path: str, headers: dict[str, str], body: bytes = b"", extra: bytes = b"") -> bytes:
    lines = [f"{'POST' if body else 'GET'} {path} HTTP/1.1", "Host: 127.0.0.1", "Connection: close",
             *(f"{k}: {v}" for k, v in headers.items())]
    if body:
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return "\r\n".join(lines).encode() + b"\r\n" + extra + b"\r\n" + body


def worker_rss_mb(server: ServiceServer) -> list[float]:
    """Resident memory of each of the server's worker processes."""
    out = subprocess.run(["ps", "-eo", "ppid,rss,args"], capture_output=True, text=True, check=True).stdout
    return [int(line.split()[1]) / 1024 for line in out.splitlines()
            if line.split()[0] == str(server.process.pid) and "_bentoml_impl.worker" in line]


def test_hostile_requests_get_a_4xx_or_a_200_and_memory_stays_bounded(target) -> None:
    server, key = target
    body = json.dumps({"documents": [DOCUMENT]}).encode()
    before = worker_rss_mb(server)
    cases = {
        # (raw request, the statuses that are right)
        "a 100 KB header": (http_request("/classify", key, body, b"X-Padding: " + b"a" * 100_000 + b"\r\n"), {200}),
        "5,000 headers": (http_request("/classify", key, body, b"".join(b"X-%d: y\r\n" % i for i in range(5000))),
                          {200}),
        "a header line without a colon": (http_request("/classify", key, body, b"NoColonHere\r\n"), {400}),
        "a 1 MB Authorization header": (
            http_request("/classify", {}, body, b"Authorization: Bearer " + b"k" * 2**20 + b"\r\n"), {400, 431}),
        "a non-ASCII key": (http_request("/classify", {}, body, b"Authorization: Bearer \xff\xfecl\xc3\xa9\r\n"),
                            {401} if key else {200}),
        "deep JSON": (http_request("/classify", key, b'{"documents": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
                      {400}),
        "a lone surrogate": (http_request("/classify", key, b'{"documents": ["bad \\udc00 text"]}'), {200}),
        "NUL characters": (http_request("/classify", key, json.dumps({"documents": ["A good\u0000 film.\u0000"]})
                                        .encode()), {200}),
    }
    for name, (data, right) in cases.items():
        answer = raw_exchange(server, data)
        assert answer, f"{name}: the connection was dropped with no answer"
        assert status_of(answer) in right, name
    # A slow body: 20 pieces a tenth of a second apart.
    assert status_of(raw_exchange(server, http_request("/classify", key, body), pause=0.1, pieces=20)) == 200
    # A body over the limit, sent without a Content-Length.
    parts = urlsplit(server.url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    try:
        connection.request("POST", "/classify", body=(b"x" * 2**20 for _ in range(12)), encode_chunked=True,
                           headers={"Content-Type": "application/json", **key})
        assert connection.getresponse().status == 413
    except (BrokenPipeError, ConnectionResetError):
        pass  # answered and closed while we were still sending: also a refusal
    finally:
        connection.close()
    # The largest request the API accepts, with every explanation method (keys or none: the same path past
    # the check, so the costly methods run once, with keys on).
    longest = ("A wonderful film, truly. " * 2000)[: (MAX_BODY_BYTES - 4096) // MAX_DOCUMENTS]
    methods = ("attention", "attention_gradient", "integrated_gradients", "occlusion", False) if key else ("attention",)
    for method in methods:
        status, _, raw = server.request("POST", "/classify", json.dumps(
            {"documents": [longest] * MAX_DOCUMENTS, "explain": method}).encode(),
            {"Content-Type": "application/json", **key}, timeout=300)
        assert status == 200 and len(json.loads(raw)["results"]) == MAX_DOCUMENTS, method
    assert "Traceback" not in server.log()
    # Bounded memory: each worker within 150 MB of what it held before the suite (tiny model; the IMDB
    # model's figures after a soak are in BENCHMARKS.md).
    time.sleep(2)
    after = worker_rss_mb(server)
    assert len(after) == len(before) >= 1
    assert max(a - b for a, b in zip(after, before, strict=True)) < 150, (before, after)


def test_the_page_asks_for_the_key_and_keeps_it_in_the_tab(keyed: ServiceServer, page) -> None:
    page.goto(keyed.url + "/")
    page.wait_for_selector("#key-card:not([hidden])")
    page.fill("#api-key", "not-the-key-0123456789")
    page.click("#key-form button")
    page.wait_for_function("document.getElementById('key-status').textContent.includes('not accepted')")
    page.fill("#api-key", KEYS[1])
    page.click("#key-form button")
    page.wait_for_function("document.getElementById('model-info').dataset.tag")
    assert page.is_hidden("#key-card")
    assert page.evaluate("sessionStorage.getItem('han-api-key')") == KEYS[1]
    assert page.evaluate("localStorage.length") == 0  # only the tab keeps it
    page.fill("#document", DOCUMENT)
    page.click("#classify")
    page.wait_for_function("document.body.dataset.state")
    assert page.evaluate("document.body.dataset.state") == "done"


def test_the_page_asks_again_for_a_key_it_may_not_use_or_cannot_send(keyed: ServiceServer, page) -> None:
    """The dashboard and the classify page share the tab's key. One limited to the monitor, entered on the
    dashboard (Enter submits), is refused on the classify page with a 403, which shows the key form with
    the reason; a key a header cannot carry (an en dash pasted with it) is refused as it is entered; once a
    usable key is in, the refused classification runs again by itself, and the model's JSON opens with it."""
    page.goto(keyed.url + "/dashboard")
    page.wait_for_function("document.body.dataset.state")
    page.fill("#key", MONITOR_KEY)
    page.evaluate("document.body.dataset.state = ''")
    page.press("#key", "Enter")
    page.wait_for_function("document.body.dataset.state === 'done'")
    page.goto(keyed.url + "/")
    page.wait_for_selector("#key-card:not([hidden])")
    assert "limited to: monitor" in page.inner_text("#key-status")
    page.fill("#document", DOCUMENT)
    page.click("#classify")
    page.wait_for_function("document.body.dataset.state === 'error'")
    assert page.is_visible("#key-card") and page.is_hidden("#result")
    page.fill("#api-key", "key\u2013with-an-en-dash-0123456789")
    page.click("#key-form button")
    assert "cannot send" in page.inner_text("#key-status")
    assert page.evaluate("sessionStorage.getItem('han-api-key')") == MONITOR_KEY
    page.fill("#api-key", KEYS[0])
    page.click("#key-form button")
    page.wait_for_function("document.body.dataset.state === 'done'")
    assert page.is_hidden("#key-card") and page.inner_text("#label") and page.inner_text("#error") == ""
    with page.context.expect_page() as opened:
        page.click("#model-json")
    model = opened.value
    model.wait_for_load_state()
    assert json.loads(model.inner_text("body"))["tag"] == page.get_attribute("#model-info", "data-tag")
    model.close()


def test_a_key_rotates_in_the_keys_file_without_a_restart(keyed: ServiceServer) -> None:
    """The file is read again when it changes: the new key works and the removed one is refused within
    5 s, in every worker, while the key kept in the file is never refused; a file left empty mid-rotation
    changes nothing. Every worker follows with no request sent to it: one the kernel handed no connection
    while the file held the rotation, then finding it empty, kept the revoked key (seen once)."""
    keys_file, new = keyed.extra["keys_file"], "rotated-key-" + "k" * 24
    body = json.dumps({"documents": [DOCUMENT], "explain": False}).encode()
    pid = keyed.process.pid
    try:
        logged = len(keyed.log())
        keys_file.write_text(f"{new}\n{KEYS[1]}\n")  # KEYS[0] rotated out, KEYS[1] kept
        written, followed = time.monotonic(), set()
        while len(followed) < 2 and time.monotonic() - written < 5:  # no request sent meanwhile
            time.sleep(0.2)
            read_again = r"HANClassifier:(\d+)\] API keys read again from \S+: 2 key"
            followed = set(re.findall(read_again, keyed.log()[logged:]))
        assert len(followed) == 2, f"workers that read the rotated file within 5 s: {sorted(followed)}"
        streak, streak_began = 0, None
        while streak < 8:  # eight rounds in a row, over fresh connections: both workers have followed
            assert time.monotonic() - written < 30, "the rotation never took hold in every worker"
            began = time.monotonic()
            new_ok = keyed.request("POST", "/classify", body, auth(new))[0] == 200
            old_refused = keyed.request("POST", "/classify", body, auth(KEYS[0]))[0] == 401
            assert keyed.request("POST", "/classify", body, auth(KEYS[1]))[0] == 200  # never refused
            if new_ok and old_refused:
                streak, streak_began = streak + 1, streak_began if streak else began
            else:
                streak = 0
        assert streak_began - written < 5, f"in force {streak_began - written:.1f} s after the file changed"
        keys_file.write_text("")  # a rotation caught half-way: the keys read before stay
        time.sleep(2.5)
        assert keyed.request("POST", "/classify", body, auth(new))[0] == 200
        assert "the keys read before stay in use" in keyed.log()
        assert keyed.process.poll() is None and keyed.process.pid == pid  # no restart
    finally:
        keys_file.write_text(KEYS_TEXT)
        time.sleep(1.5)
