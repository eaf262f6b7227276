"""The feedback store, on both of its databases: an SQLite file and a real PostgreSQL server
(tests/postgres_server.py). What the serving loop relies on: every answer kept, unknown ids told, a later
feedback replacing an earlier one, a batch written whole or not at all, several processes writing at
once, the data still there after a restart, and errors of one line that never show a password."""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from monitoring.feedback_store import (
    Feedback,
    FeedbackStore,
    Prediction,
    RejectedError,
    StoreError,
    open_store,
    redact,
)
from monitoring.store_schema import MAX_ID_LENGTH
from service.process import free_port
from tests.postgres_server import shared_postgres

MODEL = "han-test:abc123"
T0 = datetime(2026, 1, 1, tzinfo=UTC)
NOW = datetime.now(UTC).replace(microsecond=0)  # what a writer is given: older than its retention is deleted


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A new, empty store's setting: a file path, or a fresh database on the session's PostgreSQL server."""
    if request.param == "sqlite":
        return str(tmp_path / "store" / "feedback.db")
    return shared_postgres(request.config).create_database()


@pytest.fixture
def store(url: str, tmp_path: Path) -> Iterator[FeedbackStore]:
    with open_store(url, tmp_path / "unused.db") as opened:
        yield opened


def predictions(*ids: str, label: str = "pos", score: float = 0.9) -> list[Prediction]:
    return [Prediction(i, [label], score) for i in ids]


def test_unknown_ids_in_order(store: FeedbackStore) -> None:
    assert store.record_predictions("req-1", MODEL, predictions("a", "b")) == 2
    store.record_predictions("req-2", MODEL, predictions("c"), role="shadow")
    assert store.unknown(["x", "a", "c", "y", "x", "b"]) == ["x", "y"]
    assert store.unknown([]) == []
    many = [f"doc-{n}" for n in range(1200)]  # more than one IN (...) query's worth
    store.record_predictions("req-3", MODEL, predictions(*many[::2]))
    assert store.unknown(many) == many[1::2]


def test_later_feedback_replaces_the_earlier(store: FeedbackStore) -> None:
    store.record_predictions("req-1", MODEL, [Prediction("a", ["sport"], 0.8), Prediction("b", ["art", "tech"], 0.7)])
    store.add_feedback([Feedback("a", ["sport"])], source="first", at=T0)
    store.add_feedback([Feedback("a", ["politics"]), Feedback("b", ["art", "science"])], source="second",
                       at=T0 + timedelta(hours=1))
    assert len(store.feedback_labels()) == 2
    rows = {row.id: row for row in store.joined()}
    assert rows["a"].feedback == ["politics"]
    assert rows["a"].feedback_source == "second"
    assert rows["a"].feedback_at == T0 + timedelta(hours=1)
    assert rows["b"].predicted == ["art", "tech"]
    assert rows["b"].feedback == ["art", "science"]
    assert len(store.feedback_labels(since=T0 + timedelta(minutes=30))) == 2
    assert len(store.feedback_labels(until=T0 + timedelta(minutes=30))) == 0


def test_joined_in_a_window(store: FeedbackStore) -> None:
    hour = timedelta(hours=1)
    store.record_predictions("r0", MODEL, predictions("a", "b", label="neg"), at=T0)
    store.record_predictions("r1", MODEL, predictions("a", label="pos", score=0.6), at=T0 + hour)  # "a" again
    store.record_predictions("r1", "challenger:1", predictions("a", label="neg"), role="shadow", at=T0 + hour)
    store.record_predictions("r2", MODEL, predictions("c"), at=T0 + 3 * hour)
    store.add_feedback([Feedback("a", ["pos"]), Feedback("c", ["neg"])], source="client")

    window = list(store.joined(since=T0, until=T0 + 2 * hour))
    assert [(r.id, r.role, r.predicted, r.feedback) for r in window] == [
        ("b", "production", ["neg"], None),
        ("a", "production", ["pos"], ["pos"]),  # the latest answer for a reused id
        ("a", "shadow", ["neg"], ["pos"]),
    ]
    answer = window[1]
    assert (answer.request_id, answer.model, answer.score, answer.predicted_at) == ("r1", MODEL, 0.6, T0 + hour)
    assert answer.feedback_source == "client"
    assert answer.feedback_at is not None and answer.feedback_at.tzinfo is not None

    every = store.joined(since=T0, until=T0 + 2 * hour, role="production", latest=False)
    assert [(r.id, r.predicted) for r in every] == [("a", ["neg"]), ("b", ["neg"]), ("a", ["pos"])]
    assert [r.id for r in store.joined(model="challenger:1")] == ["a"]
    assert [r.id for r in store.joined(since=T0 + 2 * hour)] == ["c"]
    assert [r.id for r in store.joined(role="production", labelled_only=True)] == ["a", "c"]


def test_a_feedback_judges_the_answer_its_id_had_when_it_was_given(store: FeedbackStore) -> None:
    """A client reuses an id for another document: the earlier feedback stays with the earlier answer (its
    text is what it labelled), and a later feedback judges the later answer."""
    store.record_predictions("r1", MODEL, predictions("a", label="pos"))
    store.record_predictions("r1", "challenger:1", predictions("a", label="neg"), role="shadow")
    store.add_feedback([Feedback("a", ["pos"])])
    store.record_predictions("r2", MODEL, predictions("a", label="neg"))
    every = [(r.request_id, r.role, r.feedback) for r in store.joined(latest=False)]
    assert every == [("r1", "production", ["pos"]), ("r1", "shadow", ["pos"]), ("r2", "production", None)]
    assert [(r.request_id, r.feedback) for r in store.joined(role="production")] == [("r1", ["pos"])]
    assert [(r.request_id, r.role) for r in store.joined(labelled_only=True)] == [("r1", "production"),
                                                                                  ("r1", "shadow")]
    store.add_feedback([Feedback("a", ["neg"])])
    every = [(r.request_id, r.role, r.feedback) for r in store.joined(latest=False)]
    assert every == [("r1", "production", None), ("r1", "shadow", None), ("r2", "production", ["neg"])]


def test_a_store_made_before_judged_answers_opens_and_judges_the_last(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "old.db"
    with sqlite3.connect(path) as old:  # the schema before judged_seq, with a row of each
        old.executescript(
            "CREATE TABLE predictions (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL, request_id TEXT "
            "NOT NULL, model TEXT NOT NULL, role TEXT NOT NULL, labels TEXT NOT NULL, score REAL, at TEXT NOT NULL);"
            "CREATE TABLE feedback (id TEXT PRIMARY KEY, labels TEXT NOT NULL, source TEXT, at TEXT NOT NULL);"
            "INSERT INTO predictions (id, request_id, model, role, labels, score, at) VALUES "
            "('a', 'r1', 'm:1', 'production', '[\"neg\"]', 0.9, '2026-01-01T00:00:00.000000+00:00'), "
            "('a', 'r2', 'm:1', 'production', '[\"pos\"]', 0.9, '2026-01-01T01:00:00.000000+00:00');"
            "INSERT INTO feedback VALUES ('a', '[\"pos\"]', NULL, '2026-01-01T02:00:00.000000+00:00');")
    with open_store(str(path), tmp_path / "unused.db") as store:
        assert [(r.request_id, r.feedback) for r in store.joined(latest=False)] == [("r1", None), ("r2", ["pos"])]
        store.record_predictions("r3", "m:1", predictions("b"))
        store.add_feedback([Feedback("b", ["neg"])])
        assert [(r.id, r.feedback) for r in store.joined(labelled_only=True)] == [("a", ["pos"]), ("b", ["neg"])]


def test_roles_that_may_not_alter_use_a_store_made_before_judged_answers_as_it_is(
        tmp_path: Path, request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture) -> None:
    """A reader (SELECT only) and an application role granted rows only may not add the column a later release
    added: they use the store as it is, each feedback judging its id's last production answer, as the store's
    own release did (the service's feedback was refused with a 503 "not reachable"). Its owner then adds it."""
    import uuid

    import psycopg

    server = shared_postgres(request.config)
    url = server.create_database()
    reader, app = (f"{role}_{uuid.uuid4().hex[:8]}" for role in ("reader", "app"))
    with psycopg.connect(url, autocommit=True) as conn:  # the schema before judged_seq
        conn.execute("CREATE TABLE predictions (seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, id TEXT NOT NULL, "
                     "request_id TEXT NOT NULL, model TEXT NOT NULL, role TEXT NOT NULL, labels JSONB NOT NULL, "
                     "score DOUBLE PRECISION, at TIMESTAMPTZ NOT NULL)")
        conn.execute("CREATE TABLE feedback (id TEXT PRIMARY KEY, labels JSONB NOT NULL, source TEXT, "
                     "at TIMESTAMPTZ NOT NULL)")
        conn.execute("INSERT INTO predictions (id, request_id, model, role, labels, score, at) VALUES "
                     "('a', 'r1', 'm:1', 'production', '[\"neg\"]', 0.9, '2026-01-01T00:00:00+00:00'), "
                     "('a', 'r2', 'm:1', 'production', '[\"pos\"]', 0.9, '2026-01-01T01:00:00+00:00')")
        conn.execute("INSERT INTO feedback VALUES ('a', '[\"pos\"]', NULL, '2026-01-01T02:00:00+00:00')")
        conn.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
        for role, rights in ((reader, "SELECT"), (app, "SELECT, INSERT, UPDATE, DELETE")):
            conn.execute(f"CREATE ROLE {role} LOGIN")
            conn.execute(f"GRANT {rights} ON ALL TABLES IN SCHEMA public TO {role}")

    def judged_seq() -> bool:
        with psycopg.connect(url) as conn:
            columns = conn.execute("SELECT column_name FROM information_schema.columns WHERE table_name = 'feedback'")
            return "judged_seq" in {row[0] for row in columns.fetchall()}

    with open_store(url.replace("//postgres@", f"//{reader}@", 1), tmp_path / "unused.db", existing=True) as store:
        assert [(r.request_id, r.feedback) for r in store.joined(latest=False)] == [("r1", None), ("r2", ["pos"])]
    with open_store(url.replace("//postgres@", f"//{app}@", 1), tmp_path / "unused.db") as store:
        store.record_predictions("r3", "m:1", predictions("b"), at=T0)
        assert store.add_feedback([Feedback("b", ["neg"]), Feedback("a", ["neg"])]) == 2
        assert [(r.id, r.request_id, r.feedback) for r in store.joined(labelled_only=True)] == [
            ("b", "r3", ["neg"]), ("a", "r2", ["neg"])]
        assert store.forget_predictions(T0 + timedelta(days=1)) == 0  # as then: every answer of an id with feedback
    assert "may not add its column feedback.judged_seq" in caplog.text
    assert not judged_seq()
    with open_store(url, tmp_path / "unused.db") as store:  # the owner
        assert [(r.id, r.feedback) for r in store.joined(labelled_only=True)] == [("b", ["neg"]), ("a", ["neg"])]
    assert judged_seq()


def test_a_batch_is_written_whole_or_not_at_all(store: FeedbackStore) -> None:
    store.record_predictions("req-1", MODEL, predictions("a", "b", "c"))
    store.add_feedback([Feedback("a", ["neg"])], source="before", at=T0)

    # The database's own constraint (an id longer than any the store keeps) fails the last item, after the
    # others were upserted in the same transaction: none of them stays.
    too_long = "z" * (MAX_ID_LENGTH + 1)
    with pytest.raises(RejectedError):
        store.add_feedback([Feedback("a", ["pos"]), Feedback("b", ["pos"]), Feedback(too_long, ["pos"])])
    # An id that no prediction has: told by name, and nothing written either.
    with pytest.raises(RejectedError, match="'nope'") as rejected:
        store.add_feedback([Feedback("b", ["pos"]), Feedback("nope", ["pos"]), Feedback("c", ["pos"])])
    assert rejected.value.unknown == ["nope"]
    with pytest.raises(RejectedError):
        store.add_feedback([Feedback("b", "pos")])  # type: ignore[arg-type]  # a string, not a list of labels

    assert len(store.feedback_labels()) == 1
    assert {r.id: (r.feedback, r.feedback_source) for r in store.joined()} == {
        "a": (["neg"], "before"), "b": (None, None), "c": (None, None)}

    # The same for a prediction batch (an empty id breaks the constraint).
    with pytest.raises(RejectedError):
        store.record_predictions("req-2", MODEL, predictions("d", "e", ""))
    with pytest.raises(RejectedError, match="role"):
        store.record_predictions("req-2", MODEL, predictions("d"), role="canary")
    for bad in ("\x00", "f\x00g"):  # PostgreSQL's text cannot hold NUL; SQLite's length() stops at it
        with pytest.raises(RejectedError, match="NUL"):
            store.record_predictions("req-2", MODEL, predictions("d", bad))
        with pytest.raises(RejectedError, match="NUL"):
            store.add_feedback([Feedback("a", ["pos"]), Feedback(bad, ["pos"])])
    assert store.unknown(["d", "e"]) == ["d", "e"]


def test_a_row_the_store_refuses_never_holds_back_the_answers_behind_it(url: str, tmp_path: Path) -> None:
    """A serving worker's writer: a batch with a row the store refuses is written answer by answer and
    document by document, the refused row dropped and counted, and what was queued after it written."""
    from service.store_writer import StoreWriter

    class Count:
        value = 0

        def inc(self, n: int = 1) -> None:
            Count.value += n

    writer = StoreWriter(url, tmp_path / "unused.db", 90, Count)
    writer.put([("req-1", MODEL, "production", predictions("a", "\x00", "b"), NOW),
                ("req-2", MODEL, "production", predictions("c"), NOW)])
    assert writer.flush(30)
    writer.put([("req-3", MODEL, "production", predictions("d"), NOW)])
    assert writer.flush(30)
    with open_store(url, tmp_path / "unused.db") as store:
        assert store.unknown(["a", "b", "c", "d"]) == []
    assert Count.value == 1


def test_answers_queued_while_the_store_is_down_are_kept_at_shutdown_for_the_next_writer(url: str,
                                                                                         tmp_path: Path) -> None:
    """A worker stopping while the store is unreachable keeps its queue in a file beside the default
    store; the next worker's writer records it once the store is there, and only then says it has
    caught up (``flush``: what ``POST /feedback`` asks before calling an id unknown)."""
    from service.store_writer import StoreWriter

    class Count:
        value = 0

        def inc(self, n: int = 1) -> None:
            Count.value += n

    default = tmp_path / "deployment" / "feedback.sqlite3"
    down = StoreWriter(f"postgresql://han:pw@127.0.0.1:{free_port()}/gone", default, 90, Count)
    down.put([("req-1", MODEL, "production", predictions("a", "b"), NOW),
              ("req-2", MODEL, "shadow", predictions("c"), NOW)])
    assert not down.flush(0.5)
    down.close()
    kept = list((default.parent / "pending-answers").iterdir())
    assert [p.suffix for p in kept] == [".jsonl"] and Count.value == 0
    writers = [StoreWriter(url, default, 90, Count) for _ in range(2)]  # two siblings start at once
    deadline = time.monotonic() + 30
    while not all(w.flush(1) for w in writers) and time.monotonic() < deadline:
        pass
    assert writers[0].flush(0) and not list((default.parent / "pending-answers").iterdir())
    for w in writers:
        w.close()
    with open_store(url, tmp_path / "unused.db") as store:
        assert store.unknown(["a", "b", "c"]) == []
        assert store.latest_predictions(["a", "c"]) == {"a": (MODEL, ["pos"])}  # c was the shadow's
        with store._transaction(write=False) as cur:  # written once, by one of the two
            cur.execute("SELECT id, COUNT(*) FROM predictions GROUP BY id ORDER BY id")
            assert [tuple(row) for row in cur.fetchall()] == [("a", 1), ("b", 1), ("c", 1)]
    assert Count.value == 0


def test_answers_written_late_keep_their_time_and_place(url: str, tmp_path: Path) -> None:
    """An answer queued through an outage and kept at a shutdown reaches the store after a newer answer to
    its id: it keeps the time it was given, so the newer one stays the id's last, the one a feedback judges."""
    from service.store_writer import StoreWriter

    class Dropped:
        n = 0

        def inc(self, n: int = 1) -> None:
            Dropped.n += n

    default, then = tmp_path / "deployment" / "feedback.sqlite3", NOW - timedelta(hours=2)  # within retention
    down = StoreWriter(f"postgresql://han:pw@127.0.0.1:{free_port()}/gone", default, 90, Dropped)
    down.put([("req-1", MODEL, "production", predictions("a", label="neg"), then),
              ("req-1", MODEL, "shadow", predictions("a", label="neg"), then)])
    down.close()
    with open_store(url, tmp_path / "unused.db") as store:  # the store is back; the next worker answers first
        store.record_predictions("req-2", MODEL, predictions("a", label="pos"), at=then + timedelta(hours=1))
    writer = StoreWriter(url, default, 90, Dropped)  # ... then replays what was kept
    deadline = time.monotonic() + 30
    while not writer.flush(1) and time.monotonic() < deadline:
        pass
    writer.close()
    with open_store(url, tmp_path / "unused.db") as store:
        assert [(r.request_id, r.role, r.predicted_at) for r in store.joined(latest=False)] == [
            ("req-1", "production", then), ("req-1", "shadow", then),
            ("req-2", "production", then + timedelta(hours=1))]
        assert store.latest_predictions(["a"]) == {"a": (MODEL, ["pos"])}
        assert [r.request_id for r in store.joined(role="production")] == ["req-2"]
        store.add_feedback([Feedback("a", ["pos"])])
        assert [(r.request_id, r.feedback) for r in store.joined(role="production")] == [("req-2", ["pos"])]
        assert [(r.request_id, r.feedback) for r in store.joined(role="production", latest=False)] == [
            ("req-1", None), ("req-2", ["pos"])]
    assert Dropped.n == 0


def test_feedback_on_a_reused_id_judges_the_answer_still_queued(tmp_path: Path) -> None:
    """A client reuses an id: its new answer is still in the worker's queue (the store is busy) when the
    feedback arrives. The id is found in the store (its old answer), so the feedback waited for nothing and
    judged the old answer; it waits for what this worker queued before it."""
    from service.feedback import store_feedback
    from service.store_writer import StoreWriter

    class Count:
        def inc(self, n: int = 1) -> None:
            raise AssertionError("nothing is dropped here")

    url = str(tmp_path / "feedback.db")
    with open_store(url, tmp_path / "unused.db") as store:
        store.record_predictions("r1", MODEL, predictions("a", label="pos"), at=NOW - timedelta(minutes=1))
        writer = StoreWriter(url, tmp_path / "unused.db", 90, Count)
        assert writer.flush(30)
        busy = writer.store._lock  # the writer's own connection, held as a long transaction would
        busy.acquire()
        writer.put([("r2", MODEL, "production", predictions("a", label="neg"), NOW)])
        threading.Timer(0.15, busy.release).start()
        Item = type("Item", (), {})
        item = Item()
        item.id, item.label = "a", "neg"
        response, answered, refused, _ = store_feedback(store, [item], "test", writer.flush, ["neg", "pos"])
        assert answered["a"] == (MODEL, ["neg"]) and response.stored == 1 and not refused
        assert [(r.request_id, r.feedback) for r in store.joined(latest=False)] == [("r1", None), ("r2", ["neg"])]
        writer.close()


def test_durable_across_a_restart(url: str, tmp_path: Path) -> None:
    with open_store(url, tmp_path / "unused.db") as store:
        store.record_predictions("req-1", MODEL, predictions("a"))
        store.add_feedback([Feedback("a", ["neg"])])
    with open_store(url, tmp_path / "unused.db") as store:  # the schema is there already: opened as is
        assert store.unknown(["a", "b"]) == ["b"]
        assert [(r.id, r.feedback) for r in store.joined()] == [("a", ["neg"])]


def test_default_and_sqlite_urls(tmp_path: Path) -> None:
    default = tmp_path / "deep" / "folder" / "feedback.db"
    with open_store(None, default) as store:
        store.record_predictions("req-1", MODEL, predictions("a"))
        assert store.dialect == "sqlite"
    assert default.is_file()
    with open_store(f"sqlite://{default}", tmp_path / "other.db") as store:
        assert store.unknown(["a"]) == []
        mode = store._conn.execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"
    assert not (tmp_path / "other.db").exists()


def _write_at_once(url: str, worker: int, batches: int, barrier: multiprocessing.synchronize.Barrier) -> None:
    """One process of the concurrency test: open the store when the other does, then write."""
    barrier.wait(60)
    with open_store(url, Path("unused.db")) as store:
        store.record_predictions(f"w{worker}-shared", MODEL, predictions("shared"))  # both answer it
        barrier.wait(60)
        for batch in range(batches):
            ids = [f"w{worker}-{batch}-{n}" for n in range(4)]
            store.record_predictions(f"w{worker}-{batch}", MODEL, predictions(*ids))
            store.add_feedback([Feedback(ids[0], ["neg"]), Feedback("shared", [f"w{worker}"])], source=f"w{worker}")


def test_two_processes_write_at_once(url: str, tmp_path: Path) -> None:
    """Two real processes open a new store at the same moment (both create its schema) and write to it
    together; every row of both is kept."""
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(2)
    batches = 25
    workers = [context.Process(target=_write_at_once, args=(url, w, batches, barrier)) for w in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(180)
    assert [w.exitcode for w in workers] == [0, 0]
    with open_store(url, tmp_path / "unused.db") as store:
        rows = list(store.joined())
        assert len(rows) == 2 * batches * 4 + 1
        assert len(store.feedback_labels()) == 2 * batches + 1
        assert sum(r.feedback == ["neg"] for r in rows) == 2 * batches
        assert next(r.feedback for r in rows if r.id == "shared") in (["w0"], ["w1"])


def test_threads_share_a_store(store: FeedbackStore) -> None:
    def write(thread: int) -> None:
        for batch in range(10):
            store.record_predictions(f"t{thread}-{batch}", MODEL, predictions(f"t{thread}-{batch}"))

    threads = [threading.Thread(target=write, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(list(store.joined())) == 40


def test_unopenable_stores_say_why_in_one_line(tmp_path: Path) -> None:
    secret = "s3cr:et!"
    encoded = "s3cr%3Aet%21"
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("a file, not a folder")
    not_a_database = tmp_path / "notes.db"
    not_a_database.write_text("not SQLite" * 500)
    cases = {
        f"mysql://user:{encoded}@db.example:3306/feedback": "unsupported URL",
        f"postgresql://user:{encoded}@127.0.0.1:{free_port()}/feedback": "127.0.0.1",  # nothing listens there
        f"postgresql://user:{encoded}@127.0.0.1:{free_port()}/feedback?password={encoded}": "cannot open",
        str(not_a_folder / "feedback.db"): "not a folder",
        str(tmp_path): "unable to open",  # a folder, not a file
        f"sqlite://{not_a_database}": "not a database",
        # a password holding "@", "/" and "#", not percent-encoded: urlsplit cut it at the "/", and only its
        # first letter was hidden, wherever it occurred in psycopg's message
        f"postgresql://user:p@ss:w/rd%x#1{secret}@127.0.0.1:{free_port()}/feedback": "feedback store postgresql",
    }
    for url, problem in cases.items():
        with pytest.raises(StoreError) as raised:
            open_store(url, tmp_path / "unused.db")
        message = str(raised.value)
        assert "\n" not in message, message
        assert problem in message, message
        assert secret not in message and encoded not in message and "rd%x" not in message, message
        assert "***ss" not in message and "o***en" not in message, message  # no letter of the text hidden
        assert message.startswith("feedback store "), message


def test_redact() -> None:
    assert redact("postgresql://ann:pw@db:5432/fb?sslmode=require&password=pw") == "postgresql://ann:***@db:5432/fb"
    assert redact("postgresql://ann@db/fb") == "postgresql://ann@db/fb"
    assert redact("postgresql://ann:p@ss:w/rd%x#1@db:5432/fb") == "postgresql://ann:***@db:5432/fb"
    assert redact("/srv/han/feedback.db") == "/srv/han/feedback.db"  # a file's path, as it is


def test_reconnects_after_the_server_drops_it(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """A PostgreSQL server that restarts ends every connection: the next call opens a new one instead of
    failing a request."""
    import psycopg

    server = shared_postgres(request.config)
    url = server.create_database()
    with open_store(url, tmp_path / "unused.db") as store:
        store.record_predictions("req-1", MODEL, predictions("a"))
        database = url.rsplit("/", 1)[1]
        with psycopg.connect(server.url, autocommit=True) as admin:
            ended = admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                                  (database,)).fetchall()
        assert ended == [(True,)]
        assert store.unknown(["a", "b"]) == ["b"]


def test_roles_granted_rows_only_open_the_store_and_a_reader_creates_nothing(tmp_path: Path,
                                                                            request: pytest.FixtureRequest) -> None:
    """The store's owner makes the tables; an application role granted rows only (no CREATE on the schema)
    writes, and a read-only role reads: opening a store that has its tables runs no DDL. A reader pointed
    at a database without them (a mistyped name) is told so, and the database is left as it was."""
    import uuid

    import psycopg

    server = shared_postgres(request.config)
    url = server.create_database()
    with open_store(url, tmp_path / "unused.db") as store:
        store.record_predictions("req-1", MODEL, predictions("a"))
    reader, app = (f"{role}_{uuid.uuid4().hex[:8]}" for role in ("reader", "app"))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
        for role, rights in ((reader, "SELECT"), (app, "SELECT, INSERT, UPDATE, DELETE")):
            conn.execute(f"CREATE ROLE {role} LOGIN")
            conn.execute(f"GRANT {rights} ON ALL TABLES IN SCHEMA public TO {role}")

    def as_role(role: str) -> str:
        return url.replace("//postgres@", f"//{role}@", 1)

    with open_store(as_role(app), tmp_path / "unused.db") as store:
        store.record_predictions("req-2", MODEL, predictions("b"))
        store.add_feedback([Feedback("b", ["pos"])])
    with open_store(as_role(reader), tmp_path / "unused.db", existing=True) as store:
        assert store.unknown(["a", "b", "c"]) == ["c"]
    empty = server.create_database()
    with pytest.raises(StoreError, match="it has no feedback tables"):
        open_store(empty, tmp_path / "unused.db", existing=True)
    with psycopg.connect(empty) as conn:
        assert conn.execute("SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'"
                            ).fetchone()[0] == 0
