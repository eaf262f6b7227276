"""The one scoring function of han-score: a window of raw input values in, output columns out.

Every engine calls ``score_texts``: this process, the worker processes, and any distributed engine.
Labels, scores, explanations and bad rows are decided in this one place, by ``han.Pipeline``
(errors returned, not raised), and come back as columns named after ``han.DocumentResult``'s
fields, so nothing downstream builds per-row objects.

This module (and ``scoring.formats``, which declares the output) imports only the standard library
at the top: scoring workers are spawned and import it before anything else, and ``han`` (torch,
spaCy) is imported inside the functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scoring.formats import Chunk, ScoredWindow, arrow_schema, span_records

if TYPE_CHECKING:
    from han import Pipeline


@dataclass(frozen=True)
class ScoringOptions:
    explain: bool | str | None = None  # as han.Pipeline's: None no explanation, True the default method, or one
    top_sentences: int = 3
    top_words: int = 5


def score_texts(pipeline: Pipeline, texts: list[Any], options: ScoringOptions) -> ScoredWindow:
    """Score a window of raw input values; a bad value becomes an error row and never raises."""
    from han import DocumentError, TopK

    top = TopK(options.top_sentences, options.top_words)
    out = ScoredWindow()
    labels = pipeline.labels
    for i, r in enumerate(pipeline(texts, explain=options.explain, errors="return", top=top)):
        if isinstance(r, DocumentError):
            out.errors.append((i, r.reason))
            continue
        out.index.append(i)
        out.label.append(r.label)
        out.labels.append(r.labels)
        out.scores.append([r.scores[label] for label in labels])
        out.truncated.append(r.truncated)
        out.method.append(r.method)
        out.top_sentences.append(span_records(r.top_sentences) if r.top_sentences is not None else None)
        out.top_words.append(span_records(r.top_words) if r.top_words is not None else None)
        out.top_ngrams.append(None if r.top_ngrams is None else [{"text": n.text, "weight": n.weight}
                                                                  for n in r.top_ngrams])
    return out


def score_batch(
    pipeline: Pipeline, batch: Any, spec: Any, options: ScoringOptions, text_column: str, id_column: str | None,
    row_column: str | None = None,
) -> Any:
    """A batch of input rows (an Arrow table or a pandas frame) in, one Arrow table out: the output
    columns of ``spec`` plus ``reason`` (null for a scored row, the error for a bad one).

    This is ``score_texts`` plus the same ``formats.Chunk`` the local engine commits, so both engines
    decide labels, scores, explanations and bad rows in one place; the Ray actors call it per batch.
    ``row_column`` holds the input row index where the engine knows it (else ``row`` is null).
    """
    import pyarrow as pa

    table = batch if isinstance(batch, pa.Table) else pa.Table.from_pandas(batch, preserve_index=False)
    texts = table.column(text_column).to_pylist()
    n = len(texts)
    ids = table.column(id_column).to_pylist() if id_column else [None] * n
    rows = table.column(row_column).to_pylist() if row_column else list(range(n))
    chunk = Chunk(spec)
    chunk.add(rows, ids, score_texts(pipeline, texts, options))
    schema = arrow_schema(spec).append(pa.field("reason", pa.string()))
    data = dict(chunk.columns) or {name: [] for name in spec.columns()}
    if spec.has_id and not spec.id_is_int:
        data["id"] = [None if v is None else str(v) for v in data["id"]]
    data["reason"] = [None] * len(data["row"])
    for e in chunk.errors:  # bad rows: row, id and reason; every other column null
        for name in data:
            data[name].append(e.get(name))
        if spec.has_id and not spec.id_is_int and e.get("id") is not None:
            data["id"][-1] = str(e["id"])
    if not row_column:
        data["row"] = [None] * len(data["row"])
    return pa.Table.from_pydict(data, schema=schema)

