"""Why a file failed Ray Data's read, named by its row: Ray's own errors hide it (JSON Lines) or name no
line (CSV). Read with the standard library, only after a read has failed; and where a CSV or JSON Lines
file is not UTF-8 (``not_utf8``: every reader checks that before its first read, to name the row)."""

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
    cause = _json_cause(path, lines) if fmt == "json" else _csv_cause(path, lines)
    return cause or not_utf8(path, fmt)  # those readers stop, saying nothing, at the first byte not UTF-8


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


_BLOCK = 1 << 24  # bytes checked at a time


def not_utf8(path: str | os.PathLike, fmt: str) -> str | None:
    """Where a CSV or JSON Lines file is not UTF-8 text, named by its row (as the readers count rows: from 0,
    past the header and blank lines) and line, with what to do; None where every byte is UTF-8 (a UTF-8
    byte-order mark included). Checked before a read, in blocks (pyarrow's validation: about a second a
    gigabyte): Arrow's JSON reader takes any bytes and fails later, and a failed read names no row."""
    import pyarrow as pa

    with open(path, "rb") as f:
        if f.read(2) in (b"\xff\xfe", b"\xfe\xff"):
            return "the file is UTF-16 (a byte-order mark: Windows' \"Unicode\"), not UTF-8: save it as UTF-8"
        f.seek(0)
        lines, into, carry = 0, 0, b""  # newlines so far, bytes since the last one, a character cut short
        while True:
            chunk = f.read(_BLOCK)
            block = carry + chunk
            cut = _char_boundary(block) if chunk else len(block)
            whole, carry = block[:cut], block[cut:]
            offsets = pa.array([0, len(whole)], pa.int32()).buffers()[1]
            try:
                pa.Array.from_buffers(pa.string(), 1, [None, offsets, pa.py_buffer(whole)]).validate(full=True)
            except pa.ArrowInvalid:
                return _locate(path, fmt, whole, lines, into)
            newlines = whole.count(b"\n")
            lines, into = lines + newlines, len(whole) - whole.rfind(b"\n") - 1 if newlines else into + len(whole)
            if not chunk:
                break
    return None


def _char_boundary(block: bytes) -> int:
    """The end of ``block``'s last whole character: a multi-byte one cut by the block's end is read with the next."""
    for back in range(1, min(4, len(block)) + 1):
        byte = block[-back]
        if byte < 0x80:
            return len(block)
        if byte >= 0xC0:  # a sequence's first byte: it and what follows wait for the next block
            return len(block) - back
    return len(block)


def _locate(path: str | os.PathLike, fmt: str, whole: bytes, lines: int, into: int) -> str:
    """The message for the first bad byte of ``whole``, which follows ``lines`` newlines and ``into`` bytes."""
    try:
        whole.decode("utf-8")
        at = len(whole)  # pyarrow and Python agree: not reached
    except UnicodeDecodeError as e:
        at = e.start
    line = lines + whole.count(b"\n", 0, at) + 1
    start = whole.rfind(b"\n", 0, at) + 1
    column = at - start + 1 + (into if start == 0 else 0)
    row = _csv_row(path, line) if fmt == "csv" else _json_row(path, line)
    where = f"line {line}" if row is None else "the header (line 1)" if row < 0 else f"row {row} (line {line})"
    excel = " (Excel: Save As \"CSV UTF-8\")" if fmt == "csv" else ""
    return (f"{where} is not UTF-8 (byte 0x{whole[at]:02x} at byte {column} of the line): save the file as UTF-8{excel}"
            if at < len(whole) else f"{where} is not UTF-8: save the file as UTF-8{excel}")


def _json_row(path: str | os.PathLike, line: int) -> int:
    """JSON Lines: a row a non-blank line."""
    with open(path, "rb") as f:
        return sum(1 for text in itertools.islice(f, line - 1) if text.strip())


def _csv_row(path: str | os.PathLike, line: int) -> int | None:
    """CSV: the data row (from 0; -1 the header) that holds ``line`` (a quoted cell can span lines)."""
    import csv
    import io

    with contextlib.suppress(csv.Error), open(path, "rb") as raw:
        reader = csv.reader(io.TextIOWrapper(raw, encoding="utf-8-sig", errors="surrogateescape", newline=""))
        row = -2  # the header is row -1
        for fields in reader:
            row += bool(fields)  # a blank line is no row
            if reader.line_num >= line:
                return max(row, -1)
    return None
