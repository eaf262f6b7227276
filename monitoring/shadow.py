"""Shadow traffic: a challenger answers a share of live documents beside production, into the log only.

``han-model shadow NAME:VERSION --fraction F`` writes ``shadow.json`` beside the production pointer;
each serving worker follows it as it follows the pointer (a stat twice a second), loads the version
beside the serving one in a thread, and then copies a share F of the requests it answered to a queue.
The user's answer never waits for the challenger: the copies are classified after the response, in
batches of a few documents, only in the gaps of production's traffic (no request waiting, no batch
running or just ended), borrowing production's one model call at a time, never beside it. Under load
that leaves no gap, copies are dropped and counted: after MAX_WAIT, or past QUEUE_DOCUMENTS. A version
that cannot load is logged and reported; production is untouched.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import os
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio

from model_store.production import deployment_dir

logger = logging.getLogger("han.service")
POLL_SECONDS = 0.5
QUEUE_DOCUMENTS = 512  # copies waiting for the challenger; past this, new copies are dropped
MAX_WAIT = 10.0  # seconds a copy waits for a gap in production's traffic before it is dropped
BATCH_DOCUMENTS = 2  # the challenger's batches: short, so that a production request never waits long


def shadow_path(name: str) -> Path:
    return deployment_dir(name) / "shadow.json"


def read_shadow(name: str) -> dict[str, Any] | None:
    """The shadow asked for (``tag``, ``fraction``, ``since``), or None."""
    try:
        record = json.loads(shadow_path(name).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("tag"), str):
        return None
    return record


def start_shadow(tag: str, fraction: float) -> dict[str, Any]:
    """Ask every service of the tag's name to shadow ``tag`` with ``fraction`` of its documents."""
    if not 0 < fraction <= 1:
        raise ValueError(f"--fraction must be above 0 and at most 1, not {fraction:g}")
    name = tag.partition(":")[0]
    record = {"tag": tag, "fraction": fraction, "since": datetime.now(UTC).isoformat(timespec="seconds"),
              "asked": uuid.uuid4().hex}  # a worker's failure names the request it answers
    path = shadow_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".shadow.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return record


def stop_shadow(name: str) -> dict[str, Any] | None:
    """End the shadow of ``name``; returns what it was."""
    record = read_shadow(name)
    shadow_path(name).unlink(missing_ok=True)
    return record


@dataclass
class Copy:
    request_id: str
    ids: list[str]
    texts: list[str]
    at: float  # when it was queued (time.monotonic)


class ShadowRunner:
    """In a serving worker: follows ``shadow.json`` and classifies the copies with the challenger.

    ``load(tag)`` returns a pipeline (it runs in a thread); ``record(request_id, tag, ids, texts, results,
    profiles)`` logs the challenger's answers; ``busy()`` says whether production has work waiting."""

    def __init__(self, name: str, load: Callable[[str], Any], record: Callable[..., None],
                 busy: Callable[[], bool], limiter: anyio.CapacityLimiter | None = None) -> None:
        self.name, self.load, self.record, self.busy = name, load, record, busy
        self.tag: str | None = None
        self.pipeline: Any = None
        self.fraction = 0.0
        self.failed: dict[str, str] | None = None
        self.dropped = 0
        self.answered = 0
        self._stamp: tuple[int, int] | None = None
        self._queue: collections.deque[Copy] = collections.deque()
        self._queued = 0
        self._wake = asyncio.Event()
        self._limiter = limiter or anyio.CapacityLimiter(1)  # production's: never a shadow batch beside its own
        self._loading = anyio.CapacityLimiter(1)
        self._random = random.Random()

    def status(self) -> dict[str, Any] | None:
        """What a worker reports of its shadow (None: none asked for)."""
        if self.tag is None and self.failed is None:
            return None
        return {"tag": self.tag, "fraction": self.fraction, "failed": self.failed, "dropped": self.dropped,
                "answered": self.answered}

    def offer(self, request_id: str, ids: list[str], texts: list[str]) -> None:
        """A production request was answered: copy it to the challenger with the shadow's probability."""
        if self.pipeline is None or self._random.random() >= self.fraction:
            return
        if self._queued + len(texts) > QUEUE_DOCUMENTS:
            self.dropped += len(texts)
            return
        self._queue.append(Copy(request_id, ids, texts, time.monotonic()))
        self._queued += len(texts)
        self._wake.set()

    async def run(self) -> None:
        """Poll the shadow file and classify the copies (a task of the worker's event loop)."""
        follow = asyncio.get_running_loop().create_task(self._follow())
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                while self._queue:
                    while self.busy():  # production first: wait for a gap in its traffic
                        await asyncio.sleep(0.005)
                        self._shed()
                    batch = self._take()
                    with contextlib.suppress(Exception):  # the challenger failing must not end the shadow
                        await self._classify(batch)
        finally:
            follow.cancel()

    def _shed(self) -> None:
        """While production keeps the worker busy, copies older than MAX_WAIT go: dropped, counted."""
        while self._queue and time.monotonic() - self._queue[0].at > MAX_WAIT:
            copy = self._queue.popleft()
            self._queued -= len(copy.texts)
            self.dropped += len(copy.texts)

    def _take(self) -> list[Copy]:
        """The next batch: at most BATCH_DOCUMENTS documents, the front of a larger copy where it must be split
        (a 256-document request taken whole held production's model call for as long)."""
        taken, documents = [], 0
        while self._queue and documents < BATCH_DOCUMENTS:
            copy, room = self._queue[0], BATCH_DOCUMENTS - documents
            if len(copy.texts) <= room:
                part = self._queue.popleft()
            else:
                part = Copy(copy.request_id, copy.ids[:room], copy.texts[:room], copy.at)
                copy.ids, copy.texts = copy.ids[room:], copy.texts[room:]
            taken.append(part)
            documents += len(part.texts)
        self._queued -= documents
        return taken

    async def _classify(self, batch: list[Copy]) -> None:
        pipeline, tag = self.pipeline, self.tag
        if pipeline is None or tag is None:
            return
        await anyio.to_thread.run_sync(self._answer, pipeline, tag, batch, limiter=self._limiter)

    def _answer(self, pipeline: Any, tag: str, batch: list[Copy]) -> None:
        """In a thread: the challenger's answers, and their record (a file and a queue: never the event loop)."""
        texts = [t for c in batch for t in c.texts]
        profiles: list[tuple[int, int]] = []
        results = pipeline(texts, errors="return", profiles=profiles)
        start = 0
        for c in batch:
            end = start + len(c.texts)
            kept = [k for k in range(start, end) if not hasattr(results[k], "reason")]
            self.record(c.request_id, tag, [c.ids[k - start] for k in kept], [texts[k] for k in kept],
                        [results[k] for k in kept], [profiles[k] for k in kept])
            self.answered += len(kept)
            start = end

    async def _follow(self) -> None:
        while True:
            with contextlib.suppress(Exception):
                await self._poll()
            await asyncio.sleep(POLL_SECONDS)

    async def _poll(self) -> None:
        path = shadow_path(self.name)
        try:
            st = path.stat()
            stamp: tuple[int, int] | None = (st.st_mtime_ns, st.st_ino)
        except OSError:
            stamp = None
        if stamp == self._stamp:
            return
        self._stamp = stamp
        record = read_shadow(self.name)
        if record is None:
            if self.tag is not None:
                logger.info("shadow of %s ended", self.tag)
            self.tag, self.pipeline, self.fraction, self.failed = None, None, 0.0, None
            self._queue.clear()
            self._queued = 0
            return
        self.fraction = float(record.get("fraction", 0.0))
        if record["tag"] == self.tag and self.pipeline is not None:
            return
        self.pipeline, self.tag, self.failed = None, None, None
        started = time.monotonic()
        try:
            pipeline = await anyio.to_thread.run_sync(self.load, record["tag"], limiter=self._loading)
        except Exception as e:  # whatever it is, production goes on as it was
            reason = f"{e.__class__.__name__}: {e}".splitlines()[0]
            self.failed = {"tag": record["tag"], "reason": reason, "asked": record.get("asked")}
            logger.error("cannot shadow %s: %s; production is unaffected", record["tag"], reason)
            return
        if stamp == self._stamp:  # still what the file asks for
            self.pipeline, self.tag = pipeline, record["tag"]
            logger.info("shadowing %s with %.0f%% of documents (loaded in %.1f s)", self.tag, 100 * self.fraction,
                        time.monotonic() - started)
