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
    atomic(config_path(out), lambda f: f.write(config))
    atomic(out, lambda f: json.dump(tasks, f, ensure_ascii=False, indent=1))


def atomic(path: Path, write: Callable[[IO[str]], Any]) -> None:
    """Write a whole file or none: a temporary file beside it, renamed over it."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            write(f)
        as_created(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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

        fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
        os.close(fd)
        try:
            pq.write_table(pa.Table.from_pylist(rows), tmp)
            as_created(tmp)
            os.replace(tmp, out)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
