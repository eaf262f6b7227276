"""The pool ``han-label next`` chooses from: read from a file, a folder or the inference log, scored in
windows by worker processes (as han-score's are: spawned, one torch thread each), kept as arrays.

Scoring keeps, per document, only its scores and its vector (float16): the texts stay in the Arrow
table ``datasets`` maps from disk, so a pool larger than memory is scored window by window. Only the
N documents chosen are read again, to be explained (their top sentences).
"""

from __future__ import annotations

import collections
import hashlib
import os
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

import numpy as np

WINDOW = 500  # documents a worker scores at a time (as han-score's --window: the last ones leave a worker idle less)
_loaded: dict[str, Any] = {}  # a worker's pipeline, loaded on its first window


class PoolError(ValueError):
    """The pool cannot be chosen from (one line naming the source, and the row where there is one)."""


@dataclass
class Pool:
    """A source's documents: the Arrow-backed ``table`` (columns ``text``, ``id``, ``label`` where
    labelled), and ``name`` for messages."""

    name: str
    table: Any  # datasets.Dataset
    label_column: str | None

    def __len__(self) -> int:
        return len(self.table)


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def open_file(source: str, text_column: str, id_column: str | None, label_column: str | None,
              text_fallback: str | None = None) -> Pool:
    """A file or folder han-train reads; ids from ``id_column`` (else a column named id, else row-N); the
    text from ``text_column``, else ``text_fallback`` where the file has that column instead."""
    from pathlib import Path

    from scoring.read import quiet_datasets
    from training.sources import DataError, load_source

    quiet_datasets()
    path = Path(source)
    if path.is_file() and path.stat().st_size == 0:
        raise PoolError(f"{source}: the pool is empty (an empty file)")
    try:
        table = load_source(source)
    except DataError as e:
        raise PoolError(str(e)) from None
    columns = table.column_names
    if text_column not in columns and text_fallback in columns:
        text_column = text_fallback
    if text_column not in columns:
        raise PoolError(f"{source}: no column {text_column!r} (columns: {', '.join(columns)}): see --text-column")
    if id_column is not None and id_column not in columns:
        raise PoolError(f"{source}: no column {id_column!r} for --id-column (columns: {', '.join(columns)})")
    id_column = id_column or ("id" if "id" in columns else None)
    if label_column is None:
        label_column = next((c for c in ("label", "labels") if c in columns), None)
    elif label_column not in columns:
        label_column = None
    keep = {text_column: "text"} | ({id_column: "id"} if id_column else {})
    keep |= {label_column: "label"} if label_column else {}
    table = table.select_columns(list(keep)).rename_columns({k: v for k, v in keep.items() if k != v})
    if id_column is None:
        table = table.add_column("id", [f"row-{i}" for i in range(len(table))])
    elif getattr(table.features["id"], "dtype", None) is None:  # JSON Lines ids of mixed types (1 and "A-2")
        table = table.remove_columns("id").add_column("id", _ids_as_text(table["id"]))
    elif table.features["id"].dtype != "string":
        table = table.cast_column("id", _string_feature())
    return Pool(source, table, "label" if label_column else None)


def _ids_as_text(ids: Any) -> list[str | None]:
    """A column of ids of mixed JSON types (``datasets`` reads it as ``Json``) as text, as han-score's Parquet
    output writes such a column (``str``): 1 -> "1", "A-2" as it is, a missing id missing."""
    return [None if v is None else str(v) for v in ids]


def open_log(name: str, since: Any = None, store: str | None = None) -> Pool:
    """The inference log of model name ``name`` (production's answers; shadows' are copies of them),
    each document once; those with feedback in the feedback store (``store``: its URL, else the one
    beside the production pointer, as han-model's) count as labelled."""
    import datasets

    from monitoring.feedback_store import StoreError
    from monitoring.log_files import log_folder, read_log
    from registry.loop_commands import CommandError, feedback_map

    try:
        feedback = feedback_map(name, store, None, None)
    except StoreError as e:
        raise PoolError(f"log:{name}: the feedback store cannot be read ({e})") from None
    except CommandError as e:  # the service keeps its feedback elsewhere: --store, named
        raise PoolError(f"log:{name}: {e}") from None

    folder = log_folder(name)
    if not folder.is_dir():
        raise PoolError(f"log:{name}: no inference log at {folder} (has a service served {name} with HAN_LOG on?)")
    documents: dict[str, tuple[str, str, str | None]] = {}  # each id once: (text, id, its feedback's labels)
    hashed = 0
    for record in read_log(folder, since=since, roles=["production"]):
        text = record.get("text")
        if not isinstance(text, str):
            hashed += "text_sha256" in record
            continue
        key = record.get("id") or text_hash(text)
        truth = feedback.get((record.get("id"), record.get("request_id")))  # the answer a feedback judged
        if key in documents and (truth is None or documents[key][2] is not None):
            continue  # the id's first answer, unless a later one is the judged one
        documents[key] = (text, str(record.get("id") or ""), ", ".join(truth) if truth is not None else None)
    if not documents and hashed:
        raise PoolError(f"log:{name}: the log holds texts' hashes only (HAN_LOG_TEXT=0): nothing to label")
    rows = list(documents.values())
    table = datasets.Dataset.from_dict({"text": [r[0] for r in rows], "id": [r[1] for r in rows],
                                        "label": [r[2] for r in rows]})
    return Pool(f"log:{name}", table, "label")


def _string_feature() -> Any:
    import datasets

    return datasets.Value("string")


def labelled_keys(pool: Pool) -> tuple[set[str], set[str]]:
    """(ids, text hashes) of the pool's own labelled rows."""
    if pool.label_column is None:
        return set(), set()
    ids, hashes = set(), set()
    for batch in pool.table.iter(batch_size=WINDOW):
        for text, doc, label in zip(batch["text"], batch["id"], batch["label"], strict=True):
            if label is not None and label != "" and label != []:
                ids.add(doc)
                if isinstance(text, str):
                    hashes.add(text_hash(text))
    return ids, hashes


def _start_worker() -> None:
    from scoring.workers import start_worker as start

    start()


def _pipeline(model_dir: str) -> Any:
    """This process's pipeline of ``model_dir``, loaded on first use (one torch thread: processes use the cores)."""
    from han import Pipeline
    from han.environment import freeze_loaded_objects, tune_process

    if model_dir not in _loaded:
        tune_process()
        _loaded[model_dir] = Pipeline.from_directory(model_dir)
        freeze_loaded_objects()
    return _loaded[model_dir]


def _score_window(model_dir: str, texts: list[Any]) -> tuple[np.ndarray, np.ndarray, list[tuple[int, str]]]:
    """A window's scores [n, labels] (float32) and vectors [n, width] (float16); a bad text: zeros and a reason."""
    from han import DocumentError

    pipeline = _pipeline(model_dir)
    results, vectors = pipeline.with_vectors(texts)
    probs = np.zeros((len(texts), len(pipeline.labels)), dtype=np.float32)
    errors = []
    for i, r in enumerate(results):
        if isinstance(r, DocumentError):
            errors.append((i, r.reason))
        else:
            probs[i] = [r.scores[label] for label in pipeline.labels]
    return probs, vectors.astype(np.float16), errors


class Scorers:
    """``n`` scoring processes besides this one, started at once so that their imports (torch, spaCy)
    overlap the reading of the pool; ``n`` = 0: this process alone."""

    def __init__(self, n: int) -> None:
        self.executor = None
        if n > 0:
            import multiprocessing as mp

            from scoring.environment import quiet_resource_tracker

            quiet_resource_tracker()
            self.executor = ProcessPoolExecutor(n, mp_context=mp.get_context("spawn"), initializer=_start_worker)
            from scoring.workers import start_ignoring_ctrl_c

            start_ignoring_ctrl_c(self.executor, n, os.getpid)  # born ignoring Ctrl-C, as han-score's are
        self.size = n

    def close(self, abandon: bool = False) -> None:
        if self.executor is None:
            return
        if abandon:  # an error or Ctrl-C: stop mid-window
            from scoring.workers import stop_at_once

            stop_at_once(self.executor)
        else:
            self.executor.shutdown(wait=True, cancel_futures=True)
        self.executor = None


def score(pool: Pool, model_dir: str, rows: np.ndarray, scorers: Scorers, tell: Callable[[int], object]
          ) -> tuple[np.ndarray, np.ndarray, list[tuple[int, str]]]:
    """Scores and vectors of the pool's ``rows`` (in that order), and the bad rows (row, reason), in
    windows of ``WINDOW``: the workers take them from the front, this process from the back (as
    han-score's main process scores windows too); ``tell`` hears of each window done."""
    windows = [rows[k: k + WINDOW] for k in range(0, len(rows), WINDOW)]
    if not windows:
        return np.zeros((0, 0), np.float32), np.zeros((0, 0), np.float16), []
    try:
        parts = _windows(pool, model_dir, windows, scorers, tell)
    except BrokenProcessPool:
        raise PoolError("a scoring worker died (killed, or out of memory?)") from None
    probs = np.concatenate([parts[k][0] for k in range(len(windows))])
    vectors = np.concatenate([parts[k][1] for k in range(len(windows))])
    bad = [(int(windows[k][i]), reason) for k in range(len(windows)) for i, reason in parts[k][2]]
    return probs, vectors, bad


def _windows(pool: Pool, model_dir: str, windows: list[np.ndarray], scorers: Scorers,
             tell: Callable[[int], object]) -> dict[int, Any]:
    from scoring.workers import wait_first

    parts = {}
    pending: dict[Future, int] = {}
    todo = collections.deque(enumerate(windows))
    while todo or pending:
        while scorers.executor is not None and todo and len(pending) < 2 * scorers.size:
            k, window = todo.popleft()
            pending[scorers.executor.submit(_score_window, model_dir, _texts(pool, window))] = k
        if todo:
            k, window = todo.pop()
            parts[k] = _score_window(model_dir, _texts(pool, window))
            tell(len(window))
        if not pending:
            continue
        done = wait_first(list(pending), 0 if todo else None)
        for future in done:
            k = pending.pop(future)
            try:
                parts[k] = future.result()
            except BrokenProcessPool:
                raise
            except Exception as e:
                raise PoolError(f"scoring failed: {type(e).__name__}: {e}") from None
            tell(len(windows[k]))
    return parts


def explain(pool: Pool, model_dir: str, rows: np.ndarray, top_sentences: int) -> list[Any]:
    """The DocumentResults of the pool's ``rows`` with their top sentences by attention (this process's
    pipeline, loaded as it scored)."""
    from han import TopK

    return _pipeline(model_dir)(_texts(pool, rows), explain="attention", errors="raise", top=TopK(top_sentences, 0))


def _texts(pool: Pool, rows: np.ndarray) -> list[Any]:
    """The texts of ``rows`` as a list (``table.select(...)["text"]`` is a lazy column: a fingerprinted
    look-up per item)."""
    return pool.table[rows.tolist()]["text"] if len(rows) else []


def default_workers() -> int:
    try:
        return max(1, min(len(os.sched_getaffinity(0)), 16))
    except AttributeError:
        return max(1, min(os.cpu_count() or 1, 16))
