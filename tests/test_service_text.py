"""Text the service is sent as browsers write it: a lone UTF-16 surrogate (a text JavaScript cut inside an
emoji, which ``JSON.stringify`` writes as ``"\\ud83d"``, grammatical JSON) is classified with U+FFFD in its
place, against a real ``bentoml serve`` of the tiny model (tests/service_server.py), and by the web page
in a real headless Chromium (as tests/test_browser.py drives it)."""

from __future__ import annotations

import json
import random

import pytest
from playwright.sync_api import Page

from tests.service_server import ServiceServer, shared_server, tiny_model_dir_quickly

# Python's json reads a lone surrogate escape as the lone code point: the reference for what each escape means.
PIECES = ["a", " ", "😀", "\\\\", "\\\\\\\\", "\\ud83d", "\\uD83D", "\\udbff", "\\ude00", "\\uDC00", "\\ud83d\\ude00",
          "\\uD83D\\uDE00", "\\u0041", "\\ud7ff", "\\ue000", "\\n", '\\"', "ud83d", "\\u00e9", "\\\\u"]


def _as_replaced(text: str) -> str:
    return "".join("\ufffd" if 0xD800 <= ord(ch) <= 0xDFFF else ch for ch in text)


def test_each_lone_surrogate_escape_and_only_it_is_replaced():
    """Against Python's json on random mixes: escaped backslashes before "ud83d" are text, pairs stay,
    each lone surrogate becomes one U+FFFD (so the text keeps its length in code points)."""
    from service.guard import replace_lone_surrogates

    rng = random.Random(7)
    for _ in range(3000):
        body = ('"' + "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 8))) + '"').encode()
        original = json.loads(body)
        replaced = json.loads(replace_lone_surrogates(body))
        assert replaced == _as_replaced(original), body
        assert len(replaced) == len(original)
        replaced.encode("utf-8")  # no surrogate is left
    plain = b'{"documents": ["' + b"a \\u00e9 \\\\ " * 10_000 + b'"]}'
    assert replace_lone_surrogates(plain) is plain  # no "\ud": the body is not rewritten


@pytest.fixture(scope="session")
def server(request: pytest.FixtureRequest) -> ServiceServer:
    return shared_server(request.config, tiny_model_dir_quickly(request))


def _post(server: ServiceServer, path: str, body: bytes) -> tuple[int, dict]:
    status, _, raw = server.request("POST", path, body, {"Content-Type": "application/json"})
    return status, json.loads(raw)


@pytest.mark.slow
def test_a_text_cut_inside_an_emoji_is_classified_with_a_replacement_character(server):
    """What a browser sends for a tweet cut in the middle of an emoji, and curl's "\\ud800": classified,
    the offsets right for the text with U+FFFD; an escaped backslash before "ud83d" stays text."""
    cut = "A wonderful film, I loved it 😀"[:-1]  # Python's own cut is whole code points: write the escape
    body = (b'{"documents": ["A wonderful film, I loved it \\ud83d", {"id": "r-\\udc00", "text": "Great \\ud800 '
            b'acting.\\ud83d\\ude00 Dull \\\\ud83d plot."}], "explain": true}')
    status, answer = _post(server, "/classify", body)
    assert status == 200, answer
    first, second = answer["results"]
    texts = [cut[:-1] + " \ufffd", "Great \ufffd acting.😀 Dull \\ud83d plot."]
    assert second["id"] == "r-\ufffd"
    for result, text in zip((first, second), texts, strict=True):
        words = [w for s in result["sentences"] for w in s["words"]]
        assert words and all(text[w["start"]:w["end"]] == w["text"] for w in words), (text, words)
    assert any(s["text"].endswith("Dull \\ud83d plot.") for s in second["sentences"]), second["sentences"]
    # The same document with U+FFFD written out gets the same answer.
    status, same = server.post_json("/classify", {"documents": [texts[0]], "explain": True})
    assert status == 200 and same["results"][0]["scores"] == first["scores"]
    assert same["results"][0]["sentences"] == first["sentences"]


@pytest.mark.slow
def test_a_large_body_with_a_lone_surrogate_is_classified_too(server):
    """A body over a megabyte is read in a thread (service.guard.THREAD_BYTES): the same replacement."""
    body = b'{"documents": ["\\ud83d Good film. ' + b"Fine acting. " * 90_000 + b'"], "explain": false}'
    assert len(body) > 2**20
    status, answer = _post(server, "/classify", body)
    assert status == 200, answer
    assert answer["results"][0]["truncated"] is True


@pytest.mark.slow
def test_a_surrogate_escape_that_is_not_json_is_still_refused(server):
    """Only lone surrogates are replaced: a broken escape is still a 400 that names the JSON problem."""
    status, answer = _post(server, "/classify", b'{"documents": ["bad \\ud8 text"]}')
    assert status == 400 and answer["error"].startswith("the request body is not valid JSON"), answer


@pytest.mark.slow
def test_the_page_classifies_a_text_cut_inside_an_emoji_and_shows_it_as_typed(server, page: Page):
    """A tweet cut by JavaScript in the middle of an emoji ends in a lone surrogate, which JSON.stringify
    sends as "\\ud83d": the page classifies it and shows the text as it is, the words where the API says."""
    page.goto(server.url + "/")
    page.wait_for_function("document.getElementById('model-info').dataset.tag")
    page.evaluate("""() => { const t = 'A wonderful film, I loved it 😀😀';
                             document.getElementById('document').value = t.slice(0, t.length - 1); }""")
    page.click("#classify")
    page.wait_for_function("document.body.dataset.state")
    assert page.evaluate("document.body.dataset.state") == "done", page.inner_text("#error")
    assert page.evaluate("document.getElementById('explanation').textContent === document.getElementById('document')"
                         ".value")
    words = page.evaluate("[...document.querySelectorAll('#explanation .word')].map((w) => w.textContent)")
    assert words[:3] == ["A", "wonderful", "film"]


def test_feedback_reads_a_lone_surrogate_as_classify_does(server):
    """/feedback parses its own body: an id with a lone surrogate escape is the id /classify answered with
    (U+FFFD in its place), not a 400 about JSON."""
    status, answer = _post(server, "/classify", b'{"documents": [{"id": "fb-\\ud83d", "text": "A fine film."}]}')
    assert status == 200 and answer["results"][0]["id"] == "fb-\ufffd", answer
    status, stored = _post(server, "/feedback", b'{"feedback": [{"id": "fb-\\ud83d", "label": "pos"}]}')
    assert status == 200 and stored["stored"] == 1, stored
