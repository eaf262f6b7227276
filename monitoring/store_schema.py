"""The feedback store's tables, one text for SQLite and PostgreSQL, and the columns later releases added
(a store made by an earlier release gains them when it is opened); the cursor that runs that one text on
either, the lock a feedback writer holds on its ids, the query a report reads, and how a row's values read."""

from __future__ import annotations

import json
import logging
import zlib
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, NamedTuple

MAX_ID_LENGTH = 512
# A PostgreSQL advisory lock key (any fixed number): concurrent CREATE TABLE IF NOT EXISTS can still
# collide in PostgreSQL's catalogue, so processes that open the store at once create the schema in turn.
SCHEMA_LOCK = 0x48414E46
# The class of the PostgreSQL advisory locks (two int4 keys: this, and a hash of an id) that a feedback writer
# holds on its ids until it commits (``lock_feedback``).
FEEDBACK_LOCK = 0x48414E4C

SCHEMA = """
CREATE TABLE IF NOT EXISTS predictions (
  seq {seq},
  id TEXT NOT NULL CHECK (length(id) BETWEEN 1 AND {max_id}),
  request_id TEXT NOT NULL,
  model TEXT NOT NULL,
  role TEXT NOT NULL CHECK (role IN ('production', 'shadow')),
  labels {json} NOT NULL,
  score {real},
  at {time} NOT NULL
);
CREATE INDEX IF NOT EXISTS predictions_id ON predictions (id);
CREATE INDEX IF NOT EXISTS predictions_at ON predictions (at);
CREATE TABLE IF NOT EXISTS feedback (
  id TEXT PRIMARY KEY CHECK (length(id) BETWEEN 1 AND {max_id}),
  labels {json} NOT NULL,
  source TEXT,
  at {time} NOT NULL,
  judged_seq {int}
)
"""
TYPES = {
    "sqlite": {"seq": "INTEGER PRIMARY KEY AUTOINCREMENT", "json": "TEXT", "time": "TEXT", "real": "REAL",
               "int": "INTEGER"},
    "postgresql": {"seq": "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY", "json": "JSONB",
                   "time": "TIMESTAMPTZ", "real": "DOUBLE PRECISION", "int": "BIGINT"},
}
# A feedback judges the answer its id had when it was given: production's last by time (judged_seq; an answer
# written late, after an outage or a restart, keeps its time) among those stamped no later than the feedback
# (one stamped after it was given by a clock that then stepped back: it came before), else, where the clock
# stepped back past them all, the last written. A store made before the column has none in its old rows, which
# judge their id's last production answer, as they did. Rows: (id, labels, source, at, id, at, at).
UPSERT_FEEDBACK = ("INSERT INTO feedback (id, labels, source, at, judged_seq) VALUES (?, ?, ?, ?, (SELECT seq "
                   "FROM predictions WHERE id = ? AND role = 'production' ORDER BY CASE WHEN at <= ? THEN 0 ELSE 1 "
                   "END, CASE WHEN at <= ? THEN at END DESC, seq DESC LIMIT 1)) ON CONFLICT (id) DO UPDATE "
                   "SET labels = excluded.labels, source = excluded.source, at = excluded.at, "
                   "judged_seq = excluded.judged_seq")
# (id, request_id) of the answer each feedback judges: production's answer and the shadow's copy of it
JUDGED = ("SELECT f.id AS id, COALESCE(p.request_id, (SELECT q.request_id FROM predictions q WHERE q.id = f.id AND "
          "q.role = 'production' ORDER BY q.at DESC, q.seq DESC LIMIT 1)) AS request_id FROM feedback f "
          "LEFT JOIN predictions p ON p.seq = f.judged_seq")
# Retention keeps, of the answers older than it, only those a feedback judges (and the shadow's copies of them):
# a client that reuses its ids would otherwise keep every answer of an id it once labelled, forever.
FORGET = (f"DELETE FROM predictions WHERE at < ? AND NOT EXISTS (SELECT 1 FROM ({JUDGED}) j WHERE "
          "j.id = predictions.id AND j.request_id = predictions.request_id)")
# The same on a store made before judged_seq, opened by a role that may not add the column (a reader, or an
# application role granted rows only, until the owner opens it once): every feedback judges its id's last
# production answer, as it did then, and retention keeps every answer of an id that has feedback, as then.
JUDGED_BEFORE_SEQ = ("SELECT f.id AS id, (SELECT q.request_id FROM predictions q WHERE q.id = f.id AND "
                     "q.role = 'production' ORDER BY q.at DESC, q.seq DESC LIMIT 1) AS request_id FROM feedback f")
FORGET_BEFORE_SEQ = "DELETE FROM predictions WHERE at < ? AND id NOT IN (SELECT id FROM feedback)"
UPSERT_FEEDBACK_BEFORE_SEQ = ("INSERT INTO feedback (id, labels, source, at) VALUES (?, ?, ?, ?) ON CONFLICT (id) DO "
                              "UPDATE SET labels = excluded.labels, source = excluded.source, at = excluded.at")
_log = logging.getLogger(__name__)


class Statements(NamedTuple):
    """The statements that read and write feedback on a store as its columns are: ``upsert`` takes (id, labels,
    source, at, id, at, at) rows with ``judged_seq``, their first four without; ``forget`` takes a time."""

    judged: str
    upsert: str
    judged_seq: bool
    forget: str


CURRENT = Statements(JUDGED, UPSERT_FEEDBACK, True, FORGET)
BEFORE_SEQ = Statements(JUDGED_BEFORE_SEQ, UPSERT_FEEDBACK_BEFORE_SEQ, False, FORGET_BEFORE_SEQ)


class Cursor:
    """A DB-API cursor that takes SQLite's ``?`` placeholders for either database (no SQL here has a ``?``
    of another kind)."""

    def __init__(self, cursor: Any, postgres: bool) -> None:
        self._cursor, self._postgres = cursor, postgres

    def __getattr__(self, name: str) -> Any:  # fetchall, fetchone
        return getattr(self._cursor, name)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        self._cursor.execute(sql.replace("?", "%s") if self._postgres else sql, params)

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        if rows:
            self._cursor.executemany(sql.replace("?", "%s") if self._postgres else sql, rows)


def joined_query(judged: str, where: str, latest: bool, labelled_only: bool) -> str:
    """``FeedbackStore.joined``'s query: the predictions ``where`` selects, each with its feedback where it is
    the answer that feedback judged (``judged``: a ``Statements.judged``); with ``latest``, one prediction per
    id and role: the judged one, else the window's last."""
    last = (" JOIN (SELECT seq FROM (SELECT seq, ROW_NUMBER() OVER (PARTITION BY id, role ORDER BY judged DESC, "
            "at DESC, seq DESC) AS r FROM v) x WHERE r = 1) l ON l.seq = v.seq") if latest else ""
    return (f"WITH w AS (SELECT * FROM predictions{where}), j AS ({judged}), v AS (SELECT w.*, CASE WHEN j.id IS "
            f"NULL THEN 0 ELSE 1 END AS judged FROM w LEFT JOIN j ON j.id = w.id AND j.request_id = w.request_id) "
            f"SELECT v.id, v.request_id, v.model, v.role, v.labels, v.score, v.at, f.labels, f.source, f.at FROM "
            f"v{last} {'JOIN' if labelled_only else 'LEFT JOIN'} feedback f ON f.id = v.id AND v.judged = 1 "
            f"ORDER BY v.at, v.seq")


def lock_feedback(cur: Any, dialect: str, ids: Iterable[str]) -> None:
    """Hold off, until this write transaction ends, every other writer of the feedback of ``ids``, so that
    what it reads of them stays theirs until it writes: a writer that reads an id's label and then stores one
    must not find it new while another does the same. SQLite's writers hold the whole file already (BEGIN
    IMMEDIATE). PostgreSQL's row locks miss an id no row has yet (the upsert waits for the row another
    transaction inserts, then overwrites it): an advisory lock a hashed id, which needs no right on a table
    (a role granted rows only takes it), taken in one order (a collision only makes two writers wait)."""
    if dialect != "postgresql":
        return
    keys = sorted({zlib.crc32(i.encode("utf-8", "surrogatepass")) - 2**31 for i in ids})
    if keys:  # unnest yields them in the array's order, so every writer locks in ascending order
        cur.execute("SELECT count(pg_advisory_xact_lock(?, k)) FROM unnest(?::int4[]) AS k", (FEEDBACK_LOCK, keys))
        cur.fetchall()


def create_schema(cur: Any, dialect: str, create: bool = True) -> Statements | None:
    """Create the tables where they are missing and add the columns an older store lacks (``cur``: the
    store's cursor, in the transaction that opens it); returns the statements for the store as it then is.
    A store that has them all is left alone, so that a role without the right to create (a reader, an
    application role granted rows only) opens it, and one from before ``judged_seq`` that such a role may not
    change is used as it is (``BEFORE_SEQ``). Without ``create`` (a reader's) nothing is changed: missing
    tables give None, where a mistyped database would have got them."""
    have = _columns(cur, dialect)
    tables = {"predictions", "feedback"} <= set(have)
    if tables and "judged_seq" in have["feedback"]:
        return CURRENT
    if not create or (tables and not _may_alter(cur, dialect)):
        if create:
            _log.warning("the feedback store was made by an earlier release and this role may not add its column "
                         "feedback.judged_seq: each feedback judges its id's last answer until the tables' owner "
                         "opens the store once (or runs ALTER TABLE feedback ADD COLUMN judged_seq BIGINT)")
        return BEFORE_SEQ if tables else None
    if dialect == "postgresql":
        cur.execute("SELECT pg_advisory_xact_lock(?)", (SCHEMA_LOCK,))
    if not tables:  # CREATE TABLE IF NOT EXISTS needs the right to create even where the table exists
        for statement in SCHEMA.format(max_id=MAX_ID_LENGTH, **TYPES[dialect]).split(";"):
            cur.execute(statement)
    if dialect == "postgresql":  # a store made before judged_seq
        cur.execute(f"ALTER TABLE feedback ADD COLUMN IF NOT EXISTS judged_seq {TYPES[dialect]['int']}")
    else:
        cur.execute("PRAGMA table_info(feedback)")
        if "judged_seq" not in {row[1] for row in cur.fetchall()}:
            cur.execute(f"ALTER TABLE feedback ADD COLUMN judged_seq {TYPES[dialect]['int']}")
    return CURRENT


def _may_alter(cur: Any, dialect: str) -> bool:
    """Whether this role may add a column to the feedback table: in PostgreSQL, its owner (or a member of the
    owner's role); an SQLite file that opened for writing may be altered."""
    if dialect != "postgresql":
        return True
    cur.execute("SELECT pg_has_role(current_user, c.relowner, 'MEMBER') FROM pg_class c JOIN pg_namespace n ON "
                "n.oid = c.relnamespace WHERE c.relname = 'feedback' AND n.nspname = current_schema()")
    row = cur.fetchone()
    return bool(row and row[0])


def _columns(cur: Any, dialect: str) -> dict[str, set[str]]:
    """The store's tables that exist, with their columns."""
    if dialect == "postgresql":
        cur.execute("SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = "
                    "current_schema() AND table_name IN ('predictions', 'feedback')")
    else:
        cur.execute("SELECT m.name, p.name FROM sqlite_master m, pragma_table_info(m.name) p "
                    "WHERE m.type = 'table' AND m.name IN ('predictions', 'feedback')")
    out: dict[str, set[str]] = {}
    for table, column in cur.fetchall():
        out.setdefault(table, set()).add(column)
    return out


def credentials(url: str) -> tuple[str, str | None]:
    """The user and password of a URL, split at its last "@" (urlsplit stops at the first "/", "?" or "#",
    so a password holding one, not percent-encoded, was cut short there, and only its first characters
    were then hidden, wherever they occurred in a message)."""
    userinfo, at, _ = url.partition("://")[2].rpartition("@")
    if not at or ":" not in userinfo:
        return userinfo, None
    user, _, password = userinfo.partition(":")
    return user, password


def labels_of(value: Any) -> list[str]:
    return list(json.loads(value) if isinstance(value, str) else value)


def from_db(value: Any) -> datetime:
    return datetime.fromisoformat(value) if isinstance(value, str) else value.astimezone(UTC)
