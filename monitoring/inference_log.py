"""The inference log: one JSON line per classified document, written through ``bentoml.monitor``.

BentoML's monitoring API is the front (``bentoml.monitor(...)`` with ``log_batch`` per column); this
module supplies the monitor class behind it, which the API takes as ``monitor_class``. BentoML's own
default writes through a ``TimedRotatingFileHandler`` that keeps every day's file forever and can
leave half a line when a worker is killed mid-write; this one writes each line with a single
``write(2)`` on a file of its own opened ``O_APPEND`` (readers skip an unfinished last line, and the next
worker cuts what a kill left), starts a new file past a size, and deletes the oldest files past a
disk cap. Lines are written before the response is
sent, so an answered request is in the log even if its worker dies a moment later.

The log lives beside the production pointer: ``$BENTOML_HOME/deployments/NAME/log/``, one file at a
time per worker process (``data/<start>-<host>-<pid>.jsonl``), and ``schema.json`` (BentoML's column
schema: name, role, type).
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import hashlib
import json
import logging
import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import bentoml
from bentoml.monitoring import MonitorBase

from monitoring.log_files import dead_writer, log_folder, repair

MONITOR_NAME = "han_inference"
_warned = 0.0
_lost = 0  # lines a failed write lost in this process since the last ``take_lost``


def take_lost() -> int:
    """How many log lines failed writes lost since the last call (the service counts them in /metrics)."""
    global _lost
    lost, _lost = _lost, 0
    return lost


@dataclass(frozen=True)
class LogSettings:
    """Where and how much to log; ``service.settings`` reads them from the environment."""

    enabled: bool = True
    keep_text: bool = True  # else a SHA-256 of the text (the documents are the users' data)
    file_bytes: int = 64 * 2**20  # a new file past this size
    cap_bytes: int = 2 * 2**30  # the oldest files go past this total


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class LineFileHandler(logging.Handler):
    """Appends each record as one line with one ``os.write``; rotates by size; holds the folder under a cap."""

    def __init__(self, folder: Path, file_bytes: int, cap_bytes: int) -> None:
        super().__init__(logging.INFO)
        self.folder, self.file_bytes, self.cap_bytes = folder, file_bytes, cap_bytes
        self.fd: int | None = None
        self.path: Path | None = None
        self.size = 0
        self.torn = False  # a short write (a full disk) left part of a line: ended before the next one

    def _open(self) -> None:
        self.close_file()
        self.folder.mkdir(parents=True, exist_ok=True)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%f")
        self.path = self.folder / f"{stamp}-{socket.gethostname()}-{os.getpid()}.jsonl"
        self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
        self.size = os.fstat(self.fd).st_size
        self._prune()

    def _prune(self) -> None:
        """Delete the oldest files while the folder holds more than the cap: never a file a process may still
        be writing (the newest of a live process of this host, or of another host's written this hour)."""
        files, newest = [], {}
        for path in self.folder.glob("*.jsonl"):
            with contextlib.suppress(OSError):
                st = path.stat()
                files.append((st.st_mtime, st.st_size, path))
                writer = path.stem.partition("-")[2]  # HOST-PID; the names start with their time, so sort as it
                newest[writer] = max(newest.get(writer, path.name), path.name)
        total = sum(size for _, size, _ in files)
        for mtime, size, path in sorted(files):
            if total <= self.cap_bytes:
                break
            writer = path.stem.partition("-")[2]
            here = writer.rpartition("-")[0] == socket.gethostname()
            if path == self.path or (newest[writer] == path.name
                                     and (not dead_writer(path) if here else mtime > time.time() - 3600)):
                continue
            with contextlib.suppress(OSError):
                path.unlink()
                total -= size

    def emit(self, record: logging.LogRecord) -> None:
        line = (self.format(record) + "\n").encode("utf-8")
        try:
            if (self.fd is None or (self.size + len(line) > self.file_bytes > 0 and self.size > 0)
                    or os.fstat(self.fd).st_nlink == 0):  # deleted under it (by hand, or another host's prune)
                self._open()
            if self.torn:  # readers skip the cut line; this one must not be glued to it
                self.size += os.write(self.fd, b"\n")  # type: ignore[arg-type]
                self.torn = False
            written = os.write(self.fd, line)  # type: ignore[arg-type]  # one call; a kill mid-call: see repair()
            self.size += written
            if written < len(line):
                self.torn = True
                raise OSError(f"wrote {written} of the line's {len(line)} bytes (the disk is full?)")
        except OSError as e:  # a full disk must never fail a request: say so, at most once a minute
            global _warned, _lost
            _lost += 1
            if time.monotonic() - _warned > 60:
                _warned = time.monotonic()
                logging.getLogger("han.service").error("cannot write the inference log in %s: %s", self.folder, e)

    def close_file(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None

    def close(self) -> None:
        self.close_file()
        super().close()


class _LineFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(record.msg, ensure_ascii=False, separators=(",", ":"))


def columns(keep_text: bool) -> list[dict[str, str]]:
    """BentoML's column schema of a log line (besides ``time``): name, role and type."""
    named = [
        ("id", "feature", "categorical"),
        ("request_id", "feature", "categorical"),
        ("model", "feature", "categorical"),
        ("role", "feature", "categorical"),
        ("text", "feature", "categorical") if keep_text else ("text_sha256", "feature", "categorical"),
        ("words", "feature", "numerical"),
        ("oov", "feature", "numerical"),
        ("label", "prediction", "categorical"),
        ("labels", "prediction", "categorical"),
        ("scores", "prediction", "numerical_sequence"),
    ]
    return [{"name": name, "role": role, "type": kind} for name, role, kind in named]


class LineMonitor(MonitorBase[Any]):
    """A ``bentoml.monitor`` backend: each record a JSON line (``LineFileHandler``), with its UTC time."""

    PRESERVED_COLUMNS = ("time",)

    def __init__(
        self, name: str, folder: str, file_bytes: int, cap_bytes: int, keep_text: bool = True, **kwargs: Any
    ) -> None:
        super().__init__(name, **kwargs)
        self.folder = Path(folder)
        # The columns are known: set here, BentoML neither registers them per record nor warns of repeats.
        self.columns_schema = {c["name"]: c for c in columns(keep_text)}
        self.export_schema(self.columns_schema)
        self.handler = LineFileHandler(self.folder / "data", file_bytes, cap_bytes)
        self.handler.setFormatter(_LineFormatter())
        self.logger = logging.getLogger(f"han.inference_log.{self.folder}")
        self.logger.propagate = False
        self.logger.setLevel(logging.INFO)
        self.logger.addHandler(self.handler)

    def export_schema(self, columns_schema: dict[str, dict[str, str]]) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        columns = [{"name": "time", "role": "time", "type": "datetime"}, *columns_schema.values()]
        tmp = self.folder / f".schema.{os.getpid()}.tmp"
        tmp.write_text(json.dumps({"columns": columns}, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, self.folder / "schema.json")

    def export_data(self, datas: dict[str, collections.deque[Any]]) -> None:
        now = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        while True:
            try:
                record = {"time": now, **{k: v.popleft() for k, v in datas.items()}}
            except IndexError:
                break
            self.logger.info(record)


class InferenceLog:
    """What a serving worker logs of each answered request, through ``bentoml.monitor``."""

    def __init__(self, name: str, settings: LogSettings, folder: Path | None = None) -> None:
        self.settings = settings
        self.folder = folder or log_folder(name)
        self.options = {
            "folder": str(self.folder),
            "file_bytes": settings.file_bytes,
            "cap_bytes": settings.cap_bytes,
            "keep_text": settings.keep_text,
        }
        self.monitor = f"{MONITOR_NAME}:{self.folder}"
        if settings.enabled:
            with contextlib.suppress(OSError):
                repair(self.folder)  # a worker killed before this one may have left half a line

    def write(
        self,
        request_id: str | Sequence[str],
        model: str,
        role: str,
        ids: Sequence[str],
        texts: Sequence[str],
        results: Sequence[Any],
        profiles: Sequence[tuple[int, int]],
    ) -> None:
        """One line per document: its id, the request, the model version and its role (production or
        shadow), the label(s), the scores, its length in words and its share of out-of-vocabulary words,
        and the text (or its hash). ``request_id``: the request's, or one for each document (a model call's
        requests logged at once: one ``bentoml.monitor`` record costs about 15 us a document, 30 alone)."""
        if not self.settings.enabled or not ids:
            return
        # In a context of its own: BentoML's record lives in context variables that an exception half-way
        # would leave set, and its next record in the same context would fail.
        contextvars.copy_context().run(self._write, request_id, model, role, ids, texts, results, profiles)

    def _write(self, request_id: str | Sequence[str], model: str, role: str, ids: Sequence[str],
               texts: Sequence[str], results: Sequence[Any], profiles: Sequence[tuple[int, int]]) -> None:
        with bentoml.monitor(self.monitor, monitor_class=LineMonitor, monitor_options=self.options) as m:
            m.log_batch(ids, "id", "feature", "categorical")
            requests = [request_id] * len(ids) if isinstance(request_id, str) else request_id  # one, or one each
            m.log_batch(requests, "request_id", "feature", "categorical")
            m.log_batch([model] * len(ids), "model", "feature", "categorical")
            m.log_batch([role] * len(ids), "role", "feature", "categorical")
            if self.settings.keep_text:
                m.log_batch(texts, "text", "feature", "categorical")
            else:
                m.log_batch([text_hash(t) for t in texts], "text_sha256", "feature", "categorical")
            m.log_batch([words for words, _ in profiles], "words", "feature", "numerical")
            m.log_batch(
                [round(unknown / words, 4) if words else 0.0 for words, unknown in profiles],
                "oov",
                "feature",
                "numerical",
            )
            m.log_batch([r.label for r in results], "label", "prediction", "categorical")
            m.log_batch([r.labels for r in results], "labels", "prediction", "categorical")
            m.log_batch([r.scores for r in results], "scores", "prediction", "numerical_sequence")
