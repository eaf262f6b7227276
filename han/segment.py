"""Sentence splitting and tokenisation with character offsets into the original text.

Uses the blank tokenizer of the documents' language (``spacy.blank(code)``: its language's rules for
contractions, élisions, abbreviations; Chinese by character) and the rules of spaCy's ``sentencizer``,
which covers every script's sentence punctuation (no model download), applied to whole arrays of token
attributes rather than token by token.
Cleaning never changes the length of the text: HTML line breaks, control characters and
other junk are overwritten in place, so every offset points into the text the user sent.
Token *keys* (what the vocabulary sees) are lower-cased and Unicode-NFC normalised.
"""

from __future__ import annotations

import re
import unicodedata
from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from functools import cache, cached_property
from itertools import pairwise

import numpy as np

from han.environment import torch_left_out

with torch_left_out():  # the tokenizer needs no torch (see torch_left_out)
    import spacy
    from spacy.attrs import IDX, IS_PUNCT, IS_SPACE, LENGTH, ORTH
    from spacy.language import Language
    from spacy.pipeline import Sentencizer
    from spacy.tokens import Doc

# `<br>`, `<br/>`, `<br />`, `<p>`, `</p>`: paragraph structure in scraped text (IMDB has plenty).
_BREAK_TAG = re.compile(r"<\s*(?:br|/?p)\s*/?\s*>", re.IGNORECASE)
# Control characters (not tab/newline/CR), zero-width marks and BOM, line/paragraph separators, the
# invisible format characters that never belong to a word (bidi embeddings, overrides and isolates, the
# Arabic letter mark, invisible operators, interlinear annotation marks), and lone surrogates (which JSON
# can carry and which spaCy cannot take).
_JUNK = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u061c\u180e\u200b-\u200f\u2028-\u202e\u2061-\u2064"
                   "\u2066-\u2069\ufeff\ufff9-\ufffb\ud800-\udfff]")
# A soft hyphen or word joiner between two visible characters is kept (the word's key drops it:
# co\u00adoperate is cooperate; a combining mark or a virama before it counts as visible); beside
# whitespace or the text's ends it is blanked, so that it is never a word of its own.
_IN_WORD_ONLY = "\u00ad\u2060"
_STRAY = re.compile(f"[{_IN_WORD_ONLY}](?![^\\s{_IN_WORD_ONLY}])|(?<![^\\s{_IN_WORD_ONLY}])[{_IN_WORD_ONLY}]")
# Text chunks (between spaces) whose tokens spaCy's tokenizer caches, which never evicts: 30,000 instead
# of its 10,000 is faster on a stream of reviews, and larger costs every process's memory for little more.
# The tokens, and so every output, are the same at any size.
TOKENIZER_CACHE = 30_000
# spaCy's vocabulary keeps every new string for good. Once it holds this many more than when built,
# documents are read in a memory zone, whose new strings are dropped after (the cache still serves them).
VOCABULARY_GROWTH = 40_000


# Languages whose spaCy tokenizer needs a package spaCy does not install, and the pip line that adds it.
EXTRA_PACKAGES = {
    "ja": "pip install sudachipy sudachidict_core",
    "ko": "pip install natto-py (and the mecab-ko system library with mecab-ko-dic)",
    "th": "pip install pythainlp",
    "vi": "pip install pyvi",
}


class EmptyDocumentError(ValueError):
    """A document with no words: empty, whitespace only, or markup only."""


class LanguageError(ValueError):
    """A language code spaCy does not know, or whose tokenizer needs a package that is not installed."""


@cache
def check_language(code: str) -> None:
    """Raise LanguageError unless ``code``'s tokenizer can be built here (checked once per process)."""
    if code != "en":
        blank_language(code)


def blank_language(code: str) -> Language:
    """``spacy.blank(code)``, or a LanguageError of one line naming the code and what to do."""
    from spacy.util import get_lang_class

    try:
        get_lang_class(code)
    except (ImportError, ValueError, TypeError):
        raise LanguageError(f"unknown language code {code!r}: spaCy has no tokenizer for it (codes such as en, de, "
                            "fr, es, pt, nl, it, pl, zh; the list: https://spacy.io/usage/models#languages)") from None
    try:
        return spacy.blank(code)
    except ImportError:
        install = EXTRA_PACKAGES.get(code, "install the package spaCy's error names")
        raise LanguageError(f"language {code!r} needs a tokenizer package that is not installed: {install}") from None


@dataclass(frozen=True)
class SegmenterConfig:
    """The documents' language (a spaCy code) and the caps applied while segmenting.

    A sentence longer than ``max_words`` tokens is split into pieces of at most that many
    tokens (no word is dropped). A document with more than ``max_sentences`` pieces, or longer
    than ``max_chars`` characters, is cut there and flagged ``truncated``.
    """

    max_sentences: int = 50
    max_words: int = 60
    max_chars: int = 100_000
    language: str = "en"  # model directories saved before languages have none: English

    def to_dict(self) -> dict[str, int | str]:
        """English is left out: such a model directory stays readable by versions before languages, and
        the tokenisation caches of English data keep their keys."""
        settings = asdict(self)
        if settings["language"] == "en":
            del settings["language"]
        return settings


def _empty(dtype: type = np.int64) -> np.ndarray:
    return np.zeros(0, dtype=dtype)


@dataclass
class Segment:
    """One document split into sentences of words, held as arrays of offsets into the original text
    (a sentence longer than ``max_words`` counts as its pieces). The model's input needs only
    ``hashes`` and ``lengths``; the per-word lists (spans, keys) are built when first asked for."""

    text: str
    starts: np.ndarray = field(default_factory=_empty)  # [words] offset of each word, in reading order
    ends: np.ndarray = field(default_factory=_empty)  # [words] offset just past it
    hashes: np.ndarray = field(default_factory=lambda: _empty(np.uint64))  # [words] spaCy's hash of its text
    lengths: np.ndarray = field(default_factory=_empty)  # [sentences] words in each sentence
    truncated: bool = False

    @property
    def is_empty(self) -> bool:
        return not len(self.lengths)

    @cached_property
    def sentence_spans(self) -> list[tuple[int, int]]:
        last = np.cumsum(self.lengths)
        return list(zip(self.starts[last - self.lengths].tolist(), self.ends[last - 1].tolist(), strict=True))

    @cached_property
    def token_spans(self) -> list[list[tuple[int, int]]]:
        return self.per_sentence(list(zip(self.starts.tolist(), self.ends.tolist(), strict=True)))

    @cached_property
    def token_keys(self) -> list[list[str]]:
        text = self.text
        return self.per_sentence([token_key(text[a:b]) for a, b in zip(self.starts.tolist(), self.ends.tolist())])  # noqa: B905

    def per_sentence(self, items: list) -> list[list]:
        """One item per word, in reading order -> one list per sentence."""
        bounds = [0, *np.cumsum(self.lengths).tolist()]
        return [items[a:b] for a, b in pairwise(bounds)]


def clean_text(text: str) -> str:
    """Return ``text`` with markup and junk blanked out, keeping its length (so offsets hold)."""
    text = _BREAK_TAG.sub(lambda m: "\n" + " " * (len(m.group()) - 1), text)
    text = _JUNK.sub(" ", text)
    return _STRAY.sub(" ", text) if "\u00ad" in text or "\u2060" in text else text


def has_words(text: str, max_chars: int) -> bool:
    """Whether ``Segmenter.segment`` finds a word in ``text``, without tokenising it: spaCy splits
    wherever whitespace starts or ends, so any other character left by ``clean_text`` is in a word."""
    return bool(text) and not clean_text(text[:max_chars]).isspace()


def token_key(token_text: str) -> str:
    """The vocabulary key of a token: lower case, Unicode NFC, without soft hyphens and word joiners."""
    key = token_text.lower()
    if key.isascii():
        return key
    key = unicodedata.normalize("NFC", key)
    return key.replace("\u00ad", "").replace("\u2060", "") if "\u00ad" in key or "\u2060" in key else key


class Segmenter:
    """Splits documents into sentences and tokens, batching through the spaCy tokenizer."""

    def __init__(self, config: SegmenterConfig | None = None) -> None:
        self.config = config or SegmenterConfig()
        self.nlp = blank_language(self.config.language)  # only its tokenizer runs (texts are cut at max_chars first)
        self.nlp.tokenizer.max_cache_size = TOKENIZER_CACHE
        # Each new word's lexeme gets only the flags read below: spaCy's other 18 attributes (its lower
        # case, norm, shape, prefix and suffix each stored as one more string) cost time and memory.
        getters = self.nlp.vocab.lex_attr_getters
        self.nlp.vocab.lex_attr_getters = {a: f for a, f in getters.items() if a in (IS_PUNCT, IS_SPACE)}
        strings = self.nlp.vocab.strings
        self._stops = np.array(sorted(strings.add(c) for c in Sentencizer.default_punct_chars), dtype=np.uint64)
        self._zone_after = len(strings) + VOCABULARY_GROWTH

    def segment(self, text: str) -> Segment:
        """Segment one document; raises EmptyDocumentError if it has no words."""
        segment = next(self.segment_many([text]))
        if segment.is_empty:
            raise EmptyDocumentError("the document has no words (it is empty, whitespace or markup only)")
        return segment

    def segment_many(self, texts: Iterable[str], batch_size: int = 128) -> Iterator[Segment]:
        """Segment documents lazily and in order; an empty document gives an empty Segment."""
        limit = self.config.max_chars
        pending: deque[tuple[str, str, bool]] = deque()  # (original, cleaned, cut), in step with the tokenizer

        def prepared() -> Iterator[str]:
            for text in texts:
                if not isinstance(text, str):
                    raise TypeError(f"a document must be a string, not {type(text).__name__}")
                cut = len(text) > limit
                cleaned = clean_text(text[:limit] if cut else text)
                pending.append((text, cleaned, cut))
                yield cleaned

        vocab = self.nlp.vocab
        zoned = len(vocab.strings) > self._zone_after and not vocab.in_memory_zone
        zone = vocab.memory_zone() if zoned else nullcontext()
        with zone:  # a Doc is turned into arrays before the zone can close: none outlives its strings
            for doc in self.nlp.tokenizer.pipe(prepared(), batch_size=batch_size):
                original, cleaned, cut = pending.popleft()
                yield self._from_doc(doc, original, cleaned, cut)

    def _from_doc(self, doc: Doc, original: str, cleaned: str, cut: bool) -> Segment:
        if not len(doc):
            return Segment(original, truncated=cut)
        idx, length, is_space, is_punct, orth = doc.to_array([IDX, LENGTH, IS_SPACE, IS_PUNCT, ORTH]).T
        # spaCy's sentencizer: after a token in its punct_chars, the next token that is neither
        # punctuation nor one of those chars starts a sentence (as does the first token).
        at = np.minimum(np.searchsorted(self._stops, orth), len(self._stops) - 1)
        stop = self._stops[at] == orth
        other = np.flatnonzero(~(stop | is_punct.astype(bool)))  # candidates: neither
        starts_sentence = np.zeros(len(doc), dtype=bool)
        starts_sentence[other[_seen_since_previous(stop, other)]] = True
        starts_sentence[0] = True
        # Words are the non-whitespace tokens. A word opens a new sentence if it starts one, or if a
        # whitespace token since the previous word started one or holds a line break.
        space = is_space.astype(bool)
        words = np.flatnonzero(~space)
        if not len(words):
            return Segment(original, truncated=cut)
        breaks = starts_sentence & space
        for i in np.flatnonzero(space & ~starts_sentence).tolist():
            breaks[i] = "\n" in cleaned[idx[i] : idx[i] + length[i]]
        opens = starts_sentence[words] | _seen_since_previous(breaks, words)
        opens[0] = True
        # Sentences longer than max_words are cut into pieces; at most max_sentences pieces are kept.
        max_words, max_sentences = self.config.max_words, self.config.max_sentences
        bounds = [*np.flatnonzero(opens).tolist(), len(words)]
        lengths: list[int] = []
        for first, last in pairwise(bounds):
            full, rest = divmod(last - first, max_words)
            lengths += [max_words] * full + ([rest] if rest else [])
        if len(lengths) > max_sentences:
            lengths, cut = lengths[:max_sentences], True
        words = words[: sum(lengths)]
        starts = idx[words].astype(np.int64)
        return Segment(original, starts, starts + length[words].astype(np.int64), orth[words], np.array(lengths), cut)


def _seen_since_previous(flags: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """For each of the increasing ``positions``: is any of ``flags`` set strictly between the
    previous position (or the start) and it?"""
    before = np.concatenate([[0], np.cumsum(flags)])  # before[i]: flags set among tokens < i
    previous_end = np.concatenate([[0], positions[:-1] + 1])
    return before[positions] > before[previous_end]
