"""han-score's output, declared here and nowhere else: its columns and their types, a window and a
chunk of scored rows held as columns, and the three file formats a chunk is written in.

The columns are named after ``han.DocumentResult``'s fields (a test keeps them so): ``row``, ``id``
(with --id-column), ``label``, ``labels`` (multi-label models), one ``score_<label>`` per label,
``truncated``, and with --explain ``method``, ``top_sentences`` and ``top_words`` (and ``top_ngrams``
for a model with an n-gram head)."""

from __future__ import annotations

import csv
import io
import json
import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

OUTPUT_FORMATS = (".parquet", ".jsonl", ".csv")
PER_ROW = ("label", "labels", "truncated", "method", "top_sentences", "top_words", "top_ngrams")  # ScoredWindow's
EXPLANATION = ("method", "top_sentences", "top_words")  # written with --explain only


@dataclass
class ScoredWindow:
    """Columns for the rows that were scored (``index``: their positions in the window), and the
    rows that were not (``errors``: position, reason)."""

    index: list[int] = field(default_factory=list)
    label: list[str] = field(default_factory=list)
    labels: list[list[str]] = field(default_factory=list)
    scores: list[list[float]] = field(default_factory=list)  # per row, in the model's label order
    truncated: list[bool] = field(default_factory=list)
    method: list[str | None] = field(default_factory=list)
    top_sentences: list[list[dict] | None] = field(default_factory=list)
    top_words: list[list[dict] | None] = field(default_factory=list)
    top_ngrams: list[list[dict] | None] = field(default_factory=list)
    errors: list[tuple[int, str]] = field(default_factory=list)


class OutputError(Exception):
    """The output cannot be written as asked (the message names the problem in one line)."""


@dataclass(frozen=True)
class OutputSpec:
    """The columns of the output file."""

    labels: list[str]
    multi_label: bool
    has_id: bool
    id_is_int: bool  # Parquet keeps an integer id column as int64; any other id is written as text
    explain: bool
    ngrams: bool = False  # the model has an n-gram head: --explain adds its top n-grams

    def columns(self) -> list[str]:
        """The column names in file order."""
        names = ["row"] + (["id"] if self.has_id else []) + ["label"] + (["labels"] if self.multi_label else [])
        names += [f"score_{label}" for label in self.labels] + ["truncated"]
        return names + (list(EXPLANATION) + (["top_ngrams"] if self.ngrams else []) if self.explain else [])


@dataclass
class Chunk:
    """Results of consecutive input rows, columnar, plus the rows that failed."""

    spec: OutputSpec
    columns: dict[str, list] = field(default_factory=dict)
    errors: list[dict] = field(default_factory=list)
    label_counts: Counter[str] = field(default_factory=Counter)
    last_row: int = -1

    def add(self, rows: list[int], ids: list[Any], scored: ScoredWindow) -> None:
        """A scored window whose i-th value was input row ``rows[i]`` (id ``ids[i]``)."""
        spec = self.spec
        for i, reason in scored.errors:
            self.errors.append({"row": rows[i], **({"id": ids[i]} if spec.has_id else {}), "reason": reason})
        if not self.columns:
            self.columns = {name: [] for name in spec.columns()}
        c = self.columns
        c["row"] += [rows[i] for i in scored.index]
        if spec.has_id:
            c["id"] += [ids[i] for i in scored.index]
        for name in PER_ROW:
            if name in c:
                c[name] += getattr(scored, name)
        for j, label in enumerate(spec.labels):
            c[f"score_{label}"] += [s[j] for s in scored.scores]
        if spec.multi_label:
            self.label_counts.update(label for chosen in scored.labels for label in chosen)
        else:
            self.label_counts.update(scored.label)
        if rows:
            self.last_row = max(self.last_row, rows[-1])

    @property
    def scored(self) -> int:
        return len(self.columns.get("row", []))

    @property
    def size(self) -> int:
        return self.scored + len(self.errors)

    def records(self) -> list[dict[str, Any]]:
        """Row dicts in output column order (JSON Lines and CSV)."""
        names = list(self.columns)
        return [dict(zip(names, values, strict=True)) for values in zip(*self.columns.values(), strict=True)]


class OutputFormat:
    suffix = ""

    def __init__(self, spec: OutputSpec) -> None:
        self.spec = spec

    def write_part(self, chunk: Chunk, f: IO[bytes]) -> None:
        raise NotImplementedError

    def merge(self, parts: list[Path], f: IO[bytes]) -> None:
        concatenate(parts, f)


class JsonLinesFormat(OutputFormat):
    suffix = ".jsonl"

    def write_part(self, chunk: Chunk, f: IO[bytes]) -> None:
        write_jsonl(chunk.records(), f)


class CsvFormat(OutputFormat):
    """Plain CSV with a header; list-valued cells (labels, explanations) are JSON text."""

    suffix = ".csv"

    def write_part(self, chunk: Chunk, f: IO[bytes]) -> None:
        write_csv(chunk.records(), f)

    def merge(self, parts: list[Path], f: IO[bytes]) -> None:
        text = io.TextIOWrapper(f, encoding="utf-8", newline="")
        csv.writer(text).writerow(self.spec.columns())
        text.flush()
        text.detach()
        concatenate(parts, f)


class ParquetFormat(OutputFormat):
    suffix = ".parquet"

    def __init__(self, spec: OutputSpec) -> None:
        super().__init__(spec)
        self.schema = arrow_schema(spec)

    def write_part(self, chunk: Chunk, f: IO[bytes]) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        data = dict(chunk.columns) or {name: [] for name in self.spec.columns()}
        if self.spec.has_id and not self.spec.id_is_int:
            data["id"] = [None if v is None else str(v) for v in data["id"]]
        pq.write_table(pa.Table.from_pydict(data, schema=self.schema), f)

    def merge(self, parts: list[Path], f: IO[bytes]) -> None:
        import pyarrow.parquet as pq

        with pq.ParquetWriter(f, self.schema) as writer:
            for part in parts:  # one chunk in memory at a time
                writer.write_table(pq.read_table(part, schema=self.schema))


def span_records(spans: list[Any]) -> list[dict[str, Any]]:
    """Top-k spans (``han.WordWeight`` or ``han.SentenceWeight``) as the records of a table cell."""
    return [{"text": s.text, "start": s.start, "end": s.end, "weight": s.weight} for s in spans]


def arrow_schema(spec: OutputSpec) -> Any:
    """The Arrow schema of the output columns (Parquet output, and the Ray engine's batches)."""
    import pyarrow as pa

    span = pa.struct([("text", pa.string()), ("start", pa.int64()), ("end", pa.int64()), ("weight", pa.float64())])
    types = {"row": pa.int64(), "id": pa.int64() if spec.id_is_int else pa.string(), "label": pa.string(),
             "labels": pa.list_(pa.string()), "truncated": pa.bool_(), "method": pa.string(),
             "top_sentences": pa.list_(span), "top_words": pa.list_(span),
             "top_ngrams": pa.list_(pa.struct([("text", pa.string()), ("weight", pa.float64())]))}
    return pa.schema([pa.field(name, types.get(name, pa.float64())) for name in spec.columns()])


FORMATS: dict[str, type[OutputFormat]] = {".parquet": ParquetFormat, ".jsonl": JsonLinesFormat, ".csv": CsvFormat}


def check_output_path(path: Path) -> None:
    if path.suffix.lower() not in FORMATS:
        raise OutputError(
            f"{path}: unsupported output type {path.suffix or '(no extension)'!r} (use {', '.join(OUTPUT_FORMATS)})"
        )


def errors_path(output: str, folder: bool = False) -> str:
    """Where the rows that cannot be scored go: ``OUTPUT.errors.jsonl``, or beside a folder of part
    files (--engine ray) the folder ``OUTPUT.errors``."""
    return output.rstrip("/") + (".errors" if folder else ".errors.jsonl")


def output_format(path: Path, spec: OutputSpec) -> OutputFormat:
    check_output_path(path)
    return FORMATS[path.suffix.lower()](spec)


def concatenate(parts: list[Path], f: IO[bytes]) -> None:
    for part in parts:
        with open(part, "rb") as src:
            shutil.copyfileobj(src, f, 1 << 20)


def write_jsonl(records: list[dict[str, Any]], f: IO[bytes]) -> None:
    """Records as JSON Lines (both engines' output)."""
    f.write("".join(json_line(rec) for rec in records).encode("utf-8"))


def write_csv(records: list[dict[str, Any]], f: IO[bytes], header: list[str] | None = None) -> None:
    """Records as CSV rows, list-valued cells as JSON text (both engines' output), after ``header``."""
    text = io.TextIOWrapper(f, encoding="utf-8", newline="")
    writer = csv.writer(text)
    if header:
        writer.writerow(header)
    for rec in records:
        writer.writerow([json.dumps(v, ensure_ascii=False) if isinstance(v, list) else v for v in rec.values()])
    text.flush()
    text.detach()


def json_line(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str) + "\n"
