"""The API's types: what ``POST /classify`` takes and returns, ``GET /model``, and error bodies.

The result types are han's own (``han.DocumentResult`` and its parts): the response schema at
``/docs`` is derived from them, so the service returns exactly what the pipeline gives, with the ids
the service attaches. The request schema states every rule the service applies to a request, so that
the schema at ``/docs`` says exactly what is accepted (but the body's byte limit, a 413).
"""

from __future__ import annotations

from contextvars import ContextVar
from pathlib import PurePosixPath, PureWindowsPath
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StringConstraints

import han
from han.methods import DEFAULT_METHOD, METHODS

MAX_DOCUMENTS = 256  # per request
MAX_BODY_BYTES = 10 * 1024 * 1024  # per request
MAX_ID_CHARS = 200  # a client's document id
Method = Literal[METHODS]  # type: ignore[valid-type]  # the names of han.methods, in the schema at /docs
# The body the request guard validated, and the result: BentoML's own parse of the body takes it.
VALIDATED: ContextVar[tuple[bytes, ClassifyRequest] | None] = ContextVar("han_validated_request", default=None)

# A document has a word: han.segment.has_words, as one regex that means the same in ECMA-262 (JSON
# Schema's dialect, which Schemathesis and clients read) and in Python's re (which the service applies).
# Blank: whitespace (str.isspace) or a character clean_text removes (controls, zero-width marks, BOM,
# invisible format characters; a soft hyphen or word joiner, which stays only between two word characters;
# not lone surrogates: no JSON text the service accepts holds one, and JSON Schema validators reject the
# range); a break tag (<br>, <br/>, <p>, </p>, any case, whitespace inside) is blank too.
# A document has a word where, after blanks and break tags, comes a character that is neither blank
# nor the start of a break tag. Written out as ranges (tests/test_service_units.py checks them against
# han.segment), and without nested repeats, so that it runs in linear time.
_SPACE = r"\u0009-\u000d\u001c-\u0020\u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
_BLANK = (r"\u0000-\u0020\u007f-\u00a0\u00ad\u061c\u1680\u180e\u2000-\u200f\u2028-\u202f\u205f-\u2064\u2066-\u2069"
          r"\u3000\ufeff\ufff9-\ufffb")
_TAG_REST = rf"[{_SPACE}]*(?:[Bb][Rr]|/?[Pp])[{_SPACE}]*(?:/[{_SPACE}]*)?>"  # a break tag after its "<"
HAS_WORDS = rf"^[{_BLANK}]*(?:<{_TAG_REST}[{_BLANK}]*)*(?:[^{_BLANK}<]|<(?!{_TAG_REST}))"
TEXT_RULE = (
    "At least one word: a character other than whitespace, control, zero-width or invisible format characters "
    "(bidi controls, soft hyphens, word joiners) and the break "
    "tags `<br>`, `<br/>`, `<p>` and `</p>` (what the model's segmenter reads as blank). The pattern states "
    "exactly this rule, and the service applies that same pattern. One refusal the schema cannot state (a "
    "model's caps are not in it): a text with no word within its first max_chars characters (GET /model's "
    "limits; 100,000 by default) gets a 422. Text past the caps is cut (the result says truncated: true)."
)

Text = Annotated[str, StringConstraints(strict=True, pattern=HAS_WORDS)]
# No NUL character: PostgreSQL's text cannot hold one, and SQLite's length() stops at it, so the feedback
# store would refuse the id (one pattern in ECMA-262, Python's re and pydantic's own engine alike)
ID_PATTERN = r"^[^\u0000]*$"
DocumentId = Annotated[str, StringConstraints(strict=True, min_length=1, max_length=MAX_ID_CHARS, pattern=ID_PATTERN)]


class Document(BaseModel):
    """A document with the client's own id, which its result carries."""

    model_config = ConfigDict(extra="forbid", regex_engine="python-re")  # python-re: HAS_WORDS looks ahead

    id: DocumentId = Field(
        description=f"The client's id for the document (1 to {MAX_ID_CHARS} characters, no NUL), returned as its "
        "result's id. Not checked for uniqueness: results come back in input order whatever the ids."
    )
    text: Text = Field(description=TEXT_RULE)


class ClassifyRequest(BaseModel):
    """Documents to classify, in the order the results should come back."""

    model_config = ConfigDict(
        extra="forbid",
        regex_engine="python-re",
        json_schema_extra={
            "example": {"documents": [{"id": "review-1", "text": "A moving, beautifully acted film."},
                                      "Dull and far too long."], "explain": True}
        },
    )

    documents: list[Text | Document] = Field(
        min_length=1,
        max_length=MAX_DOCUMENTS,
        description=f"1 to {MAX_DOCUMENTS} documents, each a text or an object {{\"id\": ..., \"text\": ...}} "
        "(a request may mix both): a result carries the object's id, else one the service makes. " + TEXT_RULE,
    )
    explain: StrictBool | Method = Field(
        default=True,
        description="Explain each prediction: false for no explanation (the sentences key is left out), true "
        f"for the default method ({DEFAULT_METHOD}), or a method: attention (the model's attention, >= 0; a "
        "word's weight is within its sentence), attention_gradient (attention times its gradient), "
        "integrated_gradients (over the word embeddings) or occlusion (the drop in the label's probability "
        "when the sentence or word is taken out). The last three are signed: positive weights are evidence "
        "for the label, negative against it, and a word's weight is its share of the whole document.",
    )

    @classmethod
    def model_validate_json(cls, json_data: str | bytes | bytearray, **kwargs: Any) -> ClassifyRequest:
        """BentoML parses a /classify body with this: the body the guard has validated is not parsed again."""
        validated = VALIDATED.get()
        if validated is not None and validated[0] == json_data and not kwargs:
            VALIDATED.set(None)  # taken once: the request's context no longer holds the body
            request = validated[1]  # as BentoML's own subclass of this model, without validating again
            return cls.model_construct(request.model_fields_set, **dict(request))
        return super().model_validate_json(json_data, **kwargs)


class ClassifyResponse(BaseModel):
    request_id: str = Field(
        description="This request's unique id (32 hex digits, random): with a result's id, where its answer "
        "is found again."
    )
    results: list[han.DocumentResult] = Field(
        description="One result per document, in input order, each with its id: the document's own, else "
        "`request_id-index` (index: the document's position in the request, from 0)."
    )
    model: str = Field(description="The model version that answered (NAME:VERSION in the model store).")

    def model_dump_json(self, **kwargs: Any) -> str:
        """Absent, not null: the explanation keys of a result that has none (how BentoML sends the response)."""
        kwargs.setdefault("exclude_none", True)
        return super().model_dump_json(**kwargs)


class ModelInfo(BaseModel):
    tag: str = Field(description="The model's tag in the BentoML model store.")
    labels: list[str]
    language: str = Field(description="The documents' language (a spaCy code): its tokenizer segments them.")
    task: Literal["single-label", "multi-label"]
    threshold: float | None = Field(description="Decision threshold of a multi-label model; null for single-label.")
    temperature: float = Field(description="Scores are probabilities of logits / temperature (1: uncalibrated).")
    calibration: dict[str, Any] | None = Field(
        description="Expected calibration error before and after the temperature, per evaluated split, if recorded."
    )
    trained_at: str | None = Field(description="When the model was trained (from its metadata), if recorded.")
    dataset: str | None = Field(
        description="What it was trained on (its metadata's dataset, else train_data), if recorded."
    )
    metrics: dict[str, Any] | None = Field(description="Evaluation metrics (from its metadata), if recorded.")
    baseline: dict[str, Any] | None = Field(
        description="TF-IDF + logistic regression trained on the same labelled documents, scored on the same splits "
        "with the same metrics as `metrics` (and, when it scored above the model on validation, `advice`), if recorded."
    )
    ngram_head: dict[str, Any] | None = Field(
        description="When the fit kept its TF-IDF baseline as an n-gram head beside the HAN (averaging the two scored "
        "better on validation): every score is han_share x the HAN's + (1 - han_share) x the head's; with the "
        "validation score of each and of the average, and the head's n-gram count. Null: the HAN alone."
    )
    faithfulness: dict[str, Any] | None = Field(
        description="How faithful each explanation method was on held-out data, if measured: each measure, the random "
        "ranking's, and their ratio (x_random) with a bootstrap interval over the documents."
    )
    explanation_methods: list[str] = Field(description="The values `explain` takes besides true and false.")
    metadata: dict[str, Any] = Field(description="Everything the training code recorded with the model.")
    registered_at: str = Field(description="When the model was saved into the model store.")
    architecture: dict[str, Any] = Field(description="The network's configuration (han.HANConfig).")
    limits: dict[str, int] = Field(description="Request limits and the model's document caps.")


class ErrorBody(BaseModel):
    error: str = Field(description="What is wrong with the request, e.g. 'documents[3]: the document is empty'.")


def without_paths(value: Any) -> Any:
    """``value`` with every file-system path of the training machine cut to its last part
    (``/home/ana/data/train.csv`` -> ``train.csv``): a client learns the file's name, not the machine's
    layout. A path is a string without spaces holding a slash or a backslash, and not a URL."""
    if isinstance(value, dict):
        return {k: without_paths(v) for k, v in value.items()}
    if isinstance(value, list):
        return [without_paths(v) for v in value]
    if isinstance(value, str) and ("/" in value or "\\" in value) and "://" not in value and " " not in value:
        return PureWindowsPath(value).name if "\\" in value else PurePosixPath(value.rstrip("/")).name
    return value


def model_info(tag: str, registered_at: str, saved: han.SavedModel) -> ModelInfo:
    """GET /model's answer for a loaded model (without the training machine's paths)."""
    meta = without_paths(saved.metadata)
    config = saved.config
    metrics = meta["metrics"] if isinstance(meta.get("metrics"), dict) else None
    calibration = {
        split: {k: v for k, v in figures.items() if k.startswith("ece_")}
        for split, figures in (metrics or {}).items()
        if isinstance(figures, dict) and "ece_after" in figures
    }
    return ModelInfo(
        tag=tag,
        labels=saved.labels,
        language=saved.segmenter.language,
        task="multi-label" if config.multi_label else "single-label",
        threshold=saved.threshold if config.multi_label else None,
        temperature=saved.temperature,
        calibration=calibration or None,
        trained_at=None if meta.get("trained_at") is None else str(meta["trained_at"]),
        dataset=next((str(meta[key]) for key in ("dataset", "train_data") if meta.get(key) is not None), None),
        metrics=metrics,
        baseline=meta["baseline"] if isinstance(meta.get("baseline"), dict) else None,
        ngram_head=meta["ngram_head"] if saved.ngrams is not None and isinstance(meta.get("ngram_head"), dict)
        else None,
        faithfulness=meta["faithfulness"] if isinstance(meta.get("faithfulness"), dict) else None,
        explanation_methods=list(METHODS),
        metadata=meta,
        registered_at=registered_at,
        architecture=config.to_dict(),
        limits={
            "max_documents": MAX_DOCUMENTS,
            "max_body_bytes": MAX_BODY_BYTES,
            **{key: int(value) for key, value in saved.segmenter.to_dict().items() if key != "language"},
        },
    )
