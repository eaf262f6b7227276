"""The HTTP service, against a real ``bentoml serve`` of the tiny model on a loopback port.

One server for the whole session (see tests/service_server.py); no mocks.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

import pytest

import han
from han.methods import METHODS
from service.api import HAS_WORDS, MAX_DOCUMENTS, ClassifyResponse, ModelInfo
from tests.service_server import ServiceServer, shared_server, tiny_model_dir_quickly
from tests.tiny_model import read_jsonl

pytestmark = pytest.mark.slow

REVIEWS = [row["text"] for row in read_jsonl("reviews.jsonl")]


@pytest.fixture(scope="session")
def server(request: pytest.FixtureRequest) -> ServiceServer:
    return shared_server(request.config, tiny_model_dir_quickly(request))


@pytest.fixture(scope="session")
def predictor(request: pytest.FixtureRequest) -> han.Pipeline:
    """The same model in-process: what the service must agree with."""
    return han.Pipeline(han.SavedModel.load(tiny_model_dir_quickly(request)))


def classify(server: ServiceServer, documents: list, explain: bool = True) -> list[dict]:
    """The results, each checked to carry its document's id: the client's own, else the service's."""
    status, body = server.post_json("/classify", {"documents": documents, "explain": explain})
    assert status == 200, body
    ClassifyResponse.model_validate(body)
    request_id = body["request_id"]
    assert [r["id"] for r in body["results"]] == [
        d["id"] if isinstance(d, dict) else f"{request_id}-{i}" for i, d in enumerate(documents)
    ]
    return body["results"]


def assert_same_prediction(result: dict, expected: han.DocumentResult) -> None:
    assert result["label"] == expected.label
    assert result["labels"] == expected.labels
    assert result["scores"] == pytest.approx(expected.scores, abs=1e-5)
    assert result["truncated"] == expected.truncated


# ------------------------------------------------------------------------------------------
# The contract
# ------------------------------------------------------------------------------------------


def test_classify_returns_labels_scores_and_explanations_in_input_order(server, predictor):
    documents = [REVIEWS[0], REVIEWS[-1], "Terrible.\n\nI walked out after twenty minutes. Awful acting!", REVIEWS[4]]
    results = classify(server, documents)
    assert len(results) == len(documents)
    for document, result, expected in zip(documents, results, predictor(documents, explain=True), strict=True):
        assert_same_prediction(result, expected)
        assert set(result["scores"]) == {"neg", "pos"}
        assert sum(result["scores"].values()) == pytest.approx(1, abs=1e-4)
        assert result["label"] == max(result["scores"], key=result["scores"].get)
        assert result["labels"] == [result["label"]]
        sentences = result["sentences"]
        assert [s["text"] for s in sentences] == [s.text for s in expected.sentences]
        assert sum(s["weight"] for s in sentences) == pytest.approx(1, abs=1e-4)
        previous_end = 0
        for sentence, expected_sentence in zip(sentences, expected.sentences, strict=True):
            assert document[sentence["start"] : sentence["end"]] == sentence["text"]
            assert sentence["start"] >= previous_end
            previous_end = sentence["end"]
            assert sentence["weight"] == pytest.approx(expected_sentence.weight, abs=1e-5)
            assert sum(w["weight"] for w in sentence["words"]) == pytest.approx(1, abs=1e-4)
            for word, expected_word in zip(sentence["words"], expected_sentence.words, strict=True):
                assert document[word["start"] : word["end"]] == word["text"] == expected_word.text
                assert sentence["start"] <= word["start"] < word["end"] <= sentence["end"]
                assert word["weight"] == pytest.approx(expected_word.weight, abs=1e-5)


def test_every_answer_has_an_id_and_every_request_its_own(server, predictor):
    """A document is a text or {"id", "text"} (mixed in one request): a result carries the client's id, else
    <request_id>-<index>; the request_id is fresh for every request. Ids are echoed, not checked for
    uniqueness (the schema cannot state that, and the service accepts what the schema allows)."""
    documents = [REVIEWS[0], {"id": "review-1", "text": REVIEWS[1]}, REVIEWS[2],
                 {"id": "ünï 😀 #2", "text": REVIEWS[3]}]
    status, body = server.post_json("/classify", {"documents": documents, "explain": False})
    assert status == 200, body
    ClassifyResponse.model_validate(body)
    request_id = body["request_id"]
    assert re.fullmatch(r"[0-9a-f]{32}", request_id)
    assert [r["id"] for r in body["results"]] == [f"{request_id}-0", "review-1", f"{request_id}-2", "ünï 😀 #2"]
    assert list(body) == ["request_id", "results", "model"] and next(iter(body["results"][1])) == "id"
    texts = [d if isinstance(d, str) else d["text"] for d in documents]
    for result, expected in zip(body["results"], predictor(texts), strict=True):
        assert_same_prediction(result, expected)  # the same answer whichever form the document came in
    again = {"documents": ["Fine."], "explain": False}
    others = {server.post_json("/classify", again)[1]["request_id"] for _ in range(4)}
    assert len(others | {request_id}) == 5
    twice = [{"id": "same", "text": "Good film."}, {"id": "same", "text": "Awful film."}]
    assert [r["id"] for r in classify(server, twice, explain=False)] == ["same", "same"]


def test_without_explain_the_sentences_are_left_out(server, predictor):
    results = classify(server, REVIEWS[:3], explain=False)
    for result, expected in zip(results, predictor(REVIEWS[:3]), strict=True):
        assert "sentences" not in result
        assert_same_prediction(result, expected)


def test_offsets_count_characters_of_the_original_text(server):
    document = "Émile 😀 adored it.\r\n<br />Ça marche — superb! 🎬🎬 Wonderful."
    [result] = classify(server, [document])
    words = [w for s in result["sentences"] for w in s["words"]]
    assert all(document[w["start"] : w["end"]] == w["text"] for w in words)
    assert "superb" in [w["text"] for w in words]


def test_a_long_document_is_truncated_and_says_so(server, predictor):
    long_document = " ".join(f"Sentence number {i} is rather good." for i in range(40))  # caps: 8 sentences
    results = classify(server, [long_document, REVIEWS[0]])
    assert results[0]["truncated"] is True
    assert len(results[0]["sentences"]) == predictor.saved.segmenter.max_sentences
    assert results[1]["truncated"] is False
    huge = "A good film. " * 10_000  # past max_chars as well
    [result] = classify(server, [huge], explain=False)
    assert result["truncated"] is True


def test_the_documents_limit_is_accepted_exactly(server):
    results = classify(server, [f"Good film number {i}." for i in range(MAX_DOCUMENTS)], explain=False)
    assert len(results) == MAX_DOCUMENTS


def test_model_endpoint_describes_the_served_model(server, predictor):
    status, info = server.get_json("/model")
    assert status == 200
    ModelInfo.model_validate(info)
    assert info["tag"] == server.model_tag
    assert info["tag"].startswith("han-test:")
    assert info["labels"] == predictor.labels == ["neg", "pos"]
    assert info["task"] == "single-label"
    assert info["threshold"] is None
    assert info["dataset"] == "fixture"
    assert info["metadata"]["dataset"] == "fixture"
    assert info["trained_at"] is None  # the tiny model does not record it
    # Its test figures beside the TF-IDF baseline's, on the same reviews (tests/conftest.py)
    assert info["metrics"] == predictor.saved.metadata["metrics"] and 0 < info["metrics"]["test"]["accuracy"] <= 1
    assert info["calibration"] == {"test": {k: info["metrics"]["test"][k] for k in ("ece_before", "ece_after")}}
    assert info["baseline"] == predictor.saved.metadata["baseline"]
    assert info["baseline"]["model"] == "TF-IDF 1-2 grams + logistic regression"
    assert set(info["baseline"]["test"]) == {"accuracy", "macro_f1"}
    assert 0 < info["baseline"]["test"]["accuracy"] <= 1
    assert info["architecture"]["vocab_size"] == len(predictor.saved.vocab)
    assert info["limits"]["max_documents"] == MAX_DOCUMENTS
    assert info["limits"]["max_sentences"] == predictor.saved.segmenter.max_sentences
    faithfulness = info["faithfulness"]  # measured when the model was made (tests/conftest.py)
    assert faithfulness["documents"] == 24 and faithfulness["sentences_per_document"]["mean"] >= 1
    assert set(faithfulness["methods"]) == {"attention", "attention_gradient", "integrated_gradients", "occlusion",
                                            "random"}
    top1 = faithfulness["methods"]["occlusion"]["x_random"]["top1_sentence_drop"]  # a ratio to random, and its interval
    assert top1["interval"][0] <= top1["ratio"] <= top1["interval"][1] and top1["confidence"] == 0.95
    assert "x_random" not in faithfulness["methods"]["random"]
    assert faithfulness == predictor.saved.metadata["faithfulness"]


def test_health_and_metrics_endpoints(server):
    for path in ("/livez", "/readyz"):
        status, _, _ = server.request("GET", path)
        assert status == 200, path
    classify(server, [REVIEWS[0]])
    status, _, body = server.request("GET", "/metrics")
    assert status == 200
    text = body.decode()
    assert "han_batch_requests_count" in text
    assert re.search(r'bentoml_service_request_total\{[^}]*endpoint="/classify"', text), text[:2000]


def test_access_log_is_off_unless_asked_for(server, request):
    """Off by default (it cost as much CPU as classifying a short review); HAN_ACCESS_LOG=1 turns it on."""
    logged = ServiceServer.start(tiny_model_dir_quickly(request), env={"HAN_ACCESS_LOG": "1"})
    try:
        classify(server, [REVIEWS[0]])
        classify(logged, [REVIEWS[0]])
        text = ""
        for _ in range(50):  # the line is written as the response goes out
            text = logged.log_path.read_text(errors="replace")
            if "path=/classify" in text:
                break
            time.sleep(0.1)
        assert re.search(r"path=/classify.*status=200", text), text[-2000:]
    finally:
        logged.stop()
    assert "path=/classify" not in server.log_path.read_text(errors="replace")


def test_pages_and_openapi_document(server):
    status, headers, body = server.request("GET", "/")
    assert status == 200 and headers["content-type"].startswith("text/html")
    page = body.decode()
    assert 'id="classify"' in page and 'id="document"' in page and 'id="explanation"' in page
    assert not re.search(r"""(src|href)=["']https?://""", page), "the page must not load assets from the internet"
    status, headers, _ = server.request("GET", "/docs")
    assert status == 200 and headers["content-type"].startswith("text/html")
    status, _, raw = server.request("GET", "/docs.json")
    assert status == 200

    def no_duplicate_keys(pairs: list[tuple[str, object]]) -> dict:
        keys = [key for key, _ in pairs]
        assert len(keys) == len(set(keys)), f"duplicate keys in the OpenAPI document: {keys}"
        return dict(pairs)

    spec = json.loads(raw, object_pairs_hook=no_duplicate_keys)

    def ref(name: str) -> str:
        return f"#/components/schemas/{name}"

    assert spec["openapi"].startswith("3.")
    assert {"/classify", "/model", "/"} <= set(spec["paths"])
    assert {"400", "413", "422"} <= set(spec["paths"]["/classify"]["post"]["responses"])
    # The request body: required, and ClassifyRequest's own schema (BentoML's kept a union's first member).
    body = spec["paths"]["/classify"]["post"]["requestBody"]
    assert body == {"required": True, "content": {"application/json": {"schema": {"$ref": ref("ClassifyRequest")}}}}
    schemas = spec["components"]["schemas"]
    request = schemas["ClassifyRequest"]
    assert request["required"] == ["documents"] and request["additionalProperties"] is False
    documents = request["properties"]["documents"]
    assert (documents["minItems"], documents["maxItems"]) == (1, MAX_DOCUMENTS)
    assert documents["items"]["anyOf"] == [{"type": "string", "pattern": HAS_WORDS}, {"$ref": ref("Document")}]
    document = schemas["Document"]
    assert document["required"] == ["id", "text"] and document["additionalProperties"] is False
    assert (document["properties"]["id"]["minLength"], document["properties"]["id"]["maxLength"]) == (1, 200)
    assert document["properties"]["text"]["pattern"] == HAS_WORDS
    explain = request["properties"]["explain"]["anyOf"]
    assert {"type": "boolean"} in explain and any(o.get("enum") == list(METHODS) for o in explain)
    assert "ClassifyRequestIODescriptor" not in schemas
    # The response: the request's id, and each result's.
    response = spec["paths"]["/classify"]["post"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert {"request_id", "results", "model"} <= set(response["required"])
    assert response["properties"]["results"]["items"] == {"$ref": ref("DocumentResult")}
    result = schemas["DocumentResult"]
    assert result["properties"]["id"]["type"] == "string" and result["required"][0] == "id"


def test_binds_to_loopback_by_default():
    code = "from service.service import HANClassifier; print(HANClassifier.config['http']['host'])"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True,
                          env={**os.environ, "HAN_MODEL_TAG": "han-anything:latest"})
    assert done.stdout.strip().splitlines()[-1] == "127.0.0.1"


# ------------------------------------------------------------------------------------------
# Bad input: a 4xx with a JSON message that names the problem, never a 500 or a traceback
# ------------------------------------------------------------------------------------------

BAD_BODIES = [
    # (id, body, status, words the message must contain)
    ("empty list", b'{"documents": []}', 422, "documents: the list is empty"),
    (  # the schema's maxItems: a 422 like any other schema violation (413 is for the byte limit alone)
        "too many documents",
        json.dumps({"documents": ["good"] * (MAX_DOCUMENTS + 1)}).encode(),
        422,
        "documents: 257 documents is more than the limit of 256",
    ),
    (
        "number",
        b'{"documents": ["fine", "also fine", "ok", 3]}',
        422,
        'documents[3]: a document must be a string or an object {"id": ..., "text": ...}, not a number',
    ),
    ("null", b'{"documents": ["fine", null]}', 422, "documents[1]: a document must be a string or an object"),
    ("list", b'{"documents": [["fine"]]}', 422, "documents[0]: a document must be a string or an object"),
    ("object without id", b'{"documents": [{"text": "hi"}]}', 422, "documents[0].id: this field is required"),
    ("object without text", b'{"documents": ["a", {"id": "x"}]}', 422, "documents[1].text: this field is required"),
    ("id a number", b'{"documents": ["a", "b", {"id": 7, "text": "c"}]}', 422,
     "documents[2].id: must be a string, not a number"),
    ("id empty", b'{"documents": [{"id": "", "text": "c"}]}', 422,
     "documents[0].id: an id is 1 to 200 characters, not 0"),
    (
        "id too long",
        json.dumps({"documents": ["a", {"id": "x" * 201, "text": "c"}]}).encode(),
        422,
        "documents[1].id: an id is 1 to 200 characters, not 201",
    ),
    ("text a number", b'{"documents": [{"id": "a", "text": 3}]}', 422,
     "documents[0].text: must be a string, not a number"),
    ("blank text", b'{"documents": [{"id": "a", "text": " "}]}', 422, "documents[0].text: the document is empty"),
    ("unknown document field", b'{"documents": [{"id": "a", "text": "b", "lang": "en"}]}', 422,
     'documents[0].lang: unknown field (it takes "id" and "text")'),
    (
        "empty document",
        b'{"documents": ["fine", "fine", "fine", ""]}',
        422,
        "documents[3]: the document is empty or whitespace only",
    ),
    ("whitespace", b'{"documents": [" \\n\\t "]}', 422, "documents[0]: the document is empty or whitespace only"),
    ("markup only", b'{"documents": ["fine", "<br /><br />"]}', 422, "documents[1]: the document has no words"),
    ("controls only", b'{"documents": ["\\u0000\\u200b\\ufeff <P/>\\u3000"]}', 422,
     "documents[0]: the document has no words"),
    (  # what the schema cannot state: no word within the model's caps (max_chars, 100,000 characters)
        "no word within the caps",
        json.dumps({"documents": ["fine", {"id": "late", "text": " " * 100_000 + "word"}]}).encode(),
        422,
        "documents[1].text: the document has no word within its first 100,000 characters",
    ),
    (  # over a megabyte: checked in a thread, not on the event loop
        "megabytes of markup",
        json.dumps({"documents": ["<br> \n" * 400_000]}).encode(),
        422,
        "documents[0]: the document has no words",
    ),
    ("malformed JSON", b'{"documents": ["a"', 400, "not valid JSON"),
    ("trailing garbage", b'{"documents": ["a"]} x', 400, "not valid JSON"),
    ("empty body", b"", 400, "the request body is empty"),
    ("not an object", b'["a", "b"]', 422, "must be a JSON object"),
    ("missing documents", b'{"explain": true}', 422, "documents: this field is required"),
    ("documents not a list", b'{"documents": "a review"}', 422, "documents: must be a list of documents, not a string"),
    (
        "explain not a boolean or a method",
        b'{"documents": ["a"], "explain": "yes"}',
        422,
        "explain: unknown method 'yes'; it must be true, false or a method name (attention, attention_gradient, "
        "integrated_gradients, occlusion)",
    ),
    ("explain a number", b'{"documents": ["a"], "explain": 1}', 422, "explain: must be true, false or a method"),
    ("unknown field", b'{"documents": ["a"], "document": "b"}', 422,
     'document: unknown field (it takes "documents" and "explain")'),
    ("invalid UTF-8", b'{"documents": ["caf\xe9 \xff"]}', 400, "not valid UTF-8"),
    ("broken unicode escape", b'{"documents": ["bad \\ud8 text"]}', 400, "not valid JSON"),  # a lone surrogate: 200
]


@pytest.mark.parametrize(("body", "status", "message"), [b[1:] for b in BAD_BODIES], ids=[b[0] for b in BAD_BODIES])
def test_bad_input_gets_a_4xx_naming_the_problem(server, body, status, message):
    got, headers, raw = server.request("POST", "/classify", body, {"Content-Type": "application/json"})
    assert got == status, raw[:500]
    assert headers["content-type"].startswith("application/json")
    error = json.loads(raw)["error"]
    assert message in error
    assert "Traceback" not in error


def test_an_unknown_path_or_a_method_a_route_does_not_take_is_refused_in_the_api_shape(server):
    for method, path, status, message in (("GET", "/classify", 405, "GET is not allowed on /classify (it takes POST"),
                                          ("POST", "/model", 405, "POST is not allowed on /model"),
                                          ("GET", "/no-such-page", 404, "no such path: /no-such-page")):
        got, headers, raw = server.request(method, path)
        assert got == status and headers["content-type"] == "application/json", raw[:300]
        assert json.loads(raw)["error"].startswith(message), raw[:300]


def _refused_before_the_body_ends(server: ServiceServer, head: bytes, chunks: int, frame) -> tuple[int, bytes]:
    """Send ``head``, then ``chunks`` 1 MB chunks of a body that goes on (``frame`` wraps each), then stop
    sending without ending it, and read the answer: one that comes only after the body ends never comes."""
    parts = urlsplit(server.url)
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        sent = threading.Event()

        def upload() -> None:
            try:
                sock.sendall(head)
                for _ in range(chunks):
                    sock.sendall(frame(b"x" * 2**20))
            except OSError:  # the test below fails without the answer; this thread has nothing to add
                pass
            finally:
                sent.set()

        threading.Thread(target=upload, daemon=True).start()
        response = http.client.HTTPResponse(sock)
        response.begin()  # no answer within the socket's 30 s: socket.timeout, and the test fails
        assert sent.wait(30)
        return response.status, response.read(response.length or 0)


def test_a_body_over_the_size_limit_is_refused_without_reading_it(server):
    big = b'{"documents": ["' + b"a" * (10 * 2**20) + b'"]}'
    status, _, raw = server.request("POST", "/classify", big, {"Content-Type": "application/json"})
    assert status == 413
    assert "larger than the limit of 10 MB" in json.loads(raw)["error"]
    # A declared length over the limit is refused on the header: the guard drains at most 8 x the limit of
    # what is on its way (so the client, still sending, sees the 413) and answers. Here 1 GB is declared
    # and 81 MB sent: an answer after the whole body would never come.
    head = (b"POST /classify HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % 2**30)
    status, raw = _refused_before_the_body_ends(server, head, 81, lambda chunk: chunk)
    assert status == 413 and "larger than the limit of 10 MB" in json.loads(raw)["error"], raw[:300]
    # Without a Content-Length (chunked), the server counts the bytes as they arrive: past 10 MB it drains
    # at most 80 MB more and answers, though the body (no last chunk) has not ended.
    head = b"POST /classify HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n" \
           b"Transfer-Encoding: chunked\r\n\r\n"
    status, raw = _refused_before_the_body_ends(server, head, 92, lambda chunk: b"%x\r\n%s\r\n" % (len(chunk), chunk))
    assert status == 413 and "larger than the limit of 10 MB" in json.loads(raw)["error"], raw[:300]


def test_media_types(server):
    status, _, raw = server.request("POST", "/classify", b"a=b", {"Content-Type": "multipart/form-data; boundary=x"})
    assert status == 415 and "must be JSON" in json.loads(raw)["error"]
    # curl -d labels JSON as a form: it is still read as JSON.
    body = json.dumps({"documents": [REVIEWS[0]], "explain": False}).encode()
    status, _, raw = server.request("POST", "/classify", body, {"Content-Type": "application/x-www-form-urlencoded"})
    assert status == 200 and json.loads(raw)["results"][0]["label"] in ("neg", "pos")
    status, _, _ = server.request("GET", "/classify")
    assert status == 405


def test_bad_input_leaves_no_traceback_in_the_server_log(server):
    before = len(server.log())
    for _, body, _, _ in BAD_BODIES:
        server.request("POST", "/classify", body, {"Content-Type": "application/json"})
    classify(server, [REVIEWS[1]])  # and the service still works
    assert "Traceback" not in server.log()[before:]


# ------------------------------------------------------------------------------------------
# Concurrency and batching
# ------------------------------------------------------------------------------------------


def _metric(server: ServiceServer, name: str) -> float:
    _, _, body = server.request("GET", "/metrics")
    return sum(float(m) for m in re.findall(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+-]+)$", body.decode(), re.MULTILINE))


def test_concurrent_requests_get_the_same_answers_as_sequential_ones_and_are_batched(server):
    requests = [
        (
            [REVIEWS[i % len(REVIEWS)], REVIEWS[(3 * i + 1) % len(REVIEWS)] + " " + REVIEWS[i % 7]] * (1 + i % 4),
            i % 3 != 0,
        )
        for i in range(64)
    ]
    sequential = [classify(server, documents, explain) for documents, explain in requests]
    requests_before = _metric(server, "han_batch_requests_sum")
    batches_before = _metric(server, "han_batch_requests_count")

    barrier = threading.Barrier(32)

    def send(i: int) -> list[dict]:
        if i < 32:
            barrier.wait(timeout=30)  # the first wave starts together
        return classify(server, *requests[i])

    with ThreadPoolExecutor(max_workers=32) as pool:
        concurrent = list(pool.map(send, range(len(requests))))

    for got, expected in zip(concurrent, sequential, strict=True):
        assert len(got) == len(expected)
        for a, b in zip(got, expected, strict=True):
            assert a["label"] == b["label"] and a["labels"] == b["labels"]
            assert a["scores"] == pytest.approx(b["scores"], abs=1e-5)
            assert ("sentences" in a) == ("sentences" in b)
            if "sentences" in a:
                assert [w["text"] for s in a["sentences"] for w in s["words"]] == [
                    w["text"] for s in b["sentences"] for w in s["words"]
                ]
                assert [w["weight"] for s in a["sentences"] for w in s["words"]] == pytest.approx(
                    [w["weight"] for s in b["sentences"] for w in s["words"]], abs=1e-5
                )
    served = _metric(server, "han_batch_requests_sum") - requests_before
    batches = _metric(server, "han_batch_requests_count") - batches_before
    assert served == len(requests)
    assert batches < served, "concurrent requests were never gathered into one model call"


# ------------------------------------------------------------------------------------------
# Fuzzing the OpenAPI schema
# ------------------------------------------------------------------------------------------


def test_schemathesis_finds_the_api_as_its_schema_says(server, tmp_path):
    """Property-based requests generated from /docs.json, with every check: no 5xx, responses as the
    schema says, and the schema says exactly what is accepted (a valid request is never refused, an
    invalid one never accepted; other methods get 405)."""
    command = [
        str(Path(sys.executable).parent / "schemathesis"),
        "run",
        f"{server.url}/docs.json",
        "--checks",
        "all",
        "--max-examples",
        "100",
        "--seed",
        "20240501",
        "--workers",
        "2",
        "--request-timeout",
        "30",
        "--generation-database",
        "none",
        "--no-color",
        "--exclude-path-regex",
        "^/(metrics|livez|readyz|healthz)$",
    ]
    # /feedback waits up to 0.3 s for an id no answer has yet (service/feedback.py): Schemathesis sends many
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    generated = re.search(r"(\d+) generated, (\d+) passed", done.stdout)
    assert generated and generated[1] == generated[2] and int(generated[1]) >= 100, done.stdout[-3000:]
    # /classify, /model, /feedback, /monitor, / and /dashboard
    assert re.search(r"Operations:\s+6 selected", done.stdout), done.stdout[-3000:]
    assert "Unsupported regex" not in done.stdout, done.stdout[-3000:]  # the documents' pattern is used as written
    assert "Traceback" not in server.log()


def test_a_server_pinned_to_a_version_reports_as_pinned_and_its_shadow_failure_is_seen(server, tmp_path) -> None:
    """A server started on a tag (this one serves han-test:latest) runs the name's shadow: han-model shadow
    must see a version it cannot load (it said "no running service follows" and exited 0 while the workers
    logged the failure), status must list it, and promote must not wait for it to follow."""
    from tests.service_server import TEST_MODEL_NAME, base_env, register_model
    from tests.tiny_model import train_tiny_model

    home = server.home / "bentoml"

    def han_model(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "registry.cli", *args], cwd=Path(__file__).parent.parent,
                              env=base_env(home), capture_output=True, text=True, timeout=300)

    klingon = register_model(train_tiny_model(seed=4)[0].save(tmp_path / "klingon"), home)
    config = home / "models" / TEST_MODEL_NAME / klingon.split(":")[1] / "config.json"
    settings = json.loads(config.read_text())
    settings["segmenter"]["language"] = "tlh"  # a language without a spaCy tokenizer
    config.write_text(json.dumps(settings))
    try:
        refused = han_model("shadow", klingon, "--fraction", "1", "--wait", "30")
        assert refused.returncode == 1 and "cannot be shadowed" in refused.stdout and "tlh" in refused.stdout, (
            refused.stdout + refused.stderr)
        status = han_model("status", TEST_MODEL_NAME)
        assert f"serving {server.model_tag} (pinned" in status.stdout, status.stdout + status.stderr
    finally:  # the session's server serves han-test:latest: a restarted worker must find its version there
        han_model("shadow", TEST_MODEL_NAME, "--stop")
        shutil.rmtree(config.parent)
        (config.parent.parent / "latest").write_text(server.model_tag.split(":")[1])
