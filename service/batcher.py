"""Batching across requests: each worker gathers the documents of concurrent requests into one model call.

A request that finds the model idle runs at once; those that arrive while a batch runs go together in
the next one, so batches grow with the load and an idle service adds no waiting. After a batch, the
next waits briefly for the callers it just answered (who would otherwise split into two groups taking
turns at half the batch size), unless few of them came back during recent waits (many independent
callers). BentoML's adaptive batching sits behind an HTTP hop to a dependent service, which costs more.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import time
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import anyio

from service.settings import Settings

T = TypeVar("T")
R = TypeVar("R")
MAX_BATCH_DOCUMENTS = 256  # documents per model call, gathered from concurrent requests
IDLE_SECONDS = 1.0  # without a request for this long, ``on_idle`` runs (once)
WAIT_SHARE = 0.5  # ... and at most this share of the previous batch's run time
IDLE_GAP = 0.05  # a batch that ended this recently still counts as busy (busy())
PROBE_EVERY = 8  # while callers do not come back, one batch in this many still waits (to notice when they do)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class RequestBatcher(Generic[T, R]):
    """Gathers concurrent requests into one call of ``run`` (in a worker thread), in arrival order.

    ``run`` takes a list of requests and returns one result per request; if it raises, every
    request of the batch gets the exception. A request that arrives while the model is
    idle is run at once; the ones that arrive during a batch are queued and run together next,
    up to ``max_items`` items (a larger request runs alone). After a batch, the next waits until the
    queue holds as many items as that batch and the queue did together, or for at most ``wait``
    seconds and ``WAIT_SHARE`` of the batch's run time. ``on_batch(requests, items)`` is called for
    each batch (metrics); ``on_idle()`` once the queue has been empty for ``idle_seconds`` (in the
    worker thread, never beside a batch; a request cancels the wait).
    """

    def __init__(
        self,
        run: Callable[[list[T]], Sequence[R]],
        size: Callable[[T], int] = lambda _: 1,
        max_items: int = MAX_BATCH_DOCUMENTS,
        on_batch: Callable[[int, int], None] | None = None,
        on_idle: Callable[[], None] | None = None,
        idle_seconds: float = IDLE_SECONDS,
        wait: float = Settings.batch_wait,
    ) -> None:
        self.run = run
        self.size = size
        self.max_items = max_items
        self.on_batch = on_batch
        self.on_idle = on_idle
        self.idle_seconds = idle_seconds
        self.wait = wait
        self._arrival: asyncio.Future[None] | None = None  # a batch waiting for callers; a request resolves it
        self._returning = 1.0  # the share of answered items that came back during recent waits (moving average)
        self._batches = 0
        self._arrived = 0  # items ever queued
        self._idle: asyncio.Task[None] | None = None  # waiting for a quiet spell; a request cancels it
        self._resting: asyncio.Task[None] | None = None  # running on_idle; a request waits for it
        self._queue: collections.deque[tuple[T, asyncio.Future[R]]] = collections.deque()
        self._worker: asyncio.Task[None] | None = None
        self._limiter = anyio.CapacityLimiter(1)
        self._ended = 0.0  # when the last batch ended (time.monotonic)

    async def __call__(self, request: T) -> R:
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._queue.append((request, future))
        self._arrived += self.size(request)
        if self._arrival is not None:
            _resolve(self._arrival)
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        if self._worker is None or self._worker.done():
            # A task keeps the context it was created in (and so, in BentoML, the request that
            # created it, body included) for as long as the task object lives: start from an empty one.
            self._worker = asyncio.get_running_loop().create_task(self._drain(), context=contextvars.Context())
        return await future

    def busy(self) -> bool:
        """Requests are waiting, a batch runs, or one ended less than IDLE_GAP ago (its callers are about to
        send again): what work of lower priority (a shadow) gives way to."""
        return (bool(self._queue) or self._limiter.borrowed_tokens > 0
                or time.monotonic() - self._ended < IDLE_GAP)

    @property
    def limiter(self) -> anyio.CapacityLimiter:
        """The one model call at a time: lower-priority work borrows it too, never running beside a batch."""
        return self._limiter

    async def _wait_idle(self) -> None:
        await asyncio.sleep(self.idle_seconds)
        if self.on_idle is not None and not self._queue:
            # From here a request waits for the idle work instead of cancelling it: a cancelled
            # wait frees the limiter while the work still runs in its thread, and the next batch
            # would run beside it. The task stays referenced while it runs.
            self._resting, self._idle = self._idle, None
            try:
                with contextlib.suppress(Exception):
                    await anyio.to_thread.run_sync(self.on_idle, limiter=self._limiter)
            finally:
                self._resting = None

    async def _drain(self) -> None:
        try:
            await self._run_queue()
        finally:
            if self.on_idle is not None and not self._queue:
                with contextlib.suppress(RuntimeError):  # the loop is closing
                    self._idle = asyncio.get_running_loop().create_task(self._wait_idle())

    def _queued_items(self) -> int:
        return sum(self.size(request) for request, _ in self._queue)

    async def _wait_for(self, items: int, seconds: float) -> None:
        """Until the queue holds ``items`` items, or ``seconds`` have passed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while self._queued_items() < items and (left := deadline - loop.time()) > 0:
            self._arrival = arrival = loop.create_future()
            timer = loop.call_later(left, _resolve, arrival)
            try:
                await arrival
            finally:
                timer.cancel()
                self._arrival = None

    async def _run_queue(self) -> None:
        loop = asyncio.get_running_loop()
        answered = 0  # items answered by the last batch: who may send next
        ran, rate = 0.0, 0.0  # the last batch's run time, and items arriving a second meanwhile
        while self._queue or answered:
            if answered and self.wait > 0 and (self._returning >= 0.5 or self._batches % PROBE_EVERY == 0):
                waited, arrived = loop.time(), self._arrived
                await self._wait_for(min(answered + self._queued_items(), self.max_items),
                                     min(self.wait, WAIT_SHARE * ran))
                came = (self._arrived - arrived - rate * (loop.time() - waited)) / answered
                self._returning = (self._returning + min(1.0, max(0.0, came))) / 2
            if not self._queue:
                return
            batch = [self._queue.popleft()]
            items = self.size(batch[0][0])
            while self._queue and items + self.size(self._queue[0][0]) <= self.max_items:
                request, future = self._queue.popleft()
                batch.append((request, future))
                items += self.size(request)
            batch = [(request, future) for request, future in batch if not future.done()]  # callers gone
            answered = 0
            if not batch:
                continue
            if self.on_batch is not None:
                with contextlib.suppress(Exception):  # metrics must never stall the queue
                    self.on_batch(len(batch), sum(self.size(request) for request, _ in batch))
            started, arrived = loop.time(), self._arrived
            try:
                results = await anyio.to_thread.run_sync(self.run, [r for r, _ in batch], limiter=self._limiter)
                if len(results) != len(batch):
                    raise RuntimeError(f"the batch function returned {len(results)} results for {len(batch)}")
            except Exception as e:
                for _, future in batch:
                    if not future.done():
                        future.set_exception(e)
                continue
            self._ended = time.monotonic()
            for (_, future), result in zip(batch, results, strict=True):
                if not future.done():
                    future.set_result(result)
            ran = loop.time() - started
            rate = (self._arrived - arrived) / ran if ran > 0 else 0.0
            answered = sum(self.size(request) for request, _ in batch)
            self._batches += 1


_batch_metrics: tuple[Any, Any] | None = None


def observe_batch(requests: int, documents: int) -> None:
    """Record a batch in /metrics (created on first use: BentoML sets up multiprocess metrics first)."""
    global _batch_metrics
    if _batch_metrics is None:
        from prometheus_client import Histogram

        buckets = [1, 2, 4, 8, 16, 32, 64, 128, 256]
        _batch_metrics = (
            Histogram("han_batch_requests", "Requests gathered into one model call", buckets=buckets),
            Histogram("han_batch_documents", "Documents in one model call", buckets=buckets),
        )
    _batch_metrics[0].observe(requests)
    _batch_metrics[1].observe(documents)
