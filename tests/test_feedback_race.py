"""The same feedback sent twice at once (a client retrying a timed-out request through a load balancer, so
two workers or replicas store it together) is new to one of the two only: ``han_feedback_total`` counts a
document's label once, as docs/monitoring.md says. Real stores written by real processes, on both databases:
an SQLite file and a real PostgreSQL server (tests/postgres_server.py). The writers are let go together while
another transaction holds the feedback table (as a long write of another replica does), so that every one of
them is under way before any can write: the race the service met now and then, every time."""

from __future__ import annotations

import multiprocessing
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from monitoring.feedback_store import Feedback, Prediction, open_store
from service.feedback import store_feedback
from tests.postgres_server import shared_postgres

MODEL = "han-test:abc123"
WRITERS = 4  # the same request at once, each from a process of its own (a worker or replica each)
IDS = 20  # ids a request


@dataclass
class Item:
    """A ``POST /feedback`` item as the service parses it (single-label)."""

    id: str
    label: str


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "feedback.db")
    return shared_postgres(request.config).create_database()


IDS_SENT = [f"doc-{n}" for n in range(IDS)]
REQUEST = [Item(i, "neg" if n % 2 else "pos") for n, i in enumerate(IDS_SENT)]
CORRECTED = [Item(IDS_SENT[0], "neg"), *REQUEST[1:]]
PHASES = [(REQUEST, True), (REQUEST, False), (CORRECTED, True)]  # what all send at once; whether held off


def _writer(url: str, barrier: Any, results: Any) -> None:
    """One worker or replica (a process of its own, as they are): each phase's feedback, sent when every
    other writer sends it too; what it found new goes back."""
    with open_store(url, Path("unused.db")) as store:
        barrier.wait(60)  # opened (which writes, on a new store) before the table is held
        for send, _ in PHASES:
            barrier.wait(60)
            results.put(store_feedback(store, send, "retry", lambda timeout: True, ["neg", "pos"])[3])


@contextmanager
def holder(url: str) -> Iterator[tuple[Callable[[], Any], Callable[[], None], Callable[[], Any]]]:
    """Another transaction that holds the feedback table against writers (readers go on): take, wait until
    the writers are under way (PostgreSQL: all of them waiting for a lock; SQLite: a while), release."""
    if not url.startswith("postgresql"):
        conn = sqlite3.connect(url, isolation_level=None)
        try:
            yield (lambda: conn.execute("BEGIN IMMEDIATE"), lambda: time.sleep(0.5),
                   lambda: conn.execute("ROLLBACK"))
        finally:
            conn.close()
        return
    import psycopg

    with psycopg.connect(url) as conn, psycopg.connect(url, autocommit=True) as watch:
        def waiting() -> None:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and watch.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND "
                    "wait_event_type = 'Lock'").fetchone()[0] < WRITERS:
                time.sleep(0.02)

        yield lambda: conn.execute("LOCK TABLE feedback IN SHARE ROW EXCLUSIVE MODE"), waiting, conn.rollback


def test_the_same_feedback_at_once_is_new_once(url: str, tmp_path: Path) -> None:
    with open_store(url, tmp_path / "unused.db") as store:
        store.record_predictions("req-1", MODEL, [Prediction(i, ["pos"], 0.9) for i in IDS_SENT])
    context = multiprocessing.get_context("fork")
    barrier, results = context.Barrier(WRITERS + 1), context.Queue()
    writers = [context.Process(target=_writer, args=(url, barrier, results)) for _ in range(WRITERS)]
    for writer in writers:
        writer.start()
    found = []
    try:
        with holder(url) as (take, under_way, release):
            barrier.wait(60)
            for _, held in PHASES:
                if held:
                    take()
                barrier.wait(60)
                if held:
                    under_way()
                    release()
                found.append([results.get(timeout=60) for _ in range(WRITERS)])
    finally:
        for writer in writers:
            writer.join(60)
    assert [w.exitcode for w in writers] == [0] * WRITERS
    counted = [sorted(i for new in phase for i in new) for phase in found]
    # each label once, not once a writer; nothing when sent again; a corrected label once more
    assert counted == [sorted(IDS_SENT), [], [IDS_SENT[0]]], [len(c) for c in counted]
    with open_store(url, tmp_path / "unused.db") as store:
        assert store.feedback_of(IDS_SENT[:3]) == {"doc-0": ["neg"], "doc-1": ["neg"], "doc-2": ["pos"]}


def test_update_feedback_returns_what_is_new(url: str, tmp_path: Path) -> None:
    """What ``update_feedback`` returns: the ids whose stored labels differ from what they had (an id given
    twice keeps its last labels); ``add_feedback`` still returns how many items it stored."""
    with open_store(url, tmp_path / "unused.db") as store:
        store.record_predictions("req-1", MODEL, [Prediction(i, ["pos"], 0.9) for i in "abc"])
        assert store.add_feedback([Feedback("a", ["pos"]), Feedback("b", ["neg"])]) == 2
        new = store.update_feedback([Feedback("a", ["pos"]), Feedback("b", ["pos"]), Feedback("c", ["neg"]),
                                     Feedback("c", ["pos", "neg"])], source="second")
        assert new == {"b": ["pos"], "c": ["pos", "neg"]}
        assert store.update_feedback([Feedback("c", ["pos", "neg"])]) == {}
        assert store.feedback_of("abc") == {"a": ["pos"], "b": ["pos"], "c": ["pos", "neg"]}
