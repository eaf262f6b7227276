"""The web page in a real headless Chromium, against the real server (tests/service_server.py).

Playwright (pytest-playwright) drives the system's Chromium (``executable_path``; nothing is
downloaded): the test types a review, clicks Classify, and checks the label, the scores and the
highlighted words in the DOM against the API's answer. Screenshots go to ``$HAN_SCREENSHOT_DIR``
(default: the test's tmp dir).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from playwright.sync_api import Page

from tests.service_server import ServiceServer, shared_server, tiny_model_dir_quickly

pytestmark = pytest.mark.slow

REVIEW = (
    "A wonderful film. The acting was superb and the story moved me to tears.\n\n"
    "The middle drags a little, but I loved every minute of the ending 😀. Brilliant!"
)
DOM = """() => {
  const words = [...document.querySelectorAll('#explanation .word')];
  const sentences = [...document.querySelectorAll('#explanation .sentence')];
  const shown = (id) => !document.getElementById(id).hidden;
  return {
    state: document.body.dataset.state,
    error: document.getElementById('error').textContent,
    modelTag: document.getElementById('model-info').dataset.tag,
    label: document.getElementById('label').textContent,
    labelVisible: !document.getElementById('result').hidden,
    method: document.getElementById('explanation').dataset.method,
    lang: [document.getElementById('explanation').lang, document.getElementById('document').lang],
    modelInfo: document.getElementById('model-info').textContent,
    scores: [...document.querySelectorAll('#scores .score')].map(
      (row) => [row.dataset.label, Number(row.dataset.score), row.classList.contains('chosen')]),
    text: document.getElementById('explanation').textContent,
    words: words.map((w) => ({
      text: w.textContent, weight: Number(w.dataset.weight),
      intensity: Number(w.dataset.intensity), sentence: Number(w.dataset.sentence),
      background: getComputedStyle(w).backgroundColor})),
    sentences: sentences.map((s) => ({weight: Number(s.dataset.weight),
      background: getComputedStyle(s).backgroundColor})),
    legend: {attention: shown('legend-sentence') && shown('legend-word'),
             signed: shown('legend-for') && shown('legend-against')},
    faithfulness: document.getElementById('faithfulness').textContent,
    baseline: document.getElementById('baseline').textContent,
  };
}"""


@pytest.fixture(scope="session")
def server(request: pytest.FixtureRequest) -> ServiceServer:
    return shared_server(request.config, tiny_model_dir_quickly(request))


def screenshot_path(tmp_path: Path, name: str) -> Path:
    directory = Path(os.environ.get("HAN_SCREENSHOT_DIR") or tmp_path)
    directory.mkdir(parents=True, exist_ok=True)
    return directory / name


def classify_on_page(page: Page, server: ServiceServer, text: str, method: str | None = None) -> dict:
    page.set_viewport_size({"width": 1200, "height": 1000})
    page.goto(server.url + "/")
    page.wait_for_function("document.getElementById('model-info').dataset.tag")
    page.fill("#document", text)
    if method:
        page.select_option("#method", method)
    page.click("#classify")
    page.wait_for_function("document.body.dataset.state")
    return page.evaluate(DOM)


def test_page_classifies_and_highlights_a_review(server, page: Page, tmp_path):
    status, api = server.post_json("/classify", {"documents": [REVIEW], "explain": True})
    assert status == 200
    [expected] = api["results"]
    dom = classify_on_page(page, server, REVIEW)
    shot = screenshot_path(tmp_path, "han-page.png")
    page.screenshot(path=str(shot), full_page=True)
    assert dom["state"] == "done", dom["error"]

    assert dom["modelTag"] == server.model_tag
    assert dom["labelVisible"]
    assert dom["label"] == expected["label"]
    assert dom["method"] == "attention"
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
    assert dom["legend"] == {"attention": True, "signed": False}
    assert shot.stat().st_size > 10_000
    # The text is marked with the model's language (GET /model), and the header names it.
    _, info = server.get_json("/model")
    assert dom["lang"] == [info["language"], info["language"]] == ["en", "en"]
    assert "language en" in dom["modelInfo"]
    # The model's test accuracy beside the TF-IDF baseline's (the model's metadata, GET /model).
    shown = re.fullmatch(r"test accuracy ([\d.]+) \u2014 TF-IDF \+ logistic regression baseline ([\d.]+)",
                         dom["baseline"])
    assert shown, dom["baseline"]
    assert [float(v) for v in shown.groups()] == pytest.approx(
        [info["metrics"]["test"]["accuracy"], info["baseline"]["test"]["accuracy"]], abs=6e-4)


def test_the_method_selector_explains_with_a_signed_method_in_two_colours(server, page: Page, tmp_path):
    text = "Superb acting, a wonderful film. Boring and awful middle. I loved it."
    status, api = server.post_json("/classify", {"documents": [text], "explain": "occlusion"})
    assert status == 200
    [expected] = api["results"]
    dom = classify_on_page(page, server, text, method="occlusion")
    page.screenshot(path=str(screenshot_path(tmp_path, "han-page-occlusion.png")), full_page=True)
    assert dom["state"] == "done", dom["error"]
    assert dom["method"] == expected["method"] == "occlusion"
    api_words = [w for s in expected["sentences"] for w in s["words"]]
    assert [w["weight"] for w in dom["words"]] == pytest.approx([w["weight"] for w in api_words], abs=1e-9)
    assert dom["legend"] == {"attention": False, "signed": True}
    # How faithful the chosen method was on held-out documents (the model's metadata, GET /model).
    _, info = server.get_json("/model")
    measured, counts = info["faithfulness"]["methods"], info["faithfulness"]["sentences_per_document"]
    assert dom["faithfulness"].startswith(f"Faithfulness on {info['faithfulness']['documents']} held-out documents")
    shown = re.search(r"top sentence, by (-?[\d.]+) \(random: (-?[\d.]+); (-?[\d.]+)x random, 95% interval over "
                      r"documents (-?[\d.]+) to (-?[\d.]+)\)\. .* have ([\d.]+) sentences on average"
                      r".* 1 time in ([\d.]+)\.$", dom["faithfulness"])
    assert shown, dom["faithfulness"]
    top, random_, ratio, low, high, sentences, one_in = (float(v) for v in shown.groups())
    x_random = measured["occlusion"]["x_random"]["top1_sentence_drop"]
    assert [ratio, low, high] == pytest.approx([x_random["ratio"], *x_random["interval"]], abs=0.051)
    assert one_in == pytest.approx(counts["harmonic_mean"], abs=0.06)
    assert top == pytest.approx(measured["occlusion"]["top1_sentence_drop"], abs=6e-4)
    assert random_ == pytest.approx(measured["random"]["top1_sentence_drop"], abs=6e-4)
    assert sentences == pytest.approx(counts["mean"], abs=0.06)
    # Evidence against the label gets the second colour, evidence for it the first.
    colours = {("against" if w["weight"] < 0 else "for"): _rgb(w["background"]) for w in dom["words"] if w["weight"]}
    assert colours.get("for") == (22, 163, 74)
    if "against" in colours:
        assert colours["against"] == (234, 88, 12)


def test_page_shows_the_api_error_message(server, page: Page):
    dom = classify_on_page(page, server, "   \n  ")
    shown = page.evaluate("document.getElementById('error').classList.contains('shown')")
    assert dom["state"] == "error" and shown and not dom["labelVisible"]
    assert dom["error"] == "documents[0]: the document is empty or whitespace only"


def test_api_docs_page_renders_the_schema(server, page: Page):
    page.goto(server.url + "/docs")
    page.wait_for_function("document.querySelectorAll('.opblock-summary-path').length >= 3")
    paths = page.evaluate("[...document.querySelectorAll('.opblock-summary-path')].map((e) => e.textContent.trim())")
    assert {"/classify", "/model", "/feedback", "/monitor", "/"} <= set(paths)


def test_the_dashboard_charts_the_monitor_report(server, page: Page, tmp_path):
    """The monitor's page draws each version's report: its figures, and the accuracy over time (estimated
    from the scores, and realised on the feedback) as SVG lines."""
    status, body = server.post_json("/classify", {"documents": [REVIEW, "Dull and far too long.", "A fine film."],
                                                  "explain": False})
    assert status == 200
    status, _ = server.post_json("/feedback", {"feedback": [{"id": r["id"], "label": "pos"} for r in body["results"]]})
    assert status == 200
    page.set_viewport_size({"width": 1200, "height": 1400})
    page.goto(server.url + "/dashboard")
    page.wait_for_function("document.body.dataset.state")
    assert page.evaluate("document.body.dataset.state") == "done", page.inner_text("#error")
    card = page.locator(f'section[data-model="{body["model"]}"]')
    assert "estimated accuracy" in card.inner_text() and "realised on" in card.inner_text()
    paths = page.evaluate("[...document.querySelectorAll('svg path')].map((p) => p.getAttribute('stroke'))")
    assert "var(--estimate)" in paths and "var(--realised)" in paths
    page.screenshot(path=str(screenshot_path(tmp_path, "han-dashboard.png")), full_page=True)


def _channels(css_color: str) -> list[str]:
    return [v.strip() for v in css_color[css_color.index("(") + 1 : css_color.index(")")].split(",")]


def _alpha(css_color: str) -> float:
    """The alpha of a computed CSS colour: 'rgba(r, g, b, a)', or 'rgb(r, g, b)' (opaque)."""
    values = _channels(css_color)
    return float(values[3]) if len(values) == 4 else 1.0


def _rgb(css_color: str) -> tuple[int, int, int]:
    r, g, b = (int(float(v)) for v in _channels(css_color)[:3])
    return r, g, b


HOSTILE = '<img src=x onerror="window.__pwned = 1">'


def test_label_names_are_shown_as_text_never_as_markup(request, page: Page, tmp_path):
    """A model's label names come from its training data (a Label Studio export, a user's file): the
    page and the dashboard show one that looks like markup as text, and run none of it."""
    import json
    import shutil

    model_dir = tmp_path / "model"
    shutil.copytree(tiny_model_dir_quickly(request), model_dir)
    labels = json.loads((model_dir / "labels.json").read_text())
    labels = [HOSTILE if label == "pos" else label for label in labels]  # what the tiny model answers
    (model_dir / "labels.json").write_text(json.dumps(labels))
    hostile = ServiceServer.start(model_dir)
    try:
        status, body = hostile.post_json("/classify", {"documents": [REVIEW, "Dull and far too long."]})
        assert status == 200 and body["results"][0]["labels"] == [HOSTILE]
        shown = classify_on_page(page, hostile, REVIEW)
        assert shown["state"] == "done" and sorted(s[0] for s in shown["scores"]) == sorted(labels)
        status, _ = hostile.post_json("/feedback", {"feedback": [{"id": r["id"], "label": HOSTILE}
                                                                 for r in body["results"]]})
        assert status == 200
        page.goto(hostile.url + "/dashboard")
        page.wait_for_function("document.body.dataset.state")
        assert page.evaluate("document.body.dataset.state") == "done", page.inner_text("#error")
        assert HOSTILE in page.inner_text("#versions")  # the predicted labels' line, as text
        assert page.evaluate("document.querySelectorAll('img').length") == 0
        assert page.evaluate("window.__pwned") is None
    finally:
        hostile.stop()


# A slow network for answers explained by occlusion: the page's fetch waits 1.5 s before handing one back;
# window.__answered counts the /classify calls that have come back (or failed, cancelled).
SLOW_OCCLUSION = """(() => {
  const real = window.fetch;
  window.__answered = 0;
  window.fetch = async (url, options) => {
    try {
      const response = await real(url, options);
      if (String(url).includes('/classify') && options && String(options.body).includes('"occlusion"')) {
        await new Promise((resolve) => setTimeout(resolve, 1500));
      }
      return response;
    } finally {
      if (String(url).includes('/classify')) window.__answered += 1;
    }
  };
})();"""


def test_only_the_latest_request_is_shown_and_an_error_hides_the_old_result(server, page: Page):
    """A slow answer never overwrites a later one (the method switched to occlusion and straight back),
    Clear cancels the request under way, and a failed classification hides the previous text's result."""
    page.add_init_script(SLOW_OCCLUSION)
    dom = classify_on_page(page, server, REVIEW)
    assert dom["state"] == "done" and dom["method"] == "attention"
    page.evaluate("document.body.dataset.state = ''")
    page.select_option("#method", "occlusion")  # a request on its way, answered late
    page.select_option("#method", "attention")
    page.wait_for_function("document.body.dataset.state === 'done' && window.__answered >= 3")
    page.wait_for_timeout(300)  # what a late answer would render, rendered
    dom = page.evaluate(DOM)
    assert dom["method"] == "attention" and page.input_value("#method") == "attention"
    assert "occlusion" not in page.inner_text("#explain-title").lower()

    page.select_option("#method", "occlusion")  # a request on its way ...
    page.click("#clear")  # ... cancelled
    page.wait_for_function("window.__answered >= 4")
    page.wait_for_timeout(300)
    assert page.is_hidden("#result") and page.is_hidden("#explain-card")
    assert page.input_value("#document") == "" and page.is_enabled("#classify")

    page.select_option("#method", "attention")
    page.fill("#document", REVIEW)
    page.click("#classify")
    page.wait_for_function("document.body.dataset.state === 'done' && !document.getElementById('result').hidden")
    page.fill("#document", "   ")
    page.click("#classify")
    page.wait_for_function("document.body.dataset.state === 'error'")
    assert page.is_hidden("#result") and page.is_hidden("#explain-card")
    assert "empty" in page.inner_text("#error")


def test_a_multi_label_model_names_no_label_when_none_passes_its_threshold(request, page: Page, tmp_path):
    """The headline is "none", not the top-scoring label, when a multi-label model predicts no label."""
    from tests.tiny_model import train_tiny_model

    saved, _ = train_tiny_model(multi_label=True)
    saved.threshold = 0.99999  # no label passes (the tiny model is sure of itself: 0.9998 at most here)
    multi = ServiceServer.start(saved.save(tmp_path / "multi"))
    try:
        status, body = multi.post_json("/classify", {"documents": [REVIEW], "explain": False})
        assert status == 200 and body["results"][0]["labels"] == []
        shown = classify_on_page(page, multi, REVIEW)
        assert shown["state"] == "done" and shown["label"] == "none"
        assert page.inner_text("#labels") == "no label over the threshold"
        assert not any(chosen for _, _, chosen in shown["scores"])
    finally:
        multi.stop()


def test_the_dashboard_draws_accuracy_below_half_inside_its_chart(server, page: Page):
    """Realised accuracy far below 50% (forty answers judged wrong) lies inside the accuracy chart, not
    clipped below it; the key field submits with Enter."""
    texts = [f"Dull and far too long, part {i}." for i in range(40)]
    status, body = server.post_json("/classify", {"documents": texts, "explain": False})
    assert status == 200
    wrong = [{"id": r["id"], "label": next(k for k in r["scores"] if k != r["label"])} for r in body["results"]]
    assert server.post_json("/feedback", {"feedback": wrong})[0] == 200
    status, report = server.get_json("/monitor?since=1h")
    version = next(v for v in report["versions"] if v["model"] == body["model"])
    assert min(p["accuracy"] for p in version["series"] if p["accuracy"] is not None) < 0.5
    page.goto(server.url + "/dashboard")
    page.wait_for_function("document.body.dataset.state")
    page.evaluate("document.body.dataset.state = ''")
    page.press("#key", "Enter")  # the form submits: the report is read again
    page.wait_for_function("document.body.dataset.state === 'done'")
    card = f'section[data-model="{body["model"]}"]'
    points = page.evaluate(f"""(() => {{
      const svg = document.querySelector('{card} svg');
      const height = svg.viewBox.baseVal.height;
      return [...svg.querySelectorAll('circle[fill="var(--realised)"]')].map((c) => [c.cy.baseVal.value, height]);
    }})()""")
    assert points and all(0 <= y <= height for y, height in points), points


ARABIC = "هذا الفيلم رائع جدا. لم تعجبني النهاية."  # "This film is very good. I did not like the ending."
HEBREW = "הסרט הזה נהדר. לא אהבתי את הסוף."
# Each sentence's direction, and where its final period is drawn: left of the sentence's first word in
# a right-to-left sentence (its end), right of it in a left-to-right one.
DIRECTIONS = """() => {
  const dir = (e) => getComputedStyle(e).direction;
  const sentences = [...document.querySelectorAll('#explanation .sentence')].map((s) => {
    const first = s.querySelector('.word').getBoundingClientRect();
    const walker = document.createTreeWalker(s, NodeFilter.SHOW_TEXT);
    let last = null;
    while (walker.nextNode()) if (walker.currentNode.data.trim()) last = walker.currentNode;
    const at = last.data.trimEnd().length - 1;
    const range = document.createRange();
    range.setStart(last, at);
    range.setEnd(last, at + 1);
    const period = range.getBoundingClientRect();
    return {dir: dir(s), end: range.toString(), periodLeftOfFirstWord: period.right <= first.left + 1,
            periodRightOfFirstWord: period.left >= first.right - 1};
  });
  return {state: document.body.dataset.state, error: document.getElementById('error').textContent,
          box: dir(document.getElementById('explanation')), textarea: dir(document.getElementById('document')),
          sentences};
}"""


@pytest.mark.parametrize(
    ("text", "directions"),
    [(ARABIC, ["rtl", "rtl"]), (HEBREW, ["rtl", "rtl"]), (REVIEW.split("\n")[0], ["ltr", "ltr"]),
     ("A wonderful film. " + ARABIC, ["ltr", "rtl", "rtl"]), (ARABIC + " A wonderful film.", ["rtl", "rtl", "ltr"])],
    ids=["arabic", "hebrew", "english", "english-then-arabic", "arabic-then-english"],
)
def test_right_to_left_text_is_shown_right_to_left_sentence_by_sentence(server, page: Page, tmp_path, text, directions):
    """Arabic and Hebrew read right to left: the textarea and the explanation take the direction of the
    text, and each sentence its own, so a sentence's final period is drawn at its end (its left)."""
    page.set_viewport_size({"width": 1200, "height": 1000})
    page.goto(server.url + "/")
    page.wait_for_function("document.getElementById('model-info').dataset.tag")
    page.fill("#document", text)
    page.click("#classify")
    page.wait_for_function("document.body.dataset.state")
    page.screenshot(path=str(screenshot_path(tmp_path, "han-page-direction.png")), full_page=True)
    shown = page.evaluate(DIRECTIONS)
    assert shown["state"] == "done", shown["error"]
    assert [shown["textarea"], shown["box"]] == [directions[0]] * 2
    assert [s["dir"] for s in shown["sentences"]] == directions, shown
    for sentence in shown["sentences"]:
        assert sentence["end"] == "."
        if sentence["dir"] == "rtl":
            assert sentence["periodLeftOfFirstWord"], shown
        else:
            assert sentence["periodRightOfFirstWord"], shown

