"""A model with an n-gram head (han.ngrams), served for real: GET /model names the head and its share,
POST /classify returns the averaged scores and the head's n-grams, and the page shows both."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.sync_api import Page

from han import Pipeline, SavedModel
from tests.service_server import ServiceServer
from tests.test_browser import REVIEW, classify_on_page
from tests.tiny_model import with_ngram_head

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def head_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """The tiny model with a head learned from the fixture reviews, at a 40% HAN share, as a fit records it."""
    saved = with_ngram_head(SavedModel.load(tiny_model_dir), 0.4)
    saved.metadata["ngram_head"] = {"han_share": 0.4, "ngrams": saved.ngrams.size,
                                    "validation_accuracy": {"han": 0.9, "ngrams": 0.9, "averaged": 1.0}}
    saved.metadata["metrics"]["test"]["han_alone_accuracy"] = 0.875
    directory = saved.save(tmp_path_factory.mktemp("head-model"))
    server = ServiceServer.start(directory)
    yield server, Pipeline(SavedModel.load(directory))
    server.stop()


def test_the_service_returns_the_average_and_the_heads_ngrams(head_server) -> None:
    server, pipeline = head_server
    status, info = server.get_json("/model")
    assert status == 200 and info["ngram_head"]["han_share"] == 0.4
    status, body = server.post_json("/classify", {"documents": [REVIEW, "Dull and boring."], "explain": True})
    assert status == 200
    expected = pipeline([REVIEW, "Dull and boring."], explain=True)
    for got, want in zip(body["results"], expected, strict=True):
        assert got["scores"] == pytest.approx(want.scores, abs=1e-6)
        assert [(n["text"], n["weight"]) for n in got["top_ngrams"]] == [(n.text, n.weight) for n in want.top_ngrams]
    status, body = server.post_json("/classify", {"documents": [REVIEW], "explain": False})
    assert status == 200 and "top_ngrams" not in body["results"][0]


def test_the_page_shows_the_share_and_the_ngrams(head_server, page: Page) -> None:
    server, _ = head_server
    _, api = server.post_json("/classify", {"documents": [REVIEW], "explain": True})
    dom = classify_on_page(page, server, REVIEW)
    assert dom["state"] == "done", dom["error"]
    assert re.search(r"The scores average the HAN \(40%\) with an n-gram head \(TF-IDF 1-2 grams, 60%\).*"
                     r"the HAN alone 0\.875", dom["baseline"]), dom["baseline"]
    chips = page.evaluate("[...document.querySelectorAll('#top-ngrams .chip')].map("
                          "(c) => [c.textContent, Number(c.dataset.weight), c.classList.contains('against')])")
    wanted = api["results"][0]["top_ngrams"]
    assert chips == [[n["text"], pytest.approx(n["weight"]), n["weight"] < 0] for n in wanted] and len(chips) == 5
    assert "n-gram head (60% of the score)" in page.evaluate("document.getElementById('top-ngrams').textContent")
