"""Sentence splitting and tokenisation with character offsets into the original text.

Uses ``spacy.blank("en")`` with the rule-based ``sentencizer`` (no model download).
Cleaning never changes the length of the text: HTML line breaks, control characters and
other junk are overwritten in place, so every offset points into the text the user sent.
Token *keys* (what the vocabulary sees) are lower-cased and Unicode-NFC normalised.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field

import spacy
from spacy.attrs import IDX, IS_SPACE, LENGTH, SENT_START
from spacy.tokens import Doc

# `<br>`, `<br/>`, `<br />`, `<p>`, `</p>`: paragraph structure in scraped text (IMDB has plenty).
_BREAK_TAG = re.compile(r"<\s*(?:br|/?p)\s*/?\s*>", re.IGNORECASE)
# Control characters (not tab/newline/CR), zero-width marks and BOM, line/paragraph separators,
# lone surrogates (which JSON can carry and which spaCy cannot take).
_JUNK = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u200b-\u200f\u2028\u2029\ufeff\ud800-\udfff]")


class EmptyDocumentError(ValueError):
    """A document with no words: empty, whitespace only, or markup only."""


@dataclass(frozen=True)
class SegmenterConfig:
    """Caps applied while segmenting.

    A sentence longer than ``max_words`` tokens is split into pieces of at most that many
    tokens (no word is dropped). A document with more than ``max_sentences`` pieces, or longer
    than ``max_chars`` characters, is cut there and flagged ``truncated``.
    """

    max_sentences: int = 50
    max_words: int = 60
    max_chars: int = 100_000

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass
class Segment:
    """One document split into sentences of tokens, with spans into the original text."""

    text: str
    sentence_spans: list[tuple[int, int]] = field(default_factory=list)
    token_spans: list[list[tuple[int, int]]] = field(default_factory=list)
    token_keys: list[list[str]] = field(default_factory=list)
    truncated: bool = False

    @property
    def is_empty(self) -> bool:
        return not self.sentence_spans


def clean_text(text: str) -> str:
    """Return ``text`` with markup and junk blanked out, keeping its length (so offsets hold)."""
    text = _BREAK_TAG.sub(lambda m: "\n" + " " * (len(m.group()) - 1), text)
    return _JUNK.sub(" ", text)


def token_key(token_text: str) -> str:
    """The vocabulary key of a token: lower case, Unicode NFC."""
    key = token_text.lower()
    return key if key.isascii() else unicodedata.normalize("NFC", key)


class Segmenter:
    """Splits documents into sentences and tokens, batching through ``nlp.pipe``."""

    def __init__(self, config: SegmenterConfig | None = None) -> None:
        self.config = config or SegmenterConfig()
        self.nlp = spacy.blank("en")
        self.nlp.add_pipe("sentencizer")
        self.nlp.max_length = max(self.nlp.max_length, self.config.max_chars + 1)

    def segment(self, text: str) -> Segment:
        """Segment one document; raises EmptyDocumentError if it has no words."""
        segment = next(self.segment_many([text]))
        if segment.is_empty:
            raise EmptyDocumentError("the document has no words (it is empty, whitespace or markup only)")
        return segment

    def segment_many(self, texts: Iterable[str], batch_size: int = 128) -> Iterator[Segment]:
        """Segment documents lazily and in order; an empty document gives an empty Segment."""
        limit = self.config.max_chars

        def prepared() -> Iterator[tuple[str, tuple[str, str, bool]]]:
            for text in texts:
                if not isinstance(text, str):
                    raise TypeError(f"a document must be a string, not {type(text).__name__}")
                cut = len(text) > limit
                cleaned = clean_text(text[:limit] if cut else text)
                yield cleaned, (text, cleaned, cut)

        for doc, (original, cleaned, cut) in self.nlp.pipe(prepared(), batch_size=batch_size, as_tuples=True):
            yield self._from_doc(doc, original, cleaned, cut)

    def _from_doc(self, doc: Doc, original: str, cleaned: str, cut: bool) -> Segment:
        max_words, max_sentences = self.config.max_words, self.config.max_sentences
        segment = Segment(text=original, truncated=cut)
        sentences: list[list[tuple[int, int]]] = []
        current: list[tuple[int, int]] = []
        boundary = False  # a sentence start or a line break seen on a whitespace token
        for idx, length, is_space, sent_start in doc.to_array([IDX, LENGTH, IS_SPACE, SENT_START]).tolist():
            if is_space:
                boundary = boundary or sent_start == 1 or "\n" in cleaned[idx : idx + length]
                continue
            if current and (sent_start == 1 or boundary):
                sentences.append(current)
                current = []
            boundary = False
            current.append((idx, idx + length))
        if current:
            sentences.append(current)
        for spans in sentences:
            for i in range(0, len(spans), max_words):
                if len(segment.token_spans) == max_sentences:
                    segment.truncated = True
                    return segment
                piece = spans[i : i + max_words]
                segment.token_spans.append(piece)
                segment.token_keys.append([token_key(cleaned[a:b]) for a, b in piece])
                segment.sentence_spans.append((piece[0][0], piece[-1][1]))
        return segment
