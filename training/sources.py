"""Reading labelled documents through `datasets`: Parquet, CSV, JSON Lines, a folder per class, or a hub name."""

from __future__ import annotations

import re
import unicodedata
from functools import cache
from pathlib import Path

import datasets

_HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?(:[\w.-]+)?")
FILE_FORMATS = {".parquet": "parquet", ".csv": "csv", ".jsonl": "json", ".json": "json"}


class DataError(ValueError):
    """A data problem the user can fix: a missing file or column, a single-class label column, ..."""


def load_source(source: str, csv_cells_as_text: bool = True) -> datasets.Dataset:
    """Load one split.

    ``source`` is a Parquet/CSV/JSON Lines file, a folder with one sub-folder of ``.txt`` (any case) files per
    class (scikit-learn's ``load_files`` layout; columns ``text`` and ``label``), or a Hugging Face
    dataset name with an optional ``:split`` suffix (``stanfordnlp/imdb:test``; default ``train``),
    which needs the hub or a local cache. A CSV's cells are read as written (as han-score reads them):
    ids keep their leading zeros, a text "NA" or "null" is words, a label 1 is "1" (never "1.0" because
    another row's is empty); only an empty cell is missing. ``csv_cells_as_text=False``: pandas' guesses.
    """
    path = Path(source)
    if path.is_dir():
        return _load_folder(path)
    if path.suffix.lower() in FILE_FORMATS:
        if not path.is_file():
            raise DataError(f"{source}: file not found")
        fmt = FILE_FORMATS[path.suffix.lower()]
        if fmt != "parquet" and (problem := _not_utf8(path, fmt)):
            raise DataError(f"{source}: {problem}")
        options = _csv_text_options(path) if fmt == "csv" and csv_cells_as_text else {}
        try:
            loaded = datasets.load_dataset(fmt, data_files=str(path), split="train", **options)
            return _scalars_as_text(loaded) if fmt == "json" else loaded
        except Exception as e:  # datasets wraps parser errors in many types
            cause = _first_line(e)
            if "corresponds to no data" in cause or cause == "StopIteration":  # a header alone, or nothing
                raise DataError(f"{source}: the file holds no rows") from e
            if fmt == "json" and (line := _bad_json_line(path)):  # Arrow's row counts within its block
                raise DataError(f"{source}: {line}") from e
            raise DataError(f"{source}: cannot be read as {fmt} ({cause})") from e
    if path.exists() or not _HUB_NAME.fullmatch(source):
        raise DataError(f"{source}: not found, or not a .parquet, .csv or .jsonl file or a folder of class folders")
    name, _, split = source.partition(":")
    try:
        return datasets.load_dataset(name, split=split or "train")
    except Exception as e:
        raise DataError(
            f"{source}: not a file or folder here, and not loadable as a Hugging Face dataset ({_first_line(e)})"
        ) from e


def _not_utf8(path: Path, fmt: str) -> str | None:
    """Where a CSV or JSON Lines file is not UTF-8, by row and line; checked once a file version (a fit reads
    its training file several times). Arrow's JSON reader takes any bytes, and a fit failed only while
    tokenising, naming neither file nor row; pandas' CSV error names neither row nor line."""
    stat = path.stat()
    return _utf8_problem(str(path.resolve()), stat.st_size, stat.st_mtime_ns, fmt)


@cache
def _utf8_problem(path: str, size: int, mtime_ns: int, fmt: str) -> str | None:
    """As han-score's ``scoring.read_causes.not_utf8`` words it (which this package may not import): a byte
    that is not UTF-8 named by its row (from 0, past the header and blank lines) and line."""
    try:
        with open(path, "rb") as f:
            if f.read(2) in (b"\xff\xfe", b"\xfe\xff"):
                return "the file is UTF-16 (a byte-order mark: Windows' \"Unicode\"), not UTF-8: save it as UTF-8"
            f.seek(0)
            for number, line in enumerate(f, 1):
                if not line.isascii():
                    try:
                        line.decode("utf-8")
                    except UnicodeDecodeError as e:
                        return _not_utf8_line(path, fmt, number, line, e.start)
    except OSError:
        return None  # the read says what is wrong
    return None


def _not_utf8_line(path: str, fmt: str, number: int, line: bytes, at: int) -> str:
    import contextlib
    import csv
    import io
    import itertools

    row = -1  # the header's
    with open(path, "rb") as f:
        if fmt == "csv":  # the data row holding the line: a quoted cell can span lines
            reader = csv.reader(io.TextIOWrapper(f, encoding="utf-8-sig", errors="surrogateescape", newline=""))
            with contextlib.suppress(csv.Error):
                row = -2
                for fields in reader:
                    row += bool(fields)  # a blank line is no row
                    if reader.line_num >= number:
                        break
        else:  # JSON Lines: a row a non-blank line
            row = sum(1 for text in itertools.islice(f, number - 1) if text.strip())
    where = "the header (line 1)" if row < 0 else f"row {row} (line {number})"
    excel = " (Excel: Save As \"CSV UTF-8\")" if fmt == "csv" else ""
    return f"{where} is not UTF-8 (byte 0x{line[at]:02x} at byte {at + 1} of the line): save the file as UTF-8{excel}"


def _scalars_as_text(ds: datasets.Dataset) -> datasets.Dataset:
    """JSON Lines columns that hold both strings and integers (labels 0 and "1": han-score and han-label
    import write a label as a string, and their output is appended to the user's file) as text, an integer
    as its digits, as a column of integers alone is read for labels. ``datasets`` keeps such a column as
    JSON text; one holding lists, objects, booleans or fractions is left so (the label check names it)."""
    import json

    mixed = [c for c, f in ds.features.items() if type(f).__name__ == "Json"]
    order = ds.column_names
    for column in mixed:
        values = [None if v is None else json.loads(v) for v in ds.with_format("arrow")[column].to_pylist()]
        if all(v is None or isinstance(v, str) or (isinstance(v, int) and not isinstance(v, bool)) for v in values):
            text = [None if v is None else str(v) for v in values]
            ds = ds.remove_columns(column).add_column(column, text, feature=datasets.Value("string"))
    return ds.select_columns(order) if mixed else ds


def _csv_text_options(path: Path) -> dict:
    """pandas' options for a CSV read as text: every column a string, an empty cell the only missing value."""
    import csv

    try:
        with path.open(encoding="utf-8-sig", newline="") as f:
            header = next(csv.reader(f), [])
    except (OSError, UnicodeDecodeError, csv.Error):
        return {}  # the read itself says what is wrong
    # pandas names a column without a header cell (``df.to_csv``'s index, an Excel export's trailing comma)
    # "Unnamed: <position>", as han-score reads it: declared so here too, the column is kept and ignored
    header = [c if c else f"Unnamed: {i}" for i, c in enumerate(header)]
    if not header or len(set(header)) != len(header):
        return {}
    return {"keep_default_na": False, "na_values": [""],
            "features": datasets.Features({c: datasets.Value("string") for c in header})}


def _load_folder(path: Path) -> datasets.Dataset:
    classes = sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        raise DataError(f"{path}: a data folder needs one sub-folder of .txt files per class")
    texts: list[str] = []
    labels: list[str] = []
    unreadable: list[tuple[Path, UnicodeDecodeError]] = []
    for folder in classes:
        for file in sorted(f for f in folder.iterdir() if f.suffix.lower() == ".txt" and f.is_file()):
            try:
                texts.append(_decode(file.read_bytes()))
            except UnicodeDecodeError as e:
                unreadable.append((file, e))
            labels.append(folder.name)
    if unreadable:  # once read as Latin-1: a UTF-16 corpus was trained on as garbage, silently
        file, e = unreadable[0]
        line = e.object[:e.start].count(b"\n") + 1
        more = f"; {len(unreadable):,} of its {len(texts) + len(unreadable):,} .txt files are not" \
            if len(unreadable) > 1 else ""
        raise DataError(f"{path}: {file.relative_to(path)} is not UTF-8 (line {line}: byte 0x{e.object[e.start]:02x})"
                        f"{more}: save them as UTF-8 (UTF-16 with its byte-order mark, Windows' \"Unicode\", "
                        "is read too)")
    if not texts:
        raise DataError(f"{path}: no .txt files in its class folders ({', '.join(c.name for c in classes)})")
    return datasets.Dataset.from_dict({"text": texts, "label": labels})


def _decode(data: bytes) -> str:
    """A class folder's text file: UTF-8, or UTF-16 or UTF-8 after a byte-order mark (Windows Notepad's
    "Unicode" and "UTF-8 with BOM"); the mark is not part of the text."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return data.decode("utf-16")
    return data.decode("utf-8-sig")


def _bad_json_line(path: Path) -> str | None:
    """The first line of a JSON Lines file that is not a JSON object, named by its line number (1-based)."""
    import json

    try:
        with path.open(encoding="utf-8-sig") as f:
            for number, line in enumerate(f, 1):
                if line.strip():
                    try:
                        value = json.loads(line)
                    except ValueError as e:
                        return f"line {number} is not JSON ({e})"
                    if not isinstance(value, dict):
                        return f"line {number} is not a JSON object (a {type(value).__name__})"
    except (OSError, UnicodeDecodeError):
        return None
    return None


def _first_line(error: BaseException) -> str:
    """The error's first line; past datasets' "An error occurred while generating the dataset", its cause's
    (the parser's, which names the line: "Expected 3 fields in line 151, saw 5")."""
    while type(error).__name__ == "DatasetGenerationError" and error.__cause__ is not None:
        error = error.__cause__
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0][:300]


def refuse_missing_values(
    raw: datasets.Dataset, split: str, source: str, text: str, label: str | None, label_kind: str
) -> None:
    """A missing text or label is named here, by its row, before tokenising: raised in a tokenising
    process instead, it can leave the process pool hanging on its way out (datasets' ``map``). So is an
    empty or whitespace-only label, and a missing or empty one in a list of labels, in every format (a
    CSV's empty cell is a missing value)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    table = raw.with_format("arrow")[:]  # a zero-copy slice unless rows were selected
    empty = "the label is empty; give every label a name"  # a CSV's empty cell, as a JSON or Parquet ""
    for column, what in ((text, "the text is NoneType, not a string"),
                         (label, empty if Path(source).suffix.lower() == ".csv" else
                          f"a label must be {label_kind}, not None")):
        if column is not None and table.column(column).null_count:
            row = pc.index(pc.is_null(table.column(column)), True).as_py()
            raise DataError(f"{split} ({source}) row {row}: {what}")
    if label is None:
        return
    values = table.column(label).combine_chunks()
    is_list = pa.types.is_list(values.type) or pa.types.is_large_list(values.type)
    items = pc.list_flatten(values) if is_list else values
    if pa.types.is_null(items.type):
        items = items.cast(pa.string())
    if not (pa.types.is_string(items.type) or pa.types.is_large_string(items.type)):
        return  # integers, or values of several kinds (which the tokeniser names)
    _note_other_forms(items, split, source)
    bad = pc.fill_null(pc.equal(pc.utf8_trim_whitespace(items), ""), True) if len(items) else None
    if bad is None or not pc.any(bad).as_py():
        return
    first = pc.index(bad, True).as_py()
    row = pc.list_parent_indices(values)[first].as_py() if is_list else first
    what = empty if not is_list else \
        f"the label list holds {'None' if items[first].as_py() is None else 'an empty label'}; give every label a name"
    raise DataError(f"{split} ({source}) row {row}: {what}")


def _note_other_forms(labels: object, split: str, source: str) -> None:
    """One line where labels are not in Unicode's composed form (NFC): "é" typed on macOS, or a file name
    there, is often "e" and a combining accent, which looks the same and was a class of its own. The fit
    reads them composed (``tokenise.label_strings``); a document's text is left as written."""
    import pyarrow.compute as pc
    from pytorch_lightning.utilities import rank_zero_info

    other = pc.fill_null(pc.not_equal(labels, pc.utf8_normalize(labels, "NFC")), False)
    count = pc.sum(other).as_py() or 0
    if count:
        first = labels[pc.index(other, True).as_py()].as_py()
        rank_zero_info(f"{split} ({source}): {count:,} labels (the first {first!r}) are written in another Unicode "
                       f"form (decomposed, as macOS writes); read composed (NFC): "
                       f"{unicodedata.normalize('NFC', first)!r} is one label however it is written")


def csv_label_lists(raw: datasets.Dataset, source: str, column: str) -> datasets.Dataset:
    """A CSV's label column as lists (multi-label) where every non-empty cell is a list written as JSON
    (``["bop", "trade"]``, as han-score writes it) or as Python prints it (``['bop', 'trade']``, pandas'
    ``to_csv``); otherwise ``raw`` as it is. Items are read as strings (an integer as its digits)."""
    import ast
    import json

    import pyarrow as pa
    import pyarrow.compute as pc

    if Path(source).suffix.lower() != ".csv" or column not in raw.column_names:
        return raw
    table = raw.with_format("arrow")[:]
    cells = table.column(column)
    if not pa.types.is_string(cells.type) or cells.null_count == len(cells):
        return raw
    if not pc.all(pc.starts_with(pc.utf8_trim_whitespace(cells.drop_null()), "[")).as_py():
        return raw
    lists: list[list[str | None] | None] = []
    for cell in cells.to_pylist():
        if cell is None:
            lists.append(None)
            continue
        try:
            value = json.loads(cell)
        except ValueError:
            try:
                value = ast.literal_eval(cell.strip())
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                return raw
        if not isinstance(value, list) or not all(v is None or isinstance(v, (str, int)) for v in value):
            return raw
        lists.append([None if v is None else str(v) for v in value])
    parsed = pa.array(lists, type=pa.list_(pa.string()))
    from datasets.table import InMemoryTable

    return datasets.Dataset(InMemoryTable(table.set_column(table.column_names.index(column), column, parsed)))
