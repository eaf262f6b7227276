"""Reading ``han-score`` input: Parquet, CSV or JSON Lines, streamed.

Parquet is read with pyarrow, batch by batch; CSV and JSON Lines with
``load_dataset(fmt, data_files=..., split="train", streaming=True)``. Either way only a batch of
rows is in memory at a time and a file larger than memory works. Every
problem with the input (missing file, unknown extension, unreadable data, missing column)
is raised as ``InputError`` with a one-line message naming it. A CSV or JSON Lines file is checked for
UTF-8 first (one pass over its bytes, about a second a gigabyte), so that a byte that is not is named by
its row before anything is scored.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Extension -> datasets builder.
INPUT_FORMATS = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".csv": "csv",
    ".jsonl": "json",
    ".ndjson": "json",
    ".json": "json",
}
READ_BATCH = 1_000  # rows per batch pulled from the stream


class InputError(Exception):
    """The input cannot be scored at all (the message names the problem in one line)."""


@dataclass
class InputFile:
    path: Path
    fmt: str  # datasets builder: parquet, csv or json
    text_column: str
    id_column: str | None
    columns: list[str]  # every column of the file ([] when it has no rows and no schema)
    id_is_int: bool  # the id column is an integer column (kept as int64 in Parquet output)
    empty: bool  # no rows at all

    def iter_rows(self, start: int = 0, num_shards: int = 1, shard_index: int = 0) -> Iterator[tuple[int, Any, Any]]:
        """Yield (row index, id or None, text value) for this shard's rows from row ``start`` on, in order.

        Row ``i`` of the file belongs to shard ``i % num_shards``. Values are as read (the text may be
        None or not a string; the scorer reports those rows). Read errors are raised as InputError.
        """
        if self.empty:
            return
        wanted = list(dict.fromkeys([self.text_column] + ([self.id_column] if self.id_column else [])))
        row = start
        try:
            if self.fmt == "parquet":
                batches, row = _parquet_batches(self.path, wanted, start)
            else:
                ds = _load(self.path, self.fmt, self._load_options(wanted)).select_columns(wanted)
                batches = ds.skip(start).iter(batch_size=READ_BATCH) if start else ds.iter(batch_size=READ_BATCH)
            for batch in batches:
                texts = batch[self.text_column]
                ids = batch[self.id_column] if self.id_column else None
                for k, text in enumerate(texts):
                    if row >= start and row % num_shards == shard_index:
                        yield row, (ids[k] if ids is not None else None), text
                    row += 1
        except InputError:
            raise
        except Exception as e:
            # the file changed since open_input checked it, or another fault: the rows before ``row`` were read
            problem = _not_utf8(self.path, self.fmt) or f"at or after row {row:,}: {_one_line(e)}"
            raise InputError(f"cannot read {self.path}: {problem}") from e

    def count_rows(self) -> int | None:
        """Rows in the file (for the progress bar): exact for Parquet, a fast count for JSON Lines and CSV."""
        if self.empty:
            return 0
        try:
            if self.fmt == "parquet":
                import pyarrow.parquet as pq

                return pq.ParquetFile(self.path).metadata.num_rows
            if self.fmt == "json":
                return _count_lines(self.path)
            import pyarrow.csv as pacsv

            reader = pacsv.open_csv(
                self.path,
                read_options=pacsv.ReadOptions(use_threads=False, block_size=1 << 22),
                parse_options=pacsv.ParseOptions(newlines_in_values=True),
                convert_options=pacsv.ConvertOptions(column_types=dict.fromkeys(self.columns, "string")),
            )
            return sum(batch.num_rows for batch in reader)
        except Exception:
            return None  # only the progress bar's total is lost

    def _load_options(self, columns: list[str] | None) -> dict[str, Any]:
        if self.fmt == "csv":
            return _csv_options(self.columns)
        return {}


def check_input_path(path: Path) -> str:
    """The datasets builder for ``path`` (cheap checks only: extension, existence, permission)."""
    fmt = INPUT_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise InputError(
            f"{path}: unsupported input type {path.suffix or '(no extension)'!r} "
            f"(use {', '.join(sorted(INPUT_FORMATS))})"
        )
    if not path.exists():
        raise InputError(f"{path}: no such file")
    if not path.is_file():
        raise InputError(f"{path}: not a file")
    if not os.access(path, os.R_OK):
        raise InputError(f"{path}: permission denied")
    return fmt


DEFAULT_ID_COLUMN = "id"  # the id without --id-column, where the input has a column so named


def id_column_of(columns: list[str], text_column: str, id_column: str | None) -> str | None:
    """The column whose values are the documents' ids: ``id_column`` (--id-column), else a column named
    ``id`` (unless it holds the texts), else none."""
    if id_column is not None:
        return id_column
    return DEFAULT_ID_COLUMN if DEFAULT_ID_COLUMN in columns and text_column != DEFAULT_ID_COLUMN else None


def open_input(path: str | Path, text_column: str, id_column: str | None) -> InputFile:
    """Check that ``path`` is a readable Parquet/CSV/JSON Lines file with the named columns; without
    ``id_column``, a column named ``id`` is the id (``id_column_of``)."""
    path = Path(path)
    fmt = check_input_path(path)
    if path.stat().st_size == 0:
        if fmt == "parquet":
            raise InputError(f"cannot read {path}: the file is empty (not Parquet)")
        return InputFile(path, fmt, text_column, id_column, [], False, empty=True)

    if fmt == "parquet":
        return _open_parquet(path, text_column, id_column)
    if problem := _not_utf8(path, fmt):  # found here, nothing is scored; Arrow's JSON reader would fail midway
        raise InputError(f"cannot read {path}: {problem}")
    quiet_datasets()
    try:
        options = {"csv": _csv_options(None)}.get(fmt, {})
        ds = _load(path, fmt, options)
        features = ds.features
        first = next(iter(ds.take(1)), None)
    except StopIteration:  # datasets' JSON builder raises this for a file with no rows
        return InputFile(path, fmt, text_column, id_column, [], False, empty=True)
    except Exception as e:
        raise InputError(f"cannot read {path}: {_one_line(e)}") from e
    if features is not None:
        columns = list(features)
    elif first is not None:
        columns = list(first)
    else:  # no row; a CSV's header still says whether the columns asked for are there
        if fmt == "csv" and (header := _csv_header(path)):
            _check_columns(path, header, text_column, id_column_of(header, text_column, id_column))
        return InputFile(path, fmt, text_column, id_column, [], False, empty=True)
    id_column = id_column_of(columns, text_column, id_column)
    _check_columns(path, columns, text_column, id_column)
    id_is_int = False
    if id_column is not None and fmt != "csv" and features is not None:
        dtype = getattr(features[id_column], "dtype", "")
        id_is_int = dtype.startswith(("int", "uint"))
    return InputFile(path, fmt, text_column, id_column, columns, id_is_int, empty=first is None)


def arrow_csv_as_text(path: Path) -> dict[str, Any]:
    """Ray Data's ``read_csv`` options for reading cells as the local engine does: every column of the
    header a string (an id 00042 keeps its zeros), only an empty cell missing (a review "NA" is a text).
    ``path``: the file, or a folder of them (the first one's header)."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    first = path if path.is_file() else next(iter(sorted(path.glob("*.csv"))), None)
    try:
        header = _csv_header(first) if first is not None else []
    except OSError:
        header = []
    return {"convert_options": pacsv.ConvertOptions(column_types={c.lstrip("\ufeff"): pa.string() for c in header},
                                                    null_values=[""], strings_can_be_null=True)}


def _not_utf8(path: Path, fmt: str) -> str | None:
    """Where a CSV or JSON Lines file is not UTF-8, by its row and line (``read_causes.not_utf8``)."""
    from scoring.read_causes import not_utf8

    try:
        return not_utf8(path, fmt) if fmt in ("csv", "json") else None
    except OSError:
        return None  # the read says what is wrong


def _csv_header(path: Path) -> list[str]:
    import csv

    with path.open(newline="", encoding="utf-8", errors="replace") as f:
        return next(csv.reader(f), [])


def _check_columns(path: Path, columns: list[str], text_column: str, id_column: str | None) -> None:
    for role, name in (("text", text_column), ("id", id_column)):
        if name is not None and name not in columns:
            raise InputError(
                f"{path}: no column {name!r} (the {role} column); its columns are {', '.join(map(repr, columns))}"
            )


def _parquet_file(path: Path) -> Any:
    """The file, read page by page: by default Arrow pre-buffers a whole row group, and a file written
    as one big row group (the IMDB files are one group of 25,000 rows) would then cost memory in
    proportion to its size."""
    import pyarrow.parquet as pq

    return pq.ParquetFile(path, pre_buffer=False, buffer_size=1 << 20)


def _open_parquet(path: Path, text_column: str, id_column: str | None) -> InputFile:
    """Parquet from its footer alone (schema and row count): no rows are read, and ``datasets``
    (and what it imports) is not needed."""
    import pyarrow as pa

    try:
        parquet = _parquet_file(path)
        schema, rows = parquet.schema_arrow, parquet.metadata.num_rows
    except Exception as e:
        raise InputError(f"cannot read {path}: {_one_line(e)}") from e
    columns = list(schema.names)
    id_column = id_column_of(columns, text_column, id_column)
    _check_columns(path, columns, text_column, id_column)
    id_is_int = id_column is not None and pa.types.is_integer(schema.field(id_column).type)
    return InputFile(path, "parquet", text_column, id_column, columns, id_is_int, empty=rows == 0)


def _parquet_batches(path: Path, columns: list[str], start: int) -> tuple[Iterator[dict[str, list]], int]:
    """Batches of ``columns`` (as lists) from the row group holding row ``start`` on (the groups
    before it are not read at all), and the index of the first row they hold."""
    parquet = _parquet_file(path)
    groups, first = [], 0
    for g in range(parquet.metadata.num_row_groups):
        size = parquet.metadata.row_group(g).num_rows
        if first + size > start or groups:
            groups.append(g)
        else:
            first += size
    batches = parquet.iter_batches(batch_size=READ_BATCH, row_groups=groups, columns=columns, use_threads=False)
    return ({name: batch.column(name).to_pylist() for name in columns} for batch in batches), first


def _csv_options(columns: list[str] | None) -> dict[str, Any]:
    """CSV cells are text: no NA guessing (a review that says "NA" stays "NA"), no type guessing."""
    options: dict[str, Any] = {"keep_default_na": False}
    if columns:
        from datasets import Features, Value

        options["features"] = Features({c: Value("string") for c in columns})
    return options


def _load(path: Path, fmt: str, options: dict[str, Any]) -> Any:
    from datasets import load_dataset

    return load_dataset(fmt, data_files=str(path), split="train", streaming=True, **options)


def _count_lines(path: Path) -> int:
    lines, last = 0, b"\n"
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            lines += block.count(b"\n")
            last = block[-1:]
    return lines + (last != b"\n")


def quiet_datasets() -> None:
    """datasets logs read errors itself (tracebacks included); han-score reports them in one line."""
    import datasets

    datasets.logging.set_verbosity(logging.CRITICAL)
    datasets.disable_progress_bars()


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__
