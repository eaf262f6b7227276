"""A serving worker's writer of answers into the feedback store: a queue and a thread of its own.

A slow or unreachable database never holds an answer back, and a worker starts without one. While the
store is down the answers wait in the queue (retried every few seconds). A worker that stops before the
store returns keeps what is still queued in a file beside the default store
(``deployments/NAME/pending-answers/``), and the next worker of the name to start writes it, so a
restart during an outage loses no answer; until then ``POST /feedback`` calls such ids "catching up"
(503), not unknown. Only a worker killed outright (SIGKILL, out of memory) loses its queue.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import queue
import re
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from monitoring.feedback_store import FeedbackStore, Prediction, RejectedError, StoreError, open_store, redact

logger = logging.getLogger("han.service")
QUEUE_ROWS = 100_000  # predictions waiting for the store; past this, new ones are dropped (and counted)
RETRY_SECONDS = 5.0  # after the store fails, the next try
RETENTION_EVERY = 3600.0  # seconds between deletions of old predictions
PENDING = "pending-answers"  # the folder, beside the default store, of answers kept at shutdown
# (request_id, model tag, role, predictions, when answered): the time travels with the answer, so that one
# written after an outage, or kept and replayed after a restart, keeps its place among the others
Row = tuple[str, str, str, list[Prediction], datetime]
_STOP = ("", "", "", [], datetime.min)  # put by ``close``: the writer stops once it has written what was queued before
_KEPT = re.compile(r"\d+-\d+\.jsonl")  # a kept file's name: when it was kept, by which pid


class StoreWriter:
    """The feedback store of a worker, opened on first use and written by a thread of its own."""

    def __init__(self, url: str | None, default: Path, retention_days: int, dropped: Any) -> None:
        self.url, self.default, self.retention = url, default, timedelta(days=retention_days)
        self.pending = default.parent / PENDING
        self._store: FeedbackStore | None = None
        self._failed_at = 0.0
        self._open_lock = threading.Lock()
        # Answers not yet written, kept or dropped: its unfinished tasks are what ``flush`` waits for.
        self._queue: queue.Queue[Row] = queue.Queue(QUEUE_ROWS)
        # Answers put, and answers settled (written, kept or dropped), counted so that ``flush`` waits for
        # those queued before it alone: under steady traffic the queue is rarely empty.
        self._counts = threading.Condition()
        self._put = self._settled = 0
        self._dropped = dropped
        self._inflight: list[Row] = []  # the batch the thread is writing
        self._stopping = threading.Event()
        self._pruned = 0.0
        self._refused_at = 0.0
        self._thread = threading.Thread(target=self._write, name="han-feedback-store", daemon=True)
        self._thread.start()

    @property
    def store(self) -> FeedbackStore:
        """The open store; StoreError (one line) while it cannot be reached (tried again after a pause)."""
        with self._open_lock:
            if self._store is None:
                if time.monotonic() - self._failed_at < RETRY_SECONDS and self._failed_at:
                    where = redact(self.url) if self.url else self.default
                    raise StoreError(f"feedback store {where}: not reachable (tried "
                                     f"{time.monotonic() - self._failed_at:.0f} s ago)")
                try:
                    self._store = open_store(self.url, self.default)
                except StoreError:
                    self._failed_at = time.monotonic()
                    raise
            return self._store

    def put(self, answers: Sequence[Row]) -> None:
        for answer in answers:
            with self._counts:
                self._put += 1
            try:
                self._queue.put_nowait(answer)
            except queue.Full:
                self._dropped().inc(len(answer[3]))
                self._settle(1)

    def _settle(self, n: int) -> None:
        with self._counts:
            self._settled += n
            self._counts.notify_all()

    def flush(self, timeout: float) -> bool:
        """Wait until what was queued is written (what ``POST /feedback`` does before naming an id unknown);
        False while it is not, or while answers kept at a shutdown still wait to be written."""
        with self._counts:
            target = self._put
            done = self._counts.wait_for(lambda: self._settled >= target, timeout)
        return done and not self._kept_files()

    def close(self, timeout: float = 15.0) -> None:
        """At shutdown: what is queued is written if the store takes it within ``timeout`` seconds, and
        otherwise kept in a file for the next worker."""
        self._stopping.set()
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(_STOP)
        self._thread.join(timeout)
        if self._thread.is_alive():  # stuck in a write: keep it (a write that ends after all is a duplicate
            self._keep(list(self._inflight) + self._drain())  # row, which the store's readers tolerate)
        else:
            self._keep(self._drain())  # answered after the thread stopped

    # -- the writer's thread -------------------------------------------------------------------------
    def _write(self) -> None:
        try:
            self.store  # noqa: B018  # opened now, not at the first answer (a server's schema check takes a while)
        except Exception as e:
            logger.error("cannot open the feedback store: %s", _line(e))
        warned, replay_at, due = 0.0, 0.0, bool(self._kept_files())
        while True:
            if due and time.monotonic() >= replay_at and not self._stopping.is_set():
                due = not self._replay() or bool(self._kept_files())  # still due: a sibling's, or failed
                replay_at = time.monotonic() + RETRY_SECONDS
            try:
                batch = [self._queue.get(timeout=RETRY_SECONDS if due else None)]
            except queue.Empty:
                continue
            while len(batch) < 1000 and batch[-1] is not _STOP:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            taken, stop = len(batch), batch[-1] is _STOP
            self._inflight = batch = [b for b in batch if b is not _STOP]
            rows = len(batch)
            while batch:
                try:
                    self._record(batch)
                except Exception as e:  # the store is down: keep the rows, try again after a pause
                    if time.monotonic() - warned > 60:
                        warned = time.monotonic()
                        logger.error("cannot record predictions in the feedback store: %s", _line(e))
                    if self._stopping.is_set():
                        self._keep(batch + self._drain())
                        stop = True
                        break
                    if self._queue.qsize() >= QUEUE_ROWS // 2:  # and drop the oldest rather than grow
                        self._dropped().inc(sum(len(a[3]) for a in batch))
                        break
                    self._stopping.wait(RETRY_SECONDS)
                    continue
                self._retain()  # never raises: a batch written is never written again
                break
            self._inflight = []
            for _ in range(taken):
                self._queue.task_done()
            self._settle(rows)
            if stop:
                return

    def _drain(self) -> list[Row]:
        rows = []
        while True:
            try:
                row = self._queue.get_nowait()
            except queue.Empty:
                return rows
            self._queue.task_done()
            if row is not _STOP:
                rows.append(row)
                self._settle(1)

    def _record(self, batch: list[Row]) -> None:
        """Write a batch. Where the store refuses it (a rule broken, which no retry mends), each answer and
        then each document is written on its own, and those refused are dropped, counted and named (once
        a minute at most), so that one bad row never holds back the answers queued behind it."""
        try:
            self.store.record_many(batch)
            return
        except RejectedError:
            pass
        for request_id, tag, role, predictions, at in batch:
            try:
                self.store.record_many([(request_id, tag, role, predictions, at)])
                continue
            except RejectedError:
                pass
            for prediction in predictions:
                try:
                    self.store.record_many([(request_id, tag, role, [prediction], at)])
                except RejectedError as e:
                    self._dropped().inc()
                    if time.monotonic() - self._refused_at > 60:
                        self._refused_at = time.monotonic()
                        logger.error("the feedback store refused the answer to id %r (request %s), not recorded: %s",
                                     prediction.id[:80], request_id, str(e).splitlines()[0])

    def _retain(self) -> None:
        if time.monotonic() - self._pruned > RETENTION_EVERY:
            self._pruned = time.monotonic()
            try:
                self.store.forget_predictions(datetime.now(UTC) - self.retention)
            except Exception as e:  # tried again within the hour
                logger.error("cannot delete old predictions from the feedback store: %s", _line(e))

    # -- answers kept across a restart ---------------------------------------------------------------
    def _keep(self, rows: list[Row]) -> None:
        """Write ``rows`` to a new file in the pending folder (whole or not at all), and say so."""
        if not rows:
            return
        n = sum(len(r[3]) for r in rows)
        path = self.pending / f"{time.time_ns()}-{os.getpid()}.jsonl"
        try:
            self.pending.mkdir(parents=True, exist_ok=True)
            partial = path.with_name(path.name + ".partial")
            with partial.open("w", encoding="utf-8") as f:
                for request_id, tag, role, predictions, at in rows:
                    f.write(json.dumps({"at": at.isoformat(), "request_id": request_id, "model": tag, "role": role,
                                        "predictions": [[p.id, p.labels, p.score] for p in predictions]},
                                       ensure_ascii=False) + "\n")
            partial.replace(path)
        except OSError as e:
            self._dropped().inc(n)
            logger.error("%d answers not recorded in the feedback store (it is unreachable) and not kept: %s",
                         n, _line(e))
            return
        logger.error("the feedback store is unreachable: %d answers kept in %s; the next worker to start "
                     "records them", n, path)

    def _kept_files(self) -> list[Path]:
        try:
            return sorted(p for p in self.pending.iterdir() if _KEPT.fullmatch(p.name))
        except OSError:
            return []

    def _replay(self) -> bool:
        """Record the answers kept by stopped workers, a file at a time, each under an exclusive lock so
        that sibling workers never write one twice. False when the store failed (tried again later);
        never raises, so that the writer's thread lives on."""
        for path in self._kept_files():
            try:
                if not self._replay_file(path):
                    return False
            except Exception as e:
                logger.error("cannot record the kept answers in %s: %s", path, _line(e))
                return False
        return True

    def _replay_file(self, path: Path) -> bool:
        try:
            f = path.open("r", encoding="utf-8")
        except FileNotFoundError:
            return True  # written and removed by a sibling
        with f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return True  # a sibling is writing it
            try:
                if os.fstat(f.fileno()).st_ino != os.stat(path).st_ino:
                    return True  # a sibling wrote and removed it before this lock
            except FileNotFoundError:
                return True
            try:
                items = [json.loads(line) for line in f.read().splitlines() if line]
                rows = [_row(item) for item in items]
            except (ValueError, KeyError, TypeError, IndexError) as e:  # never blocks the others: set aside
                path.replace(path.with_suffix(".unreadable"))
                logger.error("cannot read the kept answers in %s (set aside as .unreadable): %s", path, _line(e))
                return True
            try:
                self._record(rows)
            except Exception as e:
                logger.error("cannot record the kept answers in %s yet: %s", path.name, _line(e))
                return False
            path.unlink(missing_ok=True)  # before the lock is released
        logger.info("recorded %d answers kept at a shutdown (%s)", sum(len(r[3]) for r in rows), path.name)
        return True


def _row(item: dict[str, Any]) -> Row:
    at = datetime.fromisoformat(item["at"])
    return (item["request_id"], item["model"], item["role"],
            [Prediction(i, labels, score) for i, labels, score in item["predictions"]],
            at if at.tzinfo else at.replace(tzinfo=UTC))


def _line(e: BaseException) -> str:
    return f"{e.__class__.__name__}: {e}".splitlines()[0]
