"""In-process pieces of the service: memory release, the response JSON and the response deadline (no server)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import han
from service.api import ClassifyResponse
from service.deadline import BentoTimeoutMiddleware, ResponseDeadline, use_response_deadline
from tests.asgi_calls import call, run_async, scripted_app
from tests.service_server import tiny_model_dir_quickly
from tests.tiny_model import read_jsonl

# A fresh process whose freed memory stays on the heap (tune_process: 128 MB trim threshold), with
# glibc's malloc and the process's RSS at hand.
MALLOC_PRELUDE = (
    "import ctypes, threading, psutil\n"
    "from han.environment import release_free_memory, tune_process\n"
    "tune_process(1)\n"
    "libc = ctypes.CDLL('libc.so.6'); libc.malloc.restype = ctypes.c_void_p\n"
    "rss = lambda: psutil.Process().memory_info().rss\n"
)


def test_release_free_memory_gives_a_freed_heap_back_to_the_kernel():
    """The idle work of a serving worker: after a burst's buffers are freed, RSS falls (glibc only)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("malloc_trim is glibc's")
    code = MALLOC_PRELUDE + (
        "blocks = [libc.malloc(64 << 10) for _ in range(800)]\n"  # 50 MB in blocks under the mmap threshold
        "for b in blocks: ctypes.memset(b, 1, 64 << 10)\n"
        "for b in blocks[:-1]: libc.free(ctypes.c_void_p(b))\n"  # the last block pins the heap's top
        "held = rss(); release_free_memory(); print(held - rss())\n"
    )
    freed = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert freed > 30 << 20


THREAD_BURST = (
    "freed = []\n"
    "def burst():\n"
    "    block = libc.malloc(25 << 20); ctypes.memset(block, 1, 25 << 20)\n"  # under both thresholds
    "    libc.free(ctypes.c_void_p(block))\n"  # merges into the top of this thread's arena
    "    held = rss(); libc.malloc_trim(0); trimmed = rss()\n"
    "    release_free_memory(); freed.append((held - trimmed, trimmed - rss()))\n"
    "thread = threading.Thread(target=burst); thread.start(); thread.join()\n"
    "print(*freed[0])\n"
)


def test_a_tuned_process_keeps_one_arena_so_malloc_trim_gives_a_threads_burst_back():
    """tune_process keeps every thread in the main malloc arena: an arena per thread kept each burst's pages."""
    if not sys.platform.startswith("linux"):
        pytest.skip("malloc_trim is glibc's")
    out = subprocess.run([sys.executable, "-c", MALLOC_PRELUDE + THREAD_BURST], capture_output=True, text=True,
                         check=True).stdout
    by_trim, _ = map(int, out.split())
    assert by_trim > 20 << 20, by_trim


def test_a_tuned_process_reuses_a_freed_window_without_faulting_its_pages_in_again():
    """A window's arrays, freed, stay on the heap for the next window (tune_process): at glibc's or a 32 MB
    trim threshold each window gave about 100 MB back and page-faulted it in again."""
    if not sys.platform.startswith("linux"):
        pytest.skip("glibc's malloc")
    code = MALLOC_PRELUDE + (
        "import resource\n"
        "def window():\n"
        "    blocks = [libc.malloc(1 << 20) for _ in range(100)]\n"  # 100 MB under the mmap threshold
        "    for b in blocks: ctypes.memset(b, 1, 1 << 20)\n"
        "    for b in reversed(blocks): libc.free(ctypes.c_void_p(b))\n"  # all of it at the heap's top
        "window()\n"
        "faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt; window()\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults)\n"
    )
    tuned = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    untuned = code.replace("tune_process(1)\n", "")
    assert MALLOC_PRELUDE.count("tune_process(1)\n") == 1
    default = int(subprocess.run([sys.executable, "-c", untuned], capture_output=True, text=True,
                                 check=True).stdout)
    assert default > 20_000, default  # 100 MB is 25,600 pages: the check can tell
    assert tuned < 2_000, tuned


def test_a_tuned_process_collects_garbage_less_often():
    """Each collection walks every object alive: with a window's explanations alive, Python's default
    thresholds spent a quarter of han-score --explain's time there (han.environment.GC_THRESHOLDS)."""
    code = MALLOC_PRELUDE + (
        "import gc, time\n"
        "alive = [[i] for i in range(300_000)]\n"  # a window's results, held while more are made
        "start = sum(s['collections'] for s in gc.get_stats())\n"
        "made = [(i, [i]) for i in range(200_000)]\n"
        "print(sum(s['collections'] for s in gc.get_stats()) - start)\n"
    )
    tuned, default = (int(subprocess.run([sys.executable, "-c", c], capture_output=True, text=True,
                                         check=True).stdout) for c in (code, code.replace("tune_process(1)\n", "")))
    assert tuned <= 400_000 // 10_000 + 5, tuned  # 400,000 containers made
    assert default > 10 * tuned, default  # Python's (700, 10, 10)


def test_release_free_memory_gives_back_the_top_of_a_threads_heap():
    """Where threads have arenas of their own (glibc's default; tune_process keeps one), the inference
    thread's freed tensors merge into the top of its arena, which malloc_trim leaves alone (glibc trims
    only the main heap's top): the idle work gives it back too."""
    if not sys.platform.startswith("linux"):
        pytest.skip("malloc_trim is glibc's")
    code = MALLOC_PRELUDE + "libc.mallopt(-8, 8)\n" + THREAD_BURST  # M_ARENA_MAX: an arena per thread again
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    by_trim, by_release = map(int, out.split())
    assert by_trim < 2 << 20, "malloc_trim alone leaves a thread's heap top"
    assert by_release > 20 << 20, by_release


def test_release_free_memory_gives_back_arenas_the_type_cache_held():
    """A large request's short-lived objects fill Python's memory arenas; names made on the spot and
    looked up on a type (as numpy's C code does) stay referenced by the type attribute cache, one in
    each arena, so freeing the objects and trimming the heap gives back nothing. The idle work clears
    that cache first: the arenas go back to the kernel."""
    code = (
        "import ctypes, psutil\n"
        "from han.environment import release_free_memory\n"
        "class Thing: pass\n"
        "rss = lambda: psutil.Process().memory_info().rss\n"
        "start = rss(); junk = []\n"
        "for i in range(400_000):\n"
        "    junk.append((i, str(i) * 3))\n"  # a request's short-lived objects, about 70 MB
        "    if i % 100 == 0: hasattr(Thing, 'name_' + str(i))\n"  # a name made here: the type cache keeps it
        "del junk\n"
        "ctypes.CDLL('libc.so.6').malloc_trim(0)\n"  # what the heap alone gives back
        "held = rss(); release_free_memory(); print(held - start, held - rss())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    held, freed = map(int, out.split())
    assert held > 10 << 20, "the cached names keep arenas after the objects are freed"
    assert freed > held * 0.6, (held, freed)


def test_freeze_loaded_objects_leaves_them_out_of_collections():
    """A serving worker's start-up objects are frozen: a collection then walks only newer ones."""
    code = (
        "import gc\n"
        "from han.environment import freeze_loaded_objects\n"
        "kept = [[i] for i in range(100_000)]\n"
        "before = len(gc.get_objects(generation=2))\n"
        "freeze_loaded_objects()\n"
        "print(before, gc.get_freeze_count(), len(gc.get_objects(generation=2)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    before, frozen, after = map(int, out.split())
    assert before > 100_000 and frozen > 100_000 and after < 1_000


def test_the_response_is_the_pipelines_results_as_json(request: pytest.FixtureRequest):
    pipeline = han.Pipeline(han.SavedModel.load(tiny_model_dir_quickly(request)))
    texts = [row["text"] for row in read_jsonl("reviews.jsonl")[:6]] + ['Quotes "here" \\ and \ttabs, émigré 😀.']
    for explain in (True, None):
        results = pipeline(texts, explain=explain)
        for i, result in enumerate(results):
            result.id = f"abc-{i}"
        response = ClassifyResponse.model_construct(request_id="abc", results=results, model="han-test:v1")
        data = json.loads(response.model_dump_json())
        ClassifyResponse.model_validate(data)
        assert data["model"] == "han-test:v1" and data["request_id"] == "abc"
        assert [r["id"] for r in data["results"]] == [f"abc-{i}" for i in range(len(texts))]
        for text, result, prediction in zip(texts, data["results"], results, strict=True):
            assert result["label"] == prediction.label and result["labels"] == prediction.labels
            assert result["scores"] == prediction.scores
            assert result["truncated"] is prediction.truncated
            assert ("sentences" in result) is (explain is not None)
            assert ("method" in result) is (explain is not None)
            assert "top_words" not in result and "top_sentences" not in result  # absent, not null
            if explain:
                words = [w for s in result["sentences"] for w in s["words"]]
                expected = [w for s in prediction.sentences for w in s.words]
                assert [(w["text"], w["start"], w["end"], w["weight"]) for w in words] == [
                    (w.text, w.start, w.end, w.weight) for w in expected
                ]
                assert all(text[w["start"] : w["end"]] == w["text"] for w in words)


def test_served_model_prefers_the_environment_and_follows_a_name(tmp_path: Path):
    """A version is served as it is; a name (the default han-imdb:production) follows its pointer, which
    names no version in an empty store: the latest then."""
    code = "from service.service import served_model; print(*served_model())"
    for env, expected in (({"HAN_MODEL_TAG": "something:v1"}, "something:v1 None"),
                          ({"HAN_MODEL_TAG": "something"}, "something:latest something"),
                          ({}, "han-imdb:latest han-imdb")):
        environ = {k: v for k, v in os.environ.items() if k != "HAN_MODEL_TAG"} | env | {"BENTOML_HOME": str(tmp_path)}
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=environ)
        assert done.stdout.strip().splitlines()[-1] == expected, done.stderr[-2000:]


def test_response_deadline_answers_504_when_no_response_started_in_time():
    sent = run_async(call(ResponseDeadline(scripted_app(delay_before=5), timeout=0.05)))
    assert sent[0]["status"] == 504
    assert json.loads(sent[1]["body"]) == {"error": "Not able to process the request in 0.05 seconds"}


def test_response_deadline_lets_a_started_response_finish_and_an_apps_own_timeout_through():
    sent = run_async(call(ResponseDeadline(scripted_app(delay_after=0.2), timeout=0.05)))
    assert [m.get("status") for m in sent] == [200, None] and sent[1]["body"] == b"ok"
    with pytest.raises(TimeoutError, match="the app's"):
        run_async(call(ResponseDeadline(scripted_app(error=TimeoutError("the app's")), timeout=5)))


def test_response_deadline_leaves_no_timer_behind_a_finished_request():
    """BentoML's own TimeoutMiddleware leaves each request's timer (with a future and a context)
    scheduled for the whole timeout: at hundreds of requests a second, a worker held tens of
    thousands. After ResponseDeadline's requests nothing is left to run. When BentoML's stops
    leaking, the second assertion fails: then service/deadline.py can go."""
    async def pending_timers(middleware_class: Any) -> int:
        middleware = middleware_class(scripted_app(), timeout=120)
        for _ in range(50):
            assert (await call(middleware))[0]["status"] == 200
        loop = asyncio.get_running_loop()
        return sum(not handle.cancelled() for handle in loop._scheduled)  # type: ignore[attr-defined]

    assert run_async(pending_timers(ResponseDeadline)) == 0
    assert run_async(pending_timers(BentoTimeoutMiddleware)) == 50, (
        "BentoML's TimeoutMiddleware no longer leaves its timers behind: remove service/deadline.py")


def test_bentoml_builds_its_apps_with_the_response_deadline_once_it_is_in_use():
    """use_response_deadline relies on BentoML looking its timeout middleware up in ``traffic``
    whenever an app lists its middlewares; it checks that, and says whether it took effect."""
    import service.deadline

    try:
        assert use_response_deadline()
    finally:
        service.deadline.traffic.TimeoutMiddleware = BentoTimeoutMiddleware


def test_the_guard_validates_a_classify_body_once_and_bentoml_takes_its_result(monkeypatch: pytest.MonkeyPatch):
    """The guard parses and validates the body; BentoML's parse of the same body (its JSON serde calls
    ``model_validate_json`` of the API's input spec on the joined body) gets the guard's request, as an
    instance of that spec, rather than parsing it again."""
    import bentoml
    from starlette.requests import Request

    from service.api import ClassifyRequest
    from service.guard import RequestGuard

    @bentoml.service
    class Probe:
        @bentoml.api(input_spec=ClassifyRequest)
        def classify(self, documents: list[str], explain: bool | str = True) -> str:
            return ""

    spec = Probe.apis["classify"].input_spec

    validator, calls = ClassifyRequest.__pydantic_validator__, []

    class Counting:
        def validate_json(self, *args: Any, **kwargs: Any) -> Any:
            calls.append(args[0])
            return validator.validate_json(*args, **kwargs)

    monkeypatch.setattr(ClassifyRequest, "__pydantic_validator__", Counting())
    parsed: list[Any] = []

    async def bentoml_like(scope: Any, receive: Any, send: Any) -> None:
        body = await Request(scope, receive).body()
        parsed.append(spec.model_validate_json(b"".join((body,))))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def post(body: bytes) -> list[dict[str, Any]]:
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {"type": "http", "method": "POST", "path": "/classify", "headers": [(b"content-type", b"text/plain")]}
        await RequestGuard(bentoml_like)(scope, receive, send)
        return sent

    body = json.dumps({"documents": ["A fine film."], "explain": "occlusion"}).encode()
    assert run_async(post(body))[0]["status"] == 200
    assert len(calls) == 1 and isinstance(parsed[0], spec) and spec is not ClassifyRequest
    assert parsed[0].documents == ["A fine film."] and parsed[0].explain == "occlusion"
    sent = run_async(post(b'{"documents": [3]}'))  # refused by the guard: BentoML never sees it
    assert sent[0]["status"] == 422 and b"documents[0]: a document must be a string or an object" in sent[1]["body"]
    assert len(calls) == 2 and len(parsed) == 1
    assert ClassifyRequest.model_validate_json(body).documents == ["A fine film."]  # outside a request: parsed
    assert len(calls) == 3


def test_the_documents_pattern_is_the_segmenters_rule_for_a_word():
    """api.HAS_WORDS (the schema's pattern, which the guard applies) holds exactly where han's segmenter
    finds a word (han.segment.has_words without the cap): for every character alone, and for mixes of
    blanks, break tags and their pieces. Lone surrogates are left out: no JSON text the service accepts
    holds one. It runs in linear time on pathological input."""
    import random
    import re
    import time

    from han.segment import has_words
    from service.api import HAS_WORDS

    pattern = re.compile(HAS_WORDS)
    characters = [chr(c) for c in range(sys.maxunicode + 1) if not 0xD800 <= c <= 0xDFFF]
    assert [c for c in characters if bool(pattern.match(c)) != has_words(c, 2)] == []
    pieces = [" ", "\t", "\n", "\x00", "\x1c", "\x85", "\xa0", "\u200b", "\ufeff", "\u3000", "\u2028", "\u00ad",
              "\u2060", "\u202e", "<", ">",
              "/", "b", "R", "p", "P", "<br>", "<br />", "</p>", "<p>", "< BR/ >", "<P\t/\n>", "<br", "<b r>", "</ p>",
              "<//p>", "a", ".", "é", "😀"]
    rng = random.Random(60)
    for _ in range(20_000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 10)))
        assert bool(pattern.match(text)) == has_words(text, len(text) + 1), repr(text)
    started = time.perf_counter()
    spaces = " " * 500_000
    for text in (spaces * 2, "<br" + spaces * 2, "<br> " * 200_000, "<p" + spaces + "/" + spaces):
        pattern.match(text)
    assert time.perf_counter() - started < 2


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"documents": ["ok", {"id": "a", "text": "<br>"}]}', "documents[1].text: the document has no words"),
        (b'{"documents": [{"id": 3, "text": "x"}]}', "documents[0].id: must be a string, not a number"),
        (b'{"documents": ["x", true]}', "documents[1]: a document must be a string or an object"),
        (b'{"documents": [{"text": "x"}]}', "documents[0].id: this field is required"),
        (b'{"documents": [{"id": "a", "text": "x", "b": 1}]}', "documents[0].b: unknown field"),
        (b'{"documents": [""]}', "documents[0]: the document is empty or whitespace only"),
        (b'{"documents": ["a"], "x": 1}', 'x: unknown field (it takes "documents" and "explain")'),
    ],
)
def test_the_guard_names_a_documents_problem_at_its_place(body: bytes, message: str):
    """A document is a text or an object: pydantic reports a bad one once per union member; the message
    is the member's of the document's kind, at the document's place."""
    from service.guard import validate_classify_body

    status, error = validate_classify_body(body)  # type: ignore[misc]
    assert status == 422 and error.startswith(message), error


def test_a_request_mixes_texts_and_documents_with_ids():
    from service.api import ClassifyRequest, Document
    from service.guard import validate_classify_body

    request = validate_classify_body(b'{"documents": ["A fine film.", {"id": "r-2", "text": "Dull."}]}')
    assert isinstance(request, ClassifyRequest)
    assert request.documents == ["A fine film.", Document(id="r-2", text="Dull.")]


def test_switches_store_urls_and_retention_are_read_alike_or_refused_at_start() -> None:
    """HAN_METRICS_OPEN=true read as off (a scraper then got 401) while HAN_LOG=true was on; a mysql:// store
    started and answered 503 for good; a retention past year 1 crashed the workers' writer."""
    from service.settings import Settings

    on = Settings.read({"HAN_METRICS_OPEN": "true", "HAN_ACCESS_LOG": "on", "HAN_ALLOW_ANONYMOUS": "yes"})
    assert on.metrics_open and on.access_log and on.allow_anonymous
    off = Settings.read({"HAN_METRICS_OPEN": "0", "HAN_ACCESS_LOG": "no"})
    assert not off.metrics_open and not off.access_log and not off.allow_anonymous
    with pytest.raises(ValueError, match="HAN_METRICS_OPEN"):
        Settings.read({"HAN_METRICS_OPEN": "2"})
    for url in ("sqlite:///tmp/fb.db", "postgresql://u:pw@db:5432/han", "/tmp/fb.sqlite3", "~/fb.sqlite3"):
        assert Settings.read({"HAN_FEEDBACK_STORE": url}).feedback_store == url
    for url in ("mysql://u:secret@db/x", "sqlite://"):
        with pytest.raises(ValueError, match="HAN_FEEDBACK_STORE must be a file path") as refused:
            Settings.read({"HAN_FEEDBACK_STORE": url})
        assert "secret" not in str(refused.value)
    assert Settings.read({"HAN_FEEDBACK_RETENTION_DAYS": "36500"}).feedback_retention_days == 36500
    with pytest.raises(ValueError, match="HAN_FEEDBACK_RETENTION_DAYS must be at most 36500 days"):
        Settings.read({"HAN_FEEDBACK_RETENTION_DAYS": "1000000"})
