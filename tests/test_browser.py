"""The web page in a real headless Chromium, against the real server (tests/service_server.py).

Chromium is driven over the DevTools protocol (tests/cdp_browser.py): the test types a review,
clicks Classify, and checks the label, the scores and the highlighted words in the DOM against
the API's answer. A screenshot is saved to ``$HAN_SCREENSHOT_DIR`` (default: the test's tmp dir).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from tests.cdp_browser import Browser, find_chromium
from tests.service_server import ServiceServer, shared_server, tiny_model_dir_quickly

pytestmark = pytest.mark.slow

REVIEW = (
    "A wonderful film. The acting was superb and the story moved me to tears.\n\n"
    "The middle drags a little, but I loved every minute of the ending 😀. Brilliant!"
)


@pytest.fixture(scope="session")
def server(request: pytest.FixtureRequest) -> ServiceServer:
    return shared_server(request.config, tiny_model_dir_quickly(request))


@pytest.fixture(scope="session")
def chromium() -> str:
    path = find_chromium()
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true but Chromium is missing (apt-get install chromium)")
        pytest.skip("Chromium is not installed (apt-get install chromium)")
    return path


def screenshot_path(tmp_path: Path, name: str) -> Path:
    directory = Path(os.environ.get("HAN_SCREENSHOT_DIR") or tmp_path)
    directory.mkdir(parents=True, exist_ok=True)
    return directory / name


def test_page_classifies_and_highlights_a_review(server, chromium, tmp_path):
    status, api = server.post_json("/classify", {"documents": [REVIEW], "explain": True})
    assert status == 200
    [expected] = api["results"]
    shot = screenshot_path(tmp_path, "han-page.png")

    async def scenario() -> dict:
        async with Browser(chromium, width=1200, height=1000) as page:
            await page.goto(server.url + "/")
            await page.wait_for("document.getElementById('model-info').dataset.tag")
            await page.type_into("#document", REVIEW)
            await page.click("#classify")
            state = await page.wait_for("document.body.dataset.state")
            dom = await page.evaluate(
                """(() => {
                  const words = [...document.querySelectorAll('#explanation .word')];
                  const sentences = [...document.querySelectorAll('#explanation .sentence')];
                  return {
                    state: document.body.dataset.state,
                    error: document.getElementById('error').textContent,
                    modelTag: document.getElementById('model-info').dataset.tag,
                    label: document.getElementById('label').textContent,
                    labelVisible: !document.getElementById('result').hidden,
                    scores: [...document.querySelectorAll('#scores .score')].map(
                      (row) => [row.dataset.label, Number(row.dataset.score), row.classList.contains('chosen')]),
                    text: document.getElementById('explanation').textContent,
                    words: words.map((w) => ({
                      text: w.textContent, weight: Number(w.dataset.weight),
                      intensity: Number(w.dataset.intensity), sentence: Number(w.dataset.sentence),
                      background: getComputedStyle(w).backgroundColor})),
                    sentences: sentences.map((s) => ({weight: Number(s.dataset.weight),
                      background: getComputedStyle(s).backgroundColor})),
                    legend: Boolean(document.querySelector('#legend #legend-sentence'))
                      && Boolean(document.querySelector('#legend #legend-word')),
                  };
                })()"""
            )
            await page.screenshot(shot)
            assert state == "done", dom["error"]
            return dom

    dom = asyncio.run(scenario())

    assert dom["modelTag"] == server.model_tag
    assert dom["labelVisible"]
    assert dom["label"] == expected["label"]
    assert {name: score for name, score, _ in dom["scores"]} == pytest.approx(expected["scores"], abs=1e-6)
    assert [name for name, _, chosen in dom["scores"] if chosen] == expected["labels"]
    # The document is rendered exactly (line breaks and emoji included), from the API's offsets.
    assert dom["text"] == REVIEW
    api_words = [w for s in expected["sentences"] for w in s["words"]]
    assert [w["text"] for w in dom["words"]] == [w["text"] for w in api_words]
    assert [w["weight"] for w in dom["words"]] == pytest.approx([w["weight"] for w in api_words], abs=1e-9)
    assert [s["weight"] for s in dom["sentences"]] == pytest.approx([s["weight"] for s in expected["sentences"]])
    # Highlighting follows the weights: the most attended word of the most attended sentence is the
    # most intense, and a more intense word gets a more opaque background.
    top_sentence = max(range(len(expected["sentences"])), key=lambda i: expected["sentences"][i]["weight"])
    in_top = [w for w in dom["words"] if w["sentence"] == top_sentence]
    assert max(w["intensity"] for w in dom["words"]) == pytest.approx(1.0)
    assert max(in_top, key=lambda w: w["weight"])["intensity"] == pytest.approx(1.0)
    alphas = [_alpha(w["background"]) for w in dom["words"]]
    order = sorted(range(len(alphas)), key=lambda i: dom["words"][i]["intensity"])
    assert alphas[order[-1]] > alphas[order[0]]
    assert len({round(a, 2) for a in alphas}) > 3, "words should be shaded by weight, not uniformly"
    assert all(_alpha(s["background"]) > 0 for s in dom["sentences"])
    assert dom["legend"]
    assert shot.stat().st_size > 10_000


def test_page_shows_the_api_error_message(server, chromium):
    async def scenario() -> dict:
        async with Browser(chromium) as page:
            await page.goto(server.url + "/")
            await page.type_into("#document", "   \n  ")
            await page.click("#classify")
            await page.wait_for("document.body.dataset.state")
            return await page.evaluate(
                "({state: document.body.dataset.state, error: document.getElementById('error').textContent,"
                " shown: document.getElementById('error').classList.contains('shown'),"
                " result: !document.getElementById('result').hidden})"
            )

    dom = asyncio.run(scenario())
    assert dom["state"] == "error" and dom["shown"] and not dom["result"]
    assert dom["error"] == "documents[0]: the document is empty or whitespace only"


def _alpha(css_color: str) -> float:
    """The alpha of a computed CSS colour: 'rgba(r, g, b, a)', or 'rgb(r, g, b)' (opaque)."""
    values = [v.strip() for v in css_color[css_color.index("(") + 1 : css_color.index(")")].split(",")]
    return float(values[3]) if len(values) == 4 else 1.0


def test_api_docs_page_renders_the_schema(server, chromium):
    async def scenario() -> list[str]:
        async with Browser(chromium) as page:
            await page.goto(server.url + "/docs")
            await page.wait_for("document.querySelectorAll('.opblock-summary-path').length >= 3")
            return await page.evaluate(
                "[...document.querySelectorAll('.opblock-summary-path')].map((e) => e.textContent.trim())"
            )

    paths = asyncio.run(scenario())
    assert {"/classify", "/model", "/"} <= set(paths)
