"""The feedback store over time, on both of its databases (an SQLite file, a real PostgreSQL server): retention
keeps of a reused id only the answer its feedback judged, a clock that steps back does not pair a feedback with
an earlier answer, and a report reads the store as it streams rather than holding every row."""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from monitoring.feedback_store import Feedback, FeedbackStore, Prediction, open_store
from tests.postgres_server import shared_postgres

MODEL = "han-test:abc123"
NOW = datetime.now(UTC).replace(microsecond=0)


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[FeedbackStore]:
    """A new, empty store: a file, or a fresh database on the session's PostgreSQL server."""
    sqlite = request.param == "sqlite"
    url = str(tmp_path / "feedback.db") if sqlite else shared_postgres(request.config).create_database()
    with open_store(url, tmp_path / "unused.db") as opened:
        yield opened


def answer(store: FeedbackStore, request_id: str, doc: str, label: str, at: datetime, role: str = "production") -> None:
    store.record_predictions(request_id, MODEL, [Prediction(doc, [label], 0.9)], role=role, at=at)


def test_retention_keeps_only_the_answer_a_feedback_judged(store: FeedbackStore) -> None:
    """A client reuses its ids every day and labelled one answer of ``a`` once: its other answers older than
    the retention go (they were all kept, so the table grew without bound); the judged one, and the shadow's
    copy of it, stay with the feedback, and so do the answers within the retention."""
    old = NOW - timedelta(days=100)
    answer(store, "day-1", "a", "neg", old)
    answer(store, "day-1", "a", "neg", old, role="shadow")
    answer(store, "day-1", "b", "neg", old)
    answer(store, "day-2", "a", "pos", old + timedelta(days=1))
    answer(store, "day-2", "a", "pos", old + timedelta(days=1), role="shadow")
    store.add_feedback([Feedback("a", ["pos"])], at=old + timedelta(days=1, minutes=1))  # judges day-2's
    answer(store, "day-3", "a", "neg", old + timedelta(days=2))
    answer(store, "day-99", "a", "neg", NOW - timedelta(days=1))
    assert store.forget_predictions(NOW - timedelta(days=90)) == 4  # day-1's three and day-3's
    assert [(r.request_id, r.role, r.feedback) for r in store.joined(latest=False)] == [
        ("day-2", "production", ["pos"]), ("day-2", "shadow", ["pos"]), ("day-99", "production", None)]
    assert store.unknown(["a", "b"]) == ["b"]
    assert store.forget_predictions(NOW - timedelta(days=90)) == 0


def test_a_clock_stepping_back_does_not_pair_feedback_with_an_earlier_answer(store: FeedbackStore) -> None:
    """The host clock steps back 1 h between two answers to a reused id: the feedback the client gives for
    the answer it just got judges that one, not the earlier answer (another document) stamped later."""
    fast = NOW + timedelta(minutes=30)  # the clock was fast, then stepped back 45 min
    answer(store, "req-old-document", "ticket-17", "pos", fast)
    answer(store, "req-new-document", "ticket-17", "neg", fast - timedelta(minutes=45))
    assert store.latest_predictions(["ticket-17"]) == {"ticket-17": (MODEL, ["neg"])}  # what the label is checked on
    store.add_feedback([Feedback("ticket-17", ["neg"])])  # now: the client labels the answer it just got
    assert [(r.request_id, r.predicted, r.feedback) for r in store.joined(labelled_only=True)] == [
        ("req-new-document", ["neg"], ["neg"])]
    # the clock has caught up and the client reuses the id again: that answer is judged next
    answer(store, "req-third", "ticket-17", "pos", fast + timedelta(minutes=5))
    store.add_feedback([Feedback("ticket-17", ["pos"])], at=fast + timedelta(minutes=6))
    assert [(r.request_id, r.feedback) for r in store.joined(labelled_only=True)] == [("req-third", ["pos"])]


def test_joined_streams_its_rows(store: FeedbackStore) -> None:
    """``joined`` yields rows as it reads them, a batch at a time (``han-model monitor`` held a store's every
    labelled row at once), on a connection of its own: the store takes writes while a read is under way."""
    n = 10_000
    store.record_predictions("req-1", MODEL, [Prediction(f"document-{i:06d}", ["pos"], 0.9) for i in range(n)],
                             at=NOW - timedelta(hours=1))
    rows = store.joined()
    assert isinstance(rows, Iterator) and not isinstance(rows, list)
    assert next(rows).id == "document-000000"
    assert store.add_feedback([Feedback("document-000001", ["neg"])]) == 1  # while the read is open
    rows.close()
    tracemalloc.start()
    try:
        count = sum(1 for _ in store.joined())
        streamed = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        everything = list(store.joined())
        listed = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert count == len(everything) == n
    assert streamed * 3 < listed, (streamed, listed)
    assert [(r.id, r.feedback) for r in everything[:2]] == [("document-000000", None), ("document-000001", ["neg"])]
