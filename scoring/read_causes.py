"""Why a file failed Ray Data's read, named by its row: Ray's own errors hide it (JSON Lines) or name no
line (CSV). Read with the standard library, only after a read has failed."""

from __future__ import annotations

import contextlib
import itertools
import json
import os

_JSON_KINDS = {str: "string", bool: "boolean", dict: "object", list: "list"}


def read_cause(path: str, fmt: str, lines: int = 1_000_000) -> str | None:
    """Why a local JSON Lines or CSV file failed Ray's read, named by its row. Ray reads JSON Lines with
    pyarrow, which needs one type a column, and on failure retries it as one JSON document ("Extra data:
    line 2"), which hides the cause; its CSV error names no line. None where the first ``lines`` rows
    show none."""
    if fmt not in ("json", "csv") or "://" in path or not os.path.isfile(path):
        return None
    return _json_cause(path, lines) if fmt == "json" else _csv_cause(path, lines)


def _csv_cause(path: str, lines: int) -> str | None:
    import csv

    with contextlib.suppress(OSError, UnicodeDecodeError, csv.Error), open(path, encoding="utf-8", newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        for row, fields in enumerate(itertools.islice(reader, lines)):
            if header is not None and fields and len(fields) != len(header):
                return (f"row {row} (line {reader.line_num}) has {len(fields)} fields where the header has "
                        f"{len(header)}")
    return None


def _json_cause(path: str, lines: int) -> str | None:
    kinds: dict[str, tuple[str, int]] = {}
    with contextlib.suppress(OSError, UnicodeDecodeError), open(path, encoding="utf-8") as f:
        for row, line in enumerate(itertools.islice(f, lines)):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except ValueError as e:
                return f"row {row} is not JSON ({e})"
            if not isinstance(value, dict):
                return f"row {row} is not a JSON object"
            for column, cell in value.items():
                kind = "null" if cell is None else _JSON_KINDS.get(type(cell), "number")
                first = kinds.setdefault(column, (kind, row))
                if kind != first[0] and "null" not in (kind, first[0]):
                    return (f"column {column!r} holds a {kind} in row {row} and a {first[0]} in row {first[1]}: "
                            "--engine ray needs one type a column (--engine local reports such rows as errors)")
    return None
