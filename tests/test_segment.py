"""Segmentation: offsets point back into the original text; junk, caps and edge cases are handled."""

from __future__ import annotations

import pytest
import spacy
from hypothesis import given, settings
from hypothesis import strategies as st

from han.segment import EmptyDocumentError, Segmenter, SegmenterConfig, clean_text, token_key

SEG = Segmenter()


def assert_spans_exact(segment) -> None:
    text = segment.text
    for (s_start, s_end), spans, keys in zip(
        segment.sentence_spans, segment.token_spans, segment.token_keys, strict=True
    ):
        assert spans[0][0] == s_start and spans[-1][1] == s_end
        for (a, b), key in zip(spans, keys, strict=True):
            assert 0 <= a < b <= len(text)
            assert text[a:b].strip() == text[a:b], "a token span must not include whitespace"
            assert token_key(text[a:b]) == key


def test_sentences_and_tokens_carry_offsets_into_the_original_text() -> None:
    text = "The plot is thin. But the acting?  Superb!\nA must-see."
    seg = SEG.segment(text)
    assert [text[a:b] for a, b in seg.sentence_spans] == [
        "The plot is thin.",
        "But the acting?",
        "Superb!",
        "A must-see.",
    ]
    assert [text[a:b] for a, b in seg.token_spans[1]] == ["But", "the", "acting", "?"]
    assert not seg.truncated
    assert_spans_exact(seg)


def test_html_breaks_split_sentences_and_never_become_tokens() -> None:
    text = "First paragraph without a stop<br /><br />Second one<BR>third"
    seg = SEG.segment(text)
    assert [text[a:b] for a, b in seg.sentence_spans] == ["First paragraph without a stop", "Second one", "third"]
    assert all("<" not in k and ">" not in k for sent in seg.token_keys for k in sent)


def test_clean_text_keeps_length_and_removes_control_characters() -> None:
    text = "a\x00b\u200bc<br />d\ufeff"
    cleaned = clean_text(text)
    assert len(cleaned) == len(text)
    assert "\x00" not in cleaned and "\u200b" not in cleaned and "<br" not in cleaned


def test_invisible_format_characters_are_never_words() -> None:
    """Bidi controls, the word joiner, a soft hyphen or an invisible operator standing alone is no word, and
    a document of nothing else is empty; a soft hyphen or word joiner inside a word leaves its key whole."""
    text = "\u2067Great\u2069 co\u00adoperate \u2060 \u00ad \u202e foo\u2060bar \u2062 \u061c"
    seg = SEG.segment(text)
    assert seg.token_keys == [["great", "cooperate", "foobar"]]
    assert [text[a:b] for a, b in seg.token_spans[0]] == ["Great", "co\u00adoperate", "foo\u2060bar"]
    with pytest.raises(EmptyDocumentError):
        SEG.segment("\u2060 \u00ad\u202a\u2066 \u180e \u00ad\u00ad\u00ad")
    accents = SEG.segment("cafe\u0301\u00adteria \u0939\u093f\u0928\u094d\u00ad\u0926\u0940")
    assert accents.token_keys == [["caf\u00e9teria", "\u0939\u093f\u0928\u094d\u0926\u0940"]]


def test_keys_are_lowercased_and_nfc_normalised_while_spans_keep_the_original() -> None:
    decomposed = "Cafe\u0301 GREAT"  # e + combining acute accent
    seg = SEG.segment(decomposed)
    assert seg.token_keys[0] == ["café", "great"]
    a, b = seg.token_spans[0][0]
    assert decomposed[a:b] == "Cafe\u0301"


@pytest.mark.parametrize("text", ["", "   \n\t  ", "<br /><br />", "\x00\x01"])
def test_empty_documents_raise_a_clear_error(text: str) -> None:
    with pytest.raises(EmptyDocumentError, match="no words"):
        SEG.segment(text)


@pytest.mark.parametrize(
    "text", ["!!!", "word", "😀😀 🎉", "Это отличный фильм. Очень понравился!", "映画は素晴らしかった。また見たい。"]
)
def test_unusual_documents_segment_with_exact_spans(text: str) -> None:
    seg = SEG.segment(text)
    assert seg.sentence_spans
    assert_spans_exact(seg)


def test_long_sentences_are_split_not_dropped_and_long_documents_truncated() -> None:
    seg = Segmenter(SegmenterConfig(max_sentences=3, max_words=4)).segment("one two three four five six seven")
    assert [len(s) for s in seg.token_spans] == [4, 3]
    assert not seg.truncated
    seg = Segmenter(SegmenterConfig(max_sentences=3, max_words=4)).segment("Aa bb. Cc dd. Ee ff. Gg hh. Ii jj.")
    assert len(seg.sentence_spans) == 3 and seg.truncated


def test_documents_over_the_character_cap_are_cut_and_flagged() -> None:
    text = "Good film. " * 20_000  # 220,000 characters
    seg = Segmenter(SegmenterConfig(max_chars=1_000)).segment(text)
    assert seg.truncated and seg.sentence_spans[-1][1] <= 1_000
    assert seg.text == text  # the original is kept, so spans stay valid against what the user sent


def test_segment_many_keeps_order_and_marks_empty_documents() -> None:
    texts = ["One.", "", "Two words.", "  "]
    segments = list(SEG.segment_many(texts))
    assert [s.text for s in segments] == texts
    assert [s.is_empty for s in segments] == [False, True, False, True]


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=300) | st.text(max_size=300))
def test_any_text_gives_exact_spans_or_a_clear_empty_error(text: str) -> None:
    try:
        seg = SEG.segment(text)
    except EmptyDocumentError:
        assert not clean_text(text).strip(), "only blank documents may be reported empty"
        return
    assert_spans_exact(seg)


SENTENCIZER = spacy.blank("en")
SENTENCIZER.add_pipe("sentencizer")


def token_by_token(text: str, config: SegmenterConfig) -> list[list[tuple[int, int]]]:
    """The reference: spaCy's own sentencizer component, then the rules of ``Segmenter`` applied one
    token object at a time (how it worked before it read arrays): a word opens a sentence where the
    sentencizer starts one, or after a whitespace token that starts one or holds a line break; long
    sentences are cut into pieces of max_words, and at most max_sentences pieces are kept."""
    cleaned = clean_text(text[: config.max_chars])
    sentences: list[list[tuple[int, int]]] = []
    boundary = False
    for token in SENTENCIZER(cleaned):
        if token.is_space:
            boundary = boundary or token.is_sent_start or "\n" in token.text
            continue
        if not sentences or token.is_sent_start or boundary:
            sentences.append([])
        boundary = False
        sentences[-1].append((token.idx, token.idx + len(token)))
    pieces = [s[i : i + config.max_words] for s in sentences for i in range(0, len(s), config.max_words)]
    return pieces[: config.max_sentences]


SMALL = SegmenterConfig(max_sentences=6, max_words=5, max_chars=400)
SEGMENTERS = {config: Segmenter(config) for config in (SegmenterConfig(), SMALL)}
PUNCTUATED = st.lists(
    st.sampled_from(
        [
            "Word",
            "a",
            ".",
            "!",
            "?",
            "...",
            "!!",
            "\n",
            "\n\n",
            " ",
            "  ",
            "\t",
            '"',
            "(",
            ")",
            "-",
            "…",
            "。",
            "<br />",
            "Mr.",
            "U.S.",
            "e.g.",
            ":",
            ";",
            ",",
            "'s",
            "\u00a0",
            "é",
        ]
    ),
    max_size=80,
).map("".join)


@settings(max_examples=300, deadline=None)
@given(PUNCTUATED, st.sampled_from([SegmenterConfig(), SMALL]))
def test_sentences_match_spacys_sentencizer_token_by_token(text: str, config: SegmenterConfig) -> None:
    """Segmenter applies the sentencizer's rule to whole arrays; it must split exactly as the component does."""
    assert next(SEGMENTERS[config].segment_many([text])).token_spans == token_by_token(text, config)


def test_sentences_match_spacys_sentencizer_on_real_reviews_and_posts(shared_datasets) -> None:
    import pyarrow.parquet as pq

    texts = []
    for name in ("imdb", "20newsgroups", "reuters21578"):
        texts += (
            pq.read_table(shared_datasets / name / "test.parquet", columns=["text"]).column("text").to_pylist()[:150]
        )
    for config in (SegmenterConfig(), SMALL):
        for k, segment in enumerate(SEGMENTERS[config].segment_many(texts)):
            assert segment.token_spans == token_by_token(texts[k], config), f"document {k}"


def test_the_larger_tokenizer_cache_changes_no_token(shared_datasets) -> None:
    """The tokenizer keeps TOKENIZER_CACHE chunks (spaCy's default is 10,000); the same reviews segmented
    with no cache at all must give the same words, offsets and sentences."""
    import numpy as np
    import pyarrow.parquet as pq

    from han.segment import TOKENIZER_CACHE

    texts = pq.read_table(shared_datasets / "imdb" / "test.parquet", columns=["text"]).column("text").to_pylist()
    texts = texts[:1500] * 2  # the second pass reads chunks from the cache
    cached, uncached = Segmenter(), Segmenter()
    assert cached.nlp.tokenizer.max_cache_size == TOKENIZER_CACHE > 10_000
    uncached.nlp.tokenizer.max_cache_size = 0
    for k, (a, b) in enumerate(zip(cached.segment_many(texts), uncached.segment_many(texts), strict=True)):
        for field in ("starts", "ends", "hashes", "lengths"):
            assert np.array_equal(getattr(a, field), getattr(b, field)), f"document {k}: {field}"


def test_past_its_growth_the_vocabulary_stops_growing_and_no_token_changes(shared_datasets, monkeypatch) -> None:
    """A long-running segmenter reads in spaCy memory zones once its vocabulary has grown by
    VOCABULARY_GROWTH strings: later documents add none for good, and segment exactly as before."""
    import numpy as np
    import pyarrow.parquet as pq

    import han.segment

    texts = pq.read_table(shared_datasets / "imdb" / "test.parquet", columns=["text"]).column("text").to_pylist()
    first, later = texts[:300], texts[300:900]
    unbounded = Segmenter()
    monkeypatch.setattr(han.segment, "VOCABULARY_GROWTH", 2_000)
    bounded = Segmenter()
    for batch in (first[i : i + 8] for i in range(0, len(first), 8)):
        list(bounded.segment_many(batch))
    kept = len(bounded.nlp.vocab.strings)
    assert kept > bounded._zone_after, "the first reviews grow the vocabulary past the bound"
    for batch in (later[i : i + 8] for i in range(0, len(later), 8)):
        for k, (a, b) in enumerate(zip(bounded.segment_many(batch), unbounded.segment_many(batch), strict=True)):
            for field in ("starts", "ends", "hashes", "lengths"):
                assert np.array_equal(getattr(a, field), getattr(b, field)), f"document {k}: {field}"
    assert len(bounded.nlp.vocab.strings) == kept
    assert len(unbounded.nlp.vocab.strings) > kept + 5_000, "new reviews bring new strings"
