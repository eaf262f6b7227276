"""What the pipeline returns: one set of result types for every caller.

Plain dataclasses with slots (a full explanation makes one object per word; without a ``__dict__``
each is made faster and smaller). The service's response schema is derived
from them (pydantic reads the attribute docstrings below as field descriptions), and han-score's
output columns are named after their fields (``scoring.formats``). Scores and weights are rounded
to ``DECIMALS`` places.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DECIMALS = 6  # places kept for scores and weights (a float32 holds about 7 significant digits)


@dataclass(slots=True)
class WordWeight:
    """A word and its weight in the explanation."""

    __pydantic_config__ = {"use_attribute_docstrings": True}  # noqa: RUF012  (read by pydantic, not here)

    text: str
    """The word exactly as in the document: document[start:end]."""
    start: int
    """Character offset of the word in the document (Python string index)."""
    end: int
    """Character offset just past the word."""
    weight: float
    """In a full explanation, the attention on the word within its sentence (a sentence's words sum to 1);
    in a top-k list, that times its sentence's weight (every word of the document sums to 1)."""


@dataclass(slots=True)
class NgramWeight:
    """An n-gram of the document and what it added to the label in the model's n-gram head."""

    __pydantic_config__ = {"use_attribute_docstrings": True}  # noqa: RUF012

    text: str
    """The n-gram (one or two words), lowercased as the head reads it."""
    weight: float
    """Its tf-idf value times the head's weight for the label: signed, positive for the label."""


@dataclass(slots=True)
class SentenceWeight:
    """A sentence, its weight in the explanation and, in a full explanation, its words."""

    __pydantic_config__ = {"use_attribute_docstrings": True}  # noqa: RUF012

    text: str
    """The sentence exactly as in the document: document[start:end]."""
    start: int
    """Character offset of the sentence in the document."""
    end: int
    """Character offset just past the sentence."""
    weight: float
    """Attention on the sentence within the document (the sentences sum to 1)."""
    words: list[WordWeight] | None = None
    """Its words with their attention (full explanations only)."""


@dataclass(slots=True)
class DocumentResult:
    """The classification of one document and, when asked for, its explanation."""

    __pydantic_config__ = {"use_attribute_docstrings": True}  # noqa: RUF012

    id: str | None = field(default=None, kw_only=True)
    """The document's id, by which its answer is found again: in a /classify response the client's own,
    else one the service made (`request_id-index`, e.g. `9f0c...e2-0`); han-score's id column is the
    same role. han.Pipeline leaves it None: it classifies texts, in the order given."""
    label: str
    """The label with the highest score."""
    labels: list[str]
    """Every label scored at or over the threshold (multi-label models), else the top label alone."""
    scores: dict[str, float]
    """Every label's probability."""
    truncated: bool
    """The document was longer than the model's caps and was cut."""
    method: str | None = None
    """The explanation method that produced the weights (absent without an explanation): attention
    (>= 0, a word's weight within its sentence), attention_gradient, integrated_gradients or occlusion
    (signed: positive for the label, negative against it; a word's weight is its share of the document)."""
    sentences: list[SentenceWeight] | None = None
    """Full explanation: every sentence and word with its attention (absent unless asked for)."""
    top_sentences: list[SentenceWeight] | None = None
    """Top-k explanation: the heaviest sentences, heaviest first (absent unless asked for)."""
    top_words: list[WordWeight] | None = None
    """Top-k explanation: the heaviest words of the whole document, heaviest first (absent unless asked for)."""
    top_ngrams: list[NgramWeight] | None = None
    """With an explanation, for a model with an n-gram head (its share of the scores is in GET /model):
    the n-grams that moved the head toward or away from the label most, heaviest first. The sentence and
    word weights explain the HAN's share."""


@dataclass(slots=True)
class DocumentError:
    """A document that could not be classified (returned in its place when errors="return")."""

    index: int
    """Its position in the input."""
    reason: str
    """Why, e.g. 'the document is empty or whitespace only'."""
