"""Writing ``han-score`` output: chunks committed atomically, merged into the final file at the end.

While a job runs, its output lives in ``OUTPUT.parts/``:

    manifest.json          the commit record: job settings, committed parts, next input row, counts
    part-000000.<ext>      scored rows of chunk 0 (Parquet, JSON Lines or CSV without header)
    errors-000000.jsonl    rows of chunk 0 that could not be scored (only when there are some)

A chunk is committed by writing its files under temporary names, fsync-ing and renaming them
(``os.replace``), then replacing ``manifest.json`` the same way: the manifest is the single
commit point. A run killed at any moment leaves at worst files the manifest does not list;
``--resume`` deletes those and carries on from the manifest's ``next_row``. When every row is
committed, the parts are merged into ``OUTPUT`` and ``OUTPUT.errors.jsonl`` (again through a
temporary file and ``os.replace``), the manifest is marked ``merged``, and the folder is removed.
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import io
import json
import os
import shutil
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from service.batch_worker import OK

MANIFEST_FORMAT = "han-score-manifest/1"
OUTPUT_FORMATS = (".parquet", ".jsonl", ".csv")


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

    def columns(self) -> list[str]:
        cols = ["row"] + (["id"] if self.has_id else []) + ["label"] + (["labels"] if self.multi_label else [])
        cols += [f"score_{label}" for label in self.labels] + ["truncated"]
        return cols + (["top_sentences", "top_words"] if self.explain else [])


@dataclass
class Chunk:
    """Results of consecutive input rows, columnar, plus the rows that failed."""

    spec: OutputSpec
    rows: list[int] = field(default_factory=list)
    ids: list[Any] = field(default_factory=list)
    label: list[str] = field(default_factory=list)
    labels: list[list[str]] = field(default_factory=list)
    scores: list[list[float]] = field(default_factory=list)
    truncated: list[bool] = field(default_factory=list)
    top_sentences: list[list[dict]] = field(default_factory=list)
    top_words: list[list[dict]] = field(default_factory=list)
    errors: list[dict] = field(default_factory=list)
    label_counts: Counter[str] = field(default_factory=Counter)

    def add(self, row: int, id_value: Any, result: tuple) -> None:
        if result[0] != OK:
            error = (
                {"row": row, "id": id_value, "reason": result[1]}
                if self.spec.has_id
                else {"row": row, "reason": result[1]}
            )
            self.errors.append(error)
            return
        _, label, labels, scores, truncated, top_sentences, top_words = result
        self.rows.append(row)
        self.ids.append(id_value)
        self.label.append(label)
        self.labels.append(labels)
        self.scores.append(scores)
        self.truncated.append(truncated)
        self.top_sentences.append(top_sentences)
        self.top_words.append(top_words)
        self.label_counts.update(labels if self.spec.multi_label else [label])

    @property
    def last_row(self) -> int:
        return max(self.rows[-1] if self.rows else -1, self.errors[-1]["row"] if self.errors else -1)

    @property
    def scored(self) -> int:
        return len(self.rows)

    @property
    def size(self) -> int:
        return len(self.rows) + len(self.errors)

    def records(self) -> list[dict[str, Any]]:
        """Row dicts in output column order (JSON Lines and CSV)."""
        spec = self.spec
        score_cols = [f"score_{label}" for label in spec.labels]
        out = []
        for k, row in enumerate(self.rows):
            rec: dict[str, Any] = {"row": row}
            if spec.has_id:
                rec["id"] = self.ids[k]
            rec["label"] = self.label[k]
            if spec.multi_label:
                rec["labels"] = self.labels[k]
            rec.update(zip(score_cols, self.scores[k], strict=True))
            rec["truncated"] = self.truncated[k]
            if spec.explain:
                rec["top_sentences"] = self.top_sentences[k]
                rec["top_words"] = self.top_words[k]
            out.append(rec)
        return out


# ---------------------------------------------------------------------------------------------
# Formats


class OutputFormat:
    suffix = ""

    def __init__(self, spec: OutputSpec) -> None:
        self.spec = spec

    def write_part(self, chunk: Chunk, f: IO[bytes]) -> None:
        raise NotImplementedError

    def merge(self, parts: list[Path], f: IO[bytes]) -> None:
        _concatenate(parts, f)


class JsonLinesFormat(OutputFormat):
    suffix = ".jsonl"

    def write_part(self, chunk: Chunk, f: IO[bytes]) -> None:
        f.write("".join(_json_line(rec) for rec in chunk.records()).encode("utf-8"))


class CsvFormat(OutputFormat):
    """Plain CSV with a header; list-valued cells (labels, explanations) are JSON text."""

    suffix = ".csv"

    def write_part(self, chunk: Chunk, f: IO[bytes]) -> None:
        text = io.TextIOWrapper(f, encoding="utf-8", newline="")
        writer = csv.writer(text)
        for rec in chunk.records():
            writer.writerow([json.dumps(v, ensure_ascii=False) if isinstance(v, list) else v for v in rec.values()])
        text.flush()
        text.detach()

    def merge(self, parts: list[Path], f: IO[bytes]) -> None:
        text = io.TextIOWrapper(f, encoding="utf-8", newline="")
        csv.writer(text).writerow(self.spec.columns())
        text.flush()
        text.detach()
        _concatenate(parts, f)


class ParquetFormat(OutputFormat):
    suffix = ".parquet"

    def __init__(self, spec: OutputSpec) -> None:
        super().__init__(spec)
        import pyarrow as pa

        span = pa.struct([("text", pa.string()), ("start", pa.int64()), ("end", pa.int64()), ("weight", pa.float64())])
        fields = [pa.field("row", pa.int64())]
        if spec.has_id:
            fields.append(pa.field("id", pa.int64() if spec.id_is_int else pa.string()))
        fields.append(pa.field("label", pa.string()))
        if spec.multi_label:
            fields.append(pa.field("labels", pa.list_(pa.string())))
        fields += [pa.field(f"score_{label}", pa.float64()) for label in spec.labels]
        fields.append(pa.field("truncated", pa.bool_()))
        if spec.explain:
            fields += [pa.field("top_sentences", pa.list_(span)), pa.field("top_words", pa.list_(span))]
        self.schema = pa.schema(fields)

    def write_part(self, chunk: Chunk, f: IO[bytes]) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        spec = self.spec
        data: dict[str, list] = {"row": chunk.rows}
        if spec.has_id:
            data["id"] = chunk.ids if spec.id_is_int else [None if v is None else str(v) for v in chunk.ids]
        data["label"] = chunk.label
        if spec.multi_label:
            data["labels"] = chunk.labels
        for j, label in enumerate(spec.labels):
            data[f"score_{label}"] = [s[j] for s in chunk.scores]
        data["truncated"] = chunk.truncated
        if spec.explain:
            data["top_sentences"] = chunk.top_sentences
            data["top_words"] = chunk.top_words
        pq.write_table(pa.Table.from_pydict(data, schema=self.schema), f)

    def merge(self, parts: list[Path], f: IO[bytes]) -> None:
        import pyarrow.parquet as pq

        with pq.ParquetWriter(f, self.schema) as writer:
            for part in parts:  # one chunk in memory at a time
                writer.write_table(pq.read_table(part, schema=self.schema))


FORMATS: dict[str, type[OutputFormat]] = {".parquet": ParquetFormat, ".jsonl": JsonLinesFormat, ".csv": CsvFormat}


def check_output_path(path: Path) -> None:
    if path.suffix.lower() not in FORMATS:
        raise OutputError(
            f"{path}: unsupported output type {path.suffix or '(no extension)'!r} (use {', '.join(OUTPUT_FORMATS)})"
        )


def output_format(path: Path, spec: OutputSpec) -> OutputFormat:
    check_output_path(path)
    return FORMATS[path.suffix.lower()](spec)


def _concatenate(parts: list[Path], f: IO[bytes]) -> None:
    for part in parts:
        with open(part, "rb") as src:
            shutil.copyfileobj(src, f, 1 << 20)


def _json_line(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str) + "\n"


# ---------------------------------------------------------------------------------------------
# The partial output of a job and its manifest


def errors_path(output: Path) -> Path:
    return output.with_name(output.name + ".errors.jsonl")


def parts_dir(output: Path) -> Path:
    return output.with_name(output.name + ".parts")


class PartialOutput:
    """``OUTPUT.parts/``: committed chunks of a job and the manifest that records them."""

    def __init__(self, output: Path, fmt: OutputFormat) -> None:
        self.output = output
        self.errors_path = errors_path(output)
        self.dir = parts_dir(output)
        self.manifest_path = self.dir / "manifest.json"
        self.fmt = fmt
        self.manifest: dict[str, Any] = {}
        self._lock_fd: int | None = None

    # -- opening

    def lock(self) -> None:
        """Hold an exclusive lock on the folder for this process's life (released even by kill -9)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.dir / ".lock", os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise OutputError(f"{self.output}: another han-score run is writing this output right now") from None
        self._lock_fd = fd

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def read_manifest(self) -> dict[str, Any] | None:
        """The committed manifest, or None if the folder has none (nothing was committed)."""
        try:
            manifest = json.loads(self.manifest_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            raise OutputError(f"{self.manifest_path}: unreadable manifest ({e}); use --overwrite to start over") from e
        if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
            raise OutputError(f"{self.manifest_path}: not a han-score manifest; use --overwrite to start over")
        return manifest

    def start(self, job: dict[str, Any]) -> None:
        """Begin a new job here: drop whatever the folder holds and commit an empty manifest."""
        self._remove_files(keep=set())
        self.manifest = {
            "format": MANIFEST_FORMAT,
            "job": job,
            "state": "running",
            "next_row": 0,
            "parts": [],
            "counts": {"read": 0, "scored": 0, "failed": 0, "labels": {}},
            "elapsed_s": 0.0,
            "runs": 0,
        }
        self._write_manifest()

    def resume(self, manifest: dict[str, Any]) -> None:
        """Continue the job of ``manifest``: delete files it does not list (uncommitted leftovers)."""
        self.manifest = manifest
        if manifest["state"] == "merged":  # killed while cleaning up: finish() only has to remove the folder
            return
        keep = {"manifest.json"}
        for part in manifest["parts"]:
            keep.add(part["file"])
            if part.get("errors_file"):
                keep.add(part["errors_file"])
        missing = [name for name in sorted(keep) if not (self.dir / name).is_file()]
        if missing:
            raise OutputError(f"{self.dir}: committed files are missing ({', '.join(missing)}); use --overwrite")
        self._remove_files(keep)

    # -- committing

    @property
    def next_row(self) -> int:
        return int(self.manifest["next_row"])

    def commit(self, chunk: Chunk, next_row: int, elapsed_s: float) -> None:
        """Make ``chunk`` durable, then record it (and that input rows < next_row are done) in the manifest."""
        index = len(self.manifest["parts"])
        name = f"part-{index:06d}{self.fmt.suffix}"
        _atomic_write(self.dir / name, lambda f: self.fmt.write_part(chunk, f))
        part: dict[str, Any] = {"file": name, "rows": chunk.scored, "errors": len(chunk.errors)}
        if chunk.errors:
            part["errors_file"] = f"errors-{index:06d}.jsonl"
            data = "".join(_json_line(e) for e in chunk.errors).encode("utf-8")
            _atomic_write(self.dir / part["errors_file"], lambda f: f.write(data))
        counts = self.manifest["counts"]
        counts["read"] += chunk.size
        counts["scored"] += chunk.scored
        counts["failed"] += len(chunk.errors)
        labels = Counter(counts["labels"])
        labels.update(chunk.label_counts)
        counts["labels"] = dict(sorted(labels.items()))
        self.manifest["parts"].append(part)
        self.manifest["next_row"] = next_row
        self.manifest["elapsed_s"] = elapsed_s
        self._write_manifest()

    def record_elapsed(self, elapsed_s: float, runs: int) -> None:
        self.manifest["elapsed_s"] = elapsed_s
        self.manifest["runs"] = runs
        self._write_manifest()

    def finish(self) -> None:
        """Merge the committed parts into OUTPUT and OUTPUT.errors.jsonl, then remove the folder."""
        if self.manifest["state"] != "merged":
            parts = [self.dir / p["file"] for p in self.manifest["parts"]]
            errors = [self.dir / p["errors_file"] for p in self.manifest["parts"] if p.get("errors_file")]
            merged = self.dir / ("merged" + self.fmt.suffix)
            _atomic_write(merged, lambda f: self.fmt.merge(parts, f))
            merged_errors = self.dir / "merged.errors.jsonl"
            _atomic_write(merged_errors, lambda f: _concatenate(errors, f))
            os.replace(merged, self.output)
            os.replace(merged_errors, self.errors_path)
            _fsync_dir(self.output.parent)
            self.manifest["state"] = "merged"
            self._write_manifest()
        self.remove()

    def remove(self) -> None:
        """Delete the folder (the manifest last, so a kill midway leaves a folder --resume understands)."""
        if not self.dir.exists():
            return
        self._remove_files(keep={"manifest.json", ".lock"})
        with contextlib.suppress(FileNotFoundError):
            self.manifest_path.unlink()
        with contextlib.suppress(FileNotFoundError):
            (self.dir / ".lock").unlink()
        with contextlib.suppress(OSError):
            self.dir.rmdir()
        self.unlock()

    # -- helpers

    def _write_manifest(self) -> None:
        data = json.dumps(self.manifest, indent=1, ensure_ascii=False, default=str).encode("utf-8")
        _atomic_write(self.manifest_path, lambda f: f.write(data))
        _fsync_dir(self.dir)

    def _remove_files(self, keep: set[str]) -> None:
        for entry in self.dir.iterdir():
            if entry.name in keep or entry.name == ".lock":
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()


def _atomic_write(path: Path, write: Callable[[IO[bytes]], Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
