"""What the service answered (each document's id, model and labels; the text is in the inference log) and
what clients said was right. SQLite by default (WAL, a busy timeout: several workers and replicas on one
host write at once); a ``postgresql://`` URL for replicas on several hosts. Plain DB-API, the same SQL for
both (``?`` placeholders, rewritten for psycopg). Every write is one transaction, kept whole or not at all.
"""

from __future__ import annotations

import json
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from monitoring.store_schema import Cursor, create_schema, credentials, from_db, joined_query, labels_of, lock_feedback

ROLES = ("production", "shadow")
BUSY_TIMEOUT_S = 30.0  # how long a writer waits for another process's transaction (SQLite's busy timeout)
CONNECT_TIMEOUT_S = 10
_CHUNK = 500  # ids per IN (...) query: far below SQLite's limit on parameters
_BATCH = 1000  # rows a report's read (``joined``) holds at a time
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
class StoreError(RuntimeError):
    """The store cannot be opened or reached: one line naming it (never with its password) and the problem."""


class RejectedError(ValueError):
    """A batch broke a rule of the store (an id no prediction has, an empty or too long id or one with a NUL,
    an unknown role): nothing of it was written. ``unknown`` lists the ids that no prediction has, in order."""

    def __init__(self, message: str, unknown: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.unknown = list(unknown)


@dataclass(frozen=True)
class Prediction:
    """One document's answer as it was served: its label(s) and the top score."""

    id: str
    labels: list[str]
    score: float | None = None


@dataclass(frozen=True)
class Feedback:
    """The label(s) a client says are right for a document it had classified."""

    id: str
    labels: list[str]


@dataclass(frozen=True)
class LabelledPrediction:
    """A prediction with its feedback (None while there is none), for a report."""

    id: str
    request_id: str
    model: str
    role: str
    predicted: list[str]
    score: float | None
    predicted_at: datetime
    feedback: list[str] | None
    feedback_source: str | None
    feedback_at: datetime | None


class FeedbackStore:
    """Predictions and feedback in one database. One connection per store, its calls serialised by a
    lock, so a store may be shared by a process's threads; each process opens its own (``open_store``)."""

    def __init__(self, connect: Callable[[], Any], dialect: str, where: str, secrets: Sequence[str] = (),
                 create: bool = True) -> None:
        self.dialect = dialect
        self.where = where  # the file or URL without its password: safe to log
        self._connect = connect
        self._secrets = [s for s in secrets if s]
        if dialect == "sqlite":
            self._integrity, self._db_error = sqlite3.IntegrityError, sqlite3.Error
        else:
            import psycopg

            self._integrity, self._db_error = psycopg.IntegrityError, psycopg.Error
        self._lock = threading.Lock()
        self._conn: Any = None
        with self._transaction(write=True) as cur:
            self._sql = create_schema(cur, dialect, create)  # the statements for the store's columns
        if self._sql is None:
            raise StoreError(f"feedback store {where}: it has no feedback tables (not the service's store?)")

    def record_predictions(self, request_id: str, model: str, predictions: Iterable[Prediction],
                           role: str = "production", at: datetime | None = None) -> int:
        """Log one request's answers (model is the tag, NAME:VERSION) in one transaction; returns how many.
        An id classified again gets a row more: every answer is kept, the latest wins where one is needed."""
        return self.record_many([(request_id, model, role, list(predictions))], at)

    def record_many(self, answers: Iterable[tuple[Any, ...]], at: datetime | None = None) -> int:
        """``record_predictions`` for several requests at once, (request_id, model, role, predictions) each,
        or with a fifth item, when it was answered (else ``at``, else now), in one transaction."""
        default, rows = self._time(at or datetime.now(UTC)), []
        for request_id, model, role, predictions, *answered in answers:
            when = self._time(answered[0]) if answered else default
            if role not in ROLES:
                raise RejectedError(f"role {role!r} is not one of {', '.join(ROLES)}")
            rows += [(_id(p.id), request_id, model, role, _labels_json(p.labels), p.score, when) for p in predictions]
        if rows:
            with self._transaction(write=True) as cur:
                cur.executemany("INSERT INTO predictions (id, request_id, model, role, labels, score, at) "
                                "VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
        return len(rows)

    def latest_predictions(self, ids: Iterable[str], role: str = "production") -> dict[str, tuple[str, list[str]]]:
        """Each id's last answer in ``role``: (model, labels); the one a feedback given now judges (one stamped
        later than now came earlier, from a clock that then stepped back: ``store_schema.UPSERT_FEEDBACK``)."""
        wanted, found, now = list(dict.fromkeys(ids)), {}, self._time(datetime.now(UTC))
        with self._transaction(write=False) as cur:
            for start in range(0, len(wanted), _CHUNK):
                chunk = wanted[start:start + _CHUNK]
                marks = ", ".join("?" * len(chunk))
                cur.execute(f"SELECT id, model, labels FROM predictions WHERE role = ? AND id IN ({marks}) "
                            "ORDER BY CASE WHEN at <= ? THEN 1 ELSE 0 END, CASE WHEN at <= ? THEN at END, seq",
                            [role, *chunk, now, now])
                found.update((i, (model, labels_of(labels))) for i, model, labels in cur.fetchall())
        return found

    def unknown(self, ids: Iterable[str]) -> list[str]:
        """The ids (each once, in order) that no recorded prediction has."""
        with self._transaction(write=False) as cur:
            return self._unknown(cur, ids)

    def add_feedback(self, items: Iterable[Feedback], source: str | None = None, at: datetime | None = None) -> int:
        """Record a request's feedback in one transaction, all of it or none (``RejectedError``, with the
        ids no prediction has); a later feedback for an id replaces the earlier one. Returns how many."""
        items = list(items)
        self.update_feedback(items, source, at)
        return len(items)

    def update_feedback(self, items: Iterable[Feedback], source: str | None = None,
                        at: datetime | None = None) -> dict[str, list[str]]:
        """``add_feedback``, returning the labels stored that are new for their id (it had none, or others).
        They are read in the transaction that writes them, which holds off every other writer of those ids
        (``lock_feedback``), so that the same label sent twice at once is new to one of the two only."""
        when = self._time(at or datetime.now(UTC))
        # Sorted by id (stably: a repeated id still ends with its last labels) so that two transactions
        # upserting the same ids take their row locks in one order and cannot deadlock.
        rows = sorted(((_id(f.id), _labels_json(f.labels), source, when, f.id, when, when) for f in items),
                      key=lambda row: row[0])
        latest = {row[0]: labels_of(row[1]) for row in rows}
        with self._transaction(write=True) as cur:
            lock_feedback(cur, self.dialect, list(latest))
            before = self._feedback_of(cur, latest)
            cur.executemany(self._sql.upsert, rows if self._sql.judged_seq else [row[:4] for row in rows])
            missing = self._unknown(cur, [row[0] for row in rows])
            if missing:
                shown = ", ".join(repr(i) for i in missing[:10]) + (" …" if len(missing) > 10 else "")
                raise RejectedError(f"no prediction has the id(s) {shown}", missing)
        return {i: labels for i, labels in latest.items() if before.get(i) != labels}

    def joined(self, since: datetime | None = None, until: datetime | None = None, model: str | None = None,
               role: str | None = None, latest: bool = True,
               labelled_only: bool = False) -> Iterator[LabelledPrediction]:
        """Predictions made in [since, until) (by ``model``, in ``role``: all when None) with their feedback,
        oldest first. A feedback belongs to the answer it judged: production's last answer to its id when
        the feedback was given, and the shadow's answer to the same request; a reused id's other answers
        have none. ``latest`` keeps one prediction per id and role: the judged one, else the window's last.
        Yielded as read, in batches (a report over a large store never holds every row), from a connection
        of its own: the store's other calls go on meanwhile; the read ends when the iterator is done or closed."""
        conditions, params = [], []
        for clause, value in (("at >= ?", since), ("at < ?", until), ("model = ?", model), ("role = ?", role)):
            if value is not None:
                conditions.append(clause)
                params.append(self._time(value) if isinstance(value, datetime) else value)
        where = f" WHERE {' AND '.join(conditions)}" if conditions else ""
        rows = self._stream(joined_query(self._sql.judged, where, latest, labelled_only), params)
        for i, request, tag, role_, predicted, score, at, fed, source, fed_at in rows:
            yield LabelledPrediction(i, request, tag, role_, labels_of(predicted), score, from_db(at),
                                     None if fed is None else labels_of(fed), source,
                                     None if fed_at is None else from_db(fed_at))

    def feedback_labels(self, since: datetime | None = None, until: datetime | None = None) -> dict[str, list[str]]:
        """Every id's feedback (given in [since, until) where those are set): the feedback table alone, which
        holds one row a labelled document, so a report reads it whole rather than joining every prediction."""
        bounds = [(c, self._time(v)) for c, v in (("at >= ?", since), ("at < ?", until)) if v is not None]
        where = f" WHERE {' AND '.join(c for c, _ in bounds)}" if bounds else ""
        with self._transaction(write=False) as cur:
            cur.execute(f"SELECT id, labels FROM feedback{where}", [v for _, v in bounds])
            return {i: labels_of(labels) for i, labels in cur.fetchall()}

    def feedback_of(self, ids: Iterable[str]) -> dict[str, list[str]]:
        """The feedback stored so far for each of ``ids`` that has one."""
        with self._transaction(write=False) as cur:
            return self._feedback_of(cur, ids)

    def forget_predictions(self, before: datetime) -> int:
        """Delete the predictions made before ``before`` that no feedback judged (the table would otherwise grow
        a row a document forever; a reused id's other answers go too); returns how many."""
        with self._transaction(write=True) as cur:
            cur.execute(self._sql.forget, [self._time(before)])
            return int(cur.rowcount or 0)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                with suppress(Exception):
                    self._conn.close()
                self._conn = None

    def __enter__(self) -> FeedbackStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _feedback_of(self, cur: Cursor, ids: Iterable[str]) -> dict[str, list[str]]:
        wanted, found = list(dict.fromkeys(ids)), {}
        for start in range(0, len(wanted), _CHUNK):
            chunk = wanted[start:start + _CHUNK]
            cur.execute(f"SELECT id, labels FROM feedback WHERE id IN ({', '.join('?' * len(chunk))})", chunk)
            found.update((i, labels_of(labels)) for i, labels in cur.fetchall())
        return found

    def _unknown(self, cur: Cursor, ids: Iterable[str]) -> list[str]:
        wanted = list(dict.fromkeys(ids))
        known: set[str] = set()
        for start in range(0, len(wanted), _CHUNK):
            chunk = wanted[start:start + _CHUNK]
            cur.execute(f"SELECT DISTINCT id FROM predictions WHERE id IN ({', '.join('?' * len(chunk))})", chunk)
            known.update(row[0] for row in cur.fetchall())
        return [i for i in wanted if i not in known]

    def _time(self, when: datetime) -> Any:
        """UTC; naive times are taken as UTC. SQLite keeps ISO text of one width, so it sorts as time does."""
        when = when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)
        return when.isoformat(timespec="microseconds") if self.dialect == "sqlite" else when

    def _stream(self, sql: str, params: Sequence[Any]) -> Iterator[tuple[Any, ...]]:
        """One query's rows, ``_BATCH`` at a time, in a read transaction on a connection of its own (an
        in-memory SQLite database has only the store's). PostgreSQL sends a plain cursor's whole result at
        once: there it is a server-side one."""
        if self.where == ":memory:":
            with self._transaction(write=False) as cur:
                cur.execute(sql, params)
                rows = cur.fetchall()
            yield from rows
            return
        conn = self._open()
        try:
            conn.execute("BEGIN")
            postgres = self.dialect == "postgresql"
            cursor = Cursor(conn.cursor(name="han_joined") if postgres else conn.cursor(), postgres)
            cursor.execute(sql, params)
            while batch := cursor.fetchmany(_BATCH):
                yield from batch
        except self._db_error as error:
            raise StoreError(f"feedback store {self.where}: {self._scrub(error)}") from error
        finally:
            with suppress(Exception):
                conn.close()

    @contextmanager
    def _transaction(self, write: bool) -> Iterator[Cursor]:
        """One transaction, rolled back on any error."""
        with self._lock:
            cursor = self._begin(write)
            try:
                yield Cursor(cursor, self.dialect == "postgresql")
                cursor.execute("COMMIT")
            except BaseException as error:
                with suppress(Exception):
                    cursor.execute("ROLLBACK")
                if isinstance(error, self._integrity):
                    raise RejectedError(self._scrub(error)) from error
                if isinstance(error, self._db_error):
                    raise StoreError(f"feedback store {self.where}: {self._scrub(error)}") from error
                raise
            finally:
                with suppress(Exception):
                    cursor.close()

    def _begin(self, write: bool) -> Any:
        """A cursor in a new transaction. A broken connection (the PostgreSQL server restarted since) is
        replaced once, before anything is sent, so that a restart does not cost each worker a request.
        SQLite writers take the write lock up front (BEGIN IMMEDIATE), waiting their turn for it: one
        that upgraded from a read later could fail at once."""
        for attempt in range(2):
            if self._conn is None or getattr(self._conn, "broken", False) or getattr(self._conn, "closed", False):
                self._conn = self._open()
            cursor = self._conn.cursor()
            try:
                cursor.execute("BEGIN IMMEDIATE" if write and self.dialect == "sqlite" else "BEGIN")
                return cursor
            except self._db_error as error:
                if attempt or not getattr(self._conn, "broken", False):
                    raise StoreError(f"feedback store {self.where}: {self._scrub(error)}") from error
        raise AssertionError("unreachable")

    def _open(self) -> Any:
        try:
            return self._connect()
        except (OSError, self._db_error) as error:
            raise StoreError(f"feedback store {self.where}: cannot open it: {self._scrub(error)}") from None

    def _scrub(self, error: BaseException) -> str:
        message = " ".join(str(error).split()) or type(error).__name__
        for secret in self._secrets:
            message = message.replace(secret, "***")
        return message


def open_store(url: str | None, default: Path, existing: bool = False) -> FeedbackStore:
    """The store a setting names: empty for the SQLite file ``default``; a file path or ``sqlite:///path``
    for another one; ``postgresql://user@host:port/db`` for a server. ``StoreError`` when it cannot be opened,
    or with ``existing`` (a reader's: a mistyped path would otherwise make an empty store) when an SQLite
    file does not exist."""
    text = (url or "").strip()
    scheme = _SCHEME.match(text)
    name = scheme.group(1).lower() if scheme else ""
    if not scheme or (name == "sqlite" and text[len("sqlite://"):]):
        path = Path(text[len("sqlite://"):] if scheme else text).expanduser() if text else Path(default)
        if existing and not path.exists():
            raise StoreError(f"feedback store {redact(str(path))}: no such file")
        return _sqlite(path, create=not existing)
    if name in ("postgresql", "postgres"):
        return _postgres(text, create=not existing)
    raise StoreError(f"feedback store {redact(text)}: cannot open it: unsupported URL "
                     "(use a file path, sqlite:///path or postgresql://user@host:port/db)")


def redact(url: str) -> str:
    """The URL without its password or query (which may hold one): fit for a log line or an error."""
    scheme, sep, rest = url.partition("://")
    if not sep:  # a file's path, or a URL missing a slash ("postgresql:/u:pw@host/db"): its password hidden
        return re.sub(r"^((?:postgres(?:ql)?|sqlite):/?[^:/@]*:).*@", r"\1***@", url, flags=re.IGNORECASE)
    user, password = credentials(url)
    if password is not None:  # the host is after the last "@": a password may hold "@", "/" or "#" unencoded
        rest = f"{user}:***@{rest.rpartition('@')[2]}"
    return f"{scheme}://{re.split(r'[?#]', rest, maxsplit=1)[0]}"


def _sqlite(path: Path, create: bool = True) -> FeedbackStore:
    def connect() -> sqlite3.Connection:
        if str(path) != ":memory:":
            if path.parent.exists() and not path.parent.is_dir():
                raise NotADirectoryError(f"{path.parent} is not a folder")
            path.parent.mkdir(parents=True, exist_ok=True)
        # isolation_level None: transactions are begun explicitly, BEGIN IMMEDIATE for writes.
        conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
        # WAL: readers never block the writer, nor it them. Switching a new file to it can fail at once
        # with "database is locked", without the busy timeout, while another process does the same: retried.
        deadline = time.monotonic() + BUSY_TIMEOUT_S
        while True:
            try:
                conn.execute("PRAGMA journal_mode = WAL")
                # A commit reaches the file before it returns (a killed process loses nothing); the disk
                # syncs at checkpoints, not at every commit, which would cost each model call milliseconds.
                conn.execute("PRAGMA synchronous = NORMAL")
                return conn
            except sqlite3.Error as error:
                if "locked" not in str(error) or time.monotonic() > deadline:
                    conn.close()
                    raise
                time.sleep(0.02)

    return FeedbackStore(connect, "sqlite", redact(str(path)), create=create)


def _postgres(url: str, create: bool) -> FeedbackStore:
    where, password = redact(url), ""
    try:
        import psycopg
    except ImportError:
        raise StoreError(f"feedback store {where}: cannot open it: psycopg is not installed") from None
    password = credentials(url)[1] or ""
    # psycopg may quote a piece of a password it could not parse: each piece of 3 characters or more is hidden
    pieces = [piece for piece in re.split(r"[@:/?#]", password) if len(piece) >= 3]
    options: dict[str, Any] = {"autocommit": True}  # transactions are begun explicitly
    options.update({} if "connect_timeout" in url else {"connect_timeout": CONNECT_TIMEOUT_S})
    secrets = sorted({password, unquote(password), *pieces} - {""}, key=len, reverse=True)  # longest first
    return FeedbackStore(lambda: psycopg.connect(url, **options), "postgresql", where, secrets, create)


def _id(value: str) -> str:
    """An id as both databases keep it: PostgreSQL's text cannot hold NUL, and SQLite's length() stops at one."""
    if "\x00" in value:
        raise RejectedError(f"the id {value[:80]!r} holds the NUL character")
    return value


def _labels_json(labels: Sequence[str]) -> str:
    if isinstance(labels, str) or not all(isinstance(label, str) for label in labels):
        raise RejectedError(f"labels must be a list of strings, not {labels!r}")
    return json.dumps(list(labels))
