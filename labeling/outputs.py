"""What han-label writes: the queue (Label Studio tasks and their labelling config, or JSON Lines) and the
training file an export becomes; each whole (a temporary file renamed) or not at all, with the mode any
file the user writes gets."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any


def config_path(out: Path) -> Path:
    """The Label Studio labelling config written beside a .json queue."""
    return out.with_name(out.name[: -len(out.suffix)] + ".label-config.xml")


class WriteError(Exception):
    """A file han-label writes could not be written (a full disk): one line naming it and the system's reason."""


def write_next(out: Path, records: list[dict[str, Any]], labels: list[str], multi: bool) -> None:
    """han-label next's queue: Label Studio tasks and their labelling config (.json), or JSON Lines."""
    from labeling.label_studio import label_config, task

    if out.suffix.lower() == ".jsonl":
        atomic(out, lambda f: f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
        return
    tasks = [task(r["id"], r["text"], r["labels"] if multi else [r["label"]], max(r["scores"].values()),
                  r["model_version"], [(s["start"], s["end"], s["text"]) for s in r["top_sentences"]],
                  {"margin": r["margin"], **({"split": r["split"]} if "split" in r else {})}) for r in records]
    config = label_config(labels, multi)
    # both written before either replaces its file: a queue is never left beside another round's config
    atomic_all([(out, lambda f: json.dump(tasks, f, ensure_ascii=False, indent=1)),
                (config_path(out), lambda f: f.write(config))])


def atomic(path: Path, write: Callable[[IO[str]], Any]) -> None:
    """Write a whole file or none: a temporary file beside it, renamed over it."""
    atomic_all([(path, write)])


def atomic_all(files: list[tuple[Path, Callable[[IO[str]], Any]]]) -> None:
    """Write every file whole or none (a failure leaves no temporary file): each to a temporary file beside it,
    then all renamed over theirs. A failed write is a WriteError naming the file."""
    done: list[tuple[str, Path]] = []
    try:
        for path, write in files:
            done.append((_temporary(path), path))
            try:
                with open(done[-1][0], "w", encoding="utf-8") as f:
                    write(f)
            except OSError as e:
                raise _cannot_write(path, e) from None
        for tmp, path in done:
            try:
                os.replace(tmp, path)
            except OSError as e:
                raise _cannot_write(path, e) from None
    except BaseException:
        for tmp, _ in done:
            Path(tmp).unlink(missing_ok=True)
        raise


def _temporary(path: Path) -> str:
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise _cannot_write(path, e) from None
    os.close(fd)
    as_created(tmp)
    return tmp


def _cannot_write(path: Path, e: OSError) -> WriteError:
    reason = os.strerror(e.errno) if e.errno else e.strerror or str(e)  # Arrow's strerror is a paragraph
    return WriteError(f"{path}: cannot write ({reason})")


def as_created(path: str) -> None:
    """The mode a file opened for writing gets (0666 less the umask), not mkstemp's 0600: the queue and the
    labelled file are read by others (Label Studio's service, the next fit's user)."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(path, 0o666 & ~mask)


def write_rows(out: Path, rows: list[dict[str, Any]]) -> None:
    """han-label import's training file, by OUT's extension (.jsonl, .csv or .parquet)."""
    if any("split" in r for r in rows):  # every row gets the column (Parquet's schema is the first row's)
        rows = [{**r, "split": r.get("split")} for r in rows]
    suffix = out.suffix.lower()
    if suffix == ".jsonl":
        atomic(out, lambda f: f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    elif suffix == ".csv":
        import csv

        def write(f: IO[str]) -> None:
            split = ["split"] if rows and "split" in rows[0] else []
            w = csv.DictWriter(f, fieldnames=["id", "text", "label", *split])
            w.writeheader()
            w.writerows(rows)

        atomic(out, write)
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        tmp = _temporary(out)
        try:
            pq.write_table(pa.Table.from_pylist(rows), tmp)
            os.replace(tmp, out)
        except OSError as e:
            Path(tmp).unlink(missing_ok=True)
            raise _cannot_write(out, e) from None
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
