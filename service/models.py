"""The served model, and how a running worker follows the production pointer without a restart.

A worker polls ``NAME``'s pointer (model_store.production) twice a second. When it names another
version, that version is loaded beside the serving one, in a thread, and checked on a document;
then new requests go to it, while the requests already taken finish on the model they started on
(each request holds its ``Served``). The old model is freed when the last of them is answered. A
version that cannot be loaded is logged and reported, and the serving version stays.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import anyio
import bentoml

import han
from han.environment import release_free_memory
from model_store import load_checked, model_path, production_version
from model_store.production import forget_replica, pointer_stamp, report_replica
from service.api import ModelInfo, model_info
from service.gradients import GradientProcess

logger = logging.getLogger("han.service")
logger.setLevel(logging.INFO)  # a switch is worth a line in the log (the root logger says warnings only)
POLL_SECONDS = 0.5  # how often a worker looks at the pointer (a stat): a promotion is served within about this
REPORT_SECONDS = 2.0  # how often it says what it serves (han-model promote waits for these reports)


@dataclass(eq=False)
class Served:
    """One loaded version: its tag, its pipeline, what GET /model says of it, and its gradient-based
    explanations' helper process (service.gradients: started on first use)."""

    tag: str
    pipeline: han.Pipeline
    info: ModelInfo
    gradients: GradientProcess


def load_served(tag: str, path: Path | None = None, registered_at: str | None = None) -> Served:
    """Load ``tag`` and check it on a document (model_store.load_checked), so that a model that cannot
    serve fails here, beside the serving one, rather than on a request."""
    if path is None:
        registered_at = bentoml.models.get(tag).info.creation_time.isoformat()
    directory = path or model_path(tag)
    pipeline = load_checked(directory)
    return Served(tag, pipeline, model_info(tag, registered_at or "", pipeline.saved), GradientProcess(directory))


_documents = None


def count_documents(tag: str, documents: int) -> None:
    """``han_documents_total{model=TAG}`` in /metrics (created on first use, after BentoML's set-up)."""
    global _documents
    if _documents is None:
        from prometheus_client import Counter

        _documents = Counter("han_documents", "Documents classified, by the model version that answered", ["model"])
    _documents.labels(model=tag).inc(documents)


class ModelFollower:
    """Keeps ``current`` on the version that ``name``'s production pointer names (with no pointer: the
    first-registered version, ``model_store.production_version``; with no name, a worker pinned to one
    version, it only holds ``current``). Loads run as a task of their own, so the reports go on
    meanwhile; each report names the pointer it answers (its stamp), so that a failure is never read
    for a later promotion of the same version."""

    def __init__(self, name: str | None, current: Served, report_as: str | None = None) -> None:
        self.name = name
        # A pinned worker (no name to follow) still reports, as pinned, under the name whose shadow it
        # runs (``report_as``): han-model shadow and status see it, promote does not wait for it.
        self.report_as = name or report_as
        self.current = current
        self.start_tag = current.tag
        self.failed: dict[str, object] | None = None  # the promoted version that could not be loaded, and why
        self._stamp: tuple[int, int] | bool | None = False  # False: not read yet (a promotion during start-up)
        self._wanted = current.tag
        self._loading: asyncio.Task[None] | None = None
        self._reported = 0.0
        self.shadow_status: Callable[[], dict[str, object] | None] = lambda: None  # reported beside (monitoring.shadow)

    async def run(self) -> None:
        try:
            while True:
                with contextlib.suppress(Exception):  # a bad poll must never end the following
                    self.poll()
                await asyncio.sleep(POLL_SECONDS)
        finally:
            self.forget()

    def forget(self) -> None:
        """At shutdown: this worker's report removed, so that a promotion at once does not wait for it (the
        following task's ``finally`` runs only if the task is cancelled before the loop stops)."""
        if self.report_as is not None:
            with contextlib.suppress(OSError):
                forget_replica(self.report_as)

    def poll(self) -> None:
        if self.name is None:  # pinned: nothing to follow, only the report
            if self.report_as is not None and time.monotonic() - self._reported >= REPORT_SECONDS:
                self._reported = time.monotonic()  # first: a store it may not write (a bento's) is tried seldom
                report_replica(self.report_as, self.current.tag, None, shadow=self.shadow_status(), pinned=True)
            return
        stamp = pointer_stamp(self.name)
        if stamp != self._stamp:
            self._stamp, self.failed, self._reported = stamp, None, 0.0
            self._wanted = production_version(self.name) or self.start_tag  # no pointer: the first version
        loading = self._loading is not None and not self._loading.done()
        if self._wanted != self.current.tag and not loading and self.failed is None:
            self._loading = asyncio.get_running_loop().create_task(self.switch(self._wanted, stamp))
            loading = True
        if time.monotonic() - self._reported >= REPORT_SECONDS:  # a small file, written here: a thread of its
            report_replica(self.name, self.current.tag, self.failed,  # own would hold a malloc arena of its own
                           loading=self._wanted if loading else None, pointer=stamp, shadow=self.shadow_status())
            self._reported = time.monotonic()

    async def switch(self, tag: str, stamp: tuple[int, int] | None) -> None:
        started = time.monotonic()
        try:
            new = await anyio.to_thread.run_sync(load_served, tag)
        except Exception as e:  # whatever it is, the serving version stays
            reason = f"{e.__class__.__name__}: {e}".splitlines()[0]
            if stamp == self._stamp:  # still what the pointer asks for
                self.failed, self._reported = {"tag": tag, "reason": reason, "pointer": stamp}, 0.0
            logger.error("cannot serve %s (promoted to production): %s; still serving %s", tag, reason,
                         self.current.tag)
            return
        if tag != self._wanted:  # the pointer moved on while it loaded: the next poll loads that one
            return
        old, self.current, self._reported = self.current, new, 0.0
        logger.info("now serving %s (was %s; loaded in %.1f s)", tag, old.tag, time.monotonic() - started)
        asyncio.get_running_loop().create_task(release_when_done(weakref.ref(old)))
        del old


async def release_when_done(old: weakref.ref[Served], timeout: float = 300.0) -> None:
    """Once the last request on the old model is answered (reference counting frees it: it holds no
    cycles, so no collection is needed, which would stall the worker), hand the freed heap back."""
    deadline = time.monotonic() + timeout
    while old() is not None and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    release_free_memory()
