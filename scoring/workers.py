"""Scoring processes for han-score: a ``concurrent.futures.ProcessPoolExecutor`` whose workers import
the model library as they start, load the model on their first window, and score windows with
``scoring.score.score_texts``.

Workers are spawned (a clean interpreter: no inherited threads or torch state), ignore Ctrl-C (the
parent's to handle) and are killed by the kernel if the parent dies, ``kill -9`` included.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Collection, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from scoring.formats import ScoredWindow
from scoring.score import ScoringOptions

_loaded: dict[str, Any] = {}  # the worker's pipeline, loaded on its first window


DIED = "a scoring worker died (killed, or out of memory?)"
_held = 0  # > 0 while this process's main thread holds futures' locks (wait_first)
_caught = False  # a Ctrl-C or SIGTERM arrived meanwhile: raised once they are released


def interrupt(signum: int, frame: Any) -> None:
    """SIGINT's and SIGTERM's handler in han-score and han-label: KeyboardInterrupt, held back while
    ``wait_first`` holds the futures' locks."""
    global _caught
    if _held:
        _caught = True
        return
    raise KeyboardInterrupt


@contextlib.contextmanager
def ctrl_c_held() -> Iterator[None]:
    """Ctrl-C and SIGTERM (with ``interrupt`` as their handler) wait until the block is done, then raise."""
    global _held, _caught
    _held += 1
    try:
        yield
    finally:
        _held -= 1
        if not _held and _caught:
            _caught = False
            raise KeyboardInterrupt


def wait_first(futures: Collection[Future[Any]], timeout: float | None) -> set[Future[Any]]:
    """``concurrent.futures.wait(FIRST_COMPLETED)`` that a Ctrl-C cannot break in the middle of. wait()
    takes each future's lock in turn; a KeyboardInterrupt raised between two of them leaves one held, the
    executor's thread then blocks on it for good, and the job hangs at exit (Python joins that thread).
    The signal waits (0.25 s at most) until the locks are released."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        step = 0.25 if deadline is None else max(0.0, min(0.25, deadline - time.monotonic()))
        with ctrl_c_held():
            done, _ = wait(futures, timeout=step, return_when=FIRST_COMPLETED)
        if done or (deadline is not None and time.monotonic() >= deadline):
            return done


class WorkerError(Exception):
    """A worker died or failed; the message says which in one line."""


def start_worker() -> None:
    """Each worker's first act: the heavy imports (seconds, overlapping the parent's own start-up)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    _die_with_parent()
    import han  # noqa: F401


def _started() -> int:
    return os.getpid()


def _score(model_dir: str, options: ScoringOptions, texts: list[Any]) -> ScoredWindow:
    from han import Pipeline
    from han.environment import freeze_loaded_objects, tune_process
    from scoring.score import score_texts

    if model_dir not in _loaded:
        tune_process()
        _loaded[model_dir] = Pipeline.from_directory(model_dir)
        freeze_loaded_objects()
    return score_texts(_loaded[model_dir], texts, options)


def _die_with_parent() -> None:
    """On Linux, ask the kernel to SIGKILL this process when its parent dies (``kill -9`` included)."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(Exception):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


class Workers:
    """``n`` scoring processes; windows go in tagged with their sequence number and come back tagged."""

    def __init__(self, n: int) -> None:
        import multiprocessing as mp

        from scoring.environment import quiet_resource_tracker

        quiet_resource_tracker()  # before the pool starts its resource tracker, which inherits the environment
        self.size = n
        self.executor = ProcessPoolExecutor(n, mp_context=mp.get_context("spawn"), initializer=start_worker)
        self.pending: dict[Future[ScoredWindow], tuple[int, list[Any]]] = {}  # future -> (seq, texts)
        self.job: tuple[str, ScoringOptions] | None = None
        self.closed = False
        # Start them all now: their imports overlap this process's checks.
        start_ignoring_ctrl_c(self.executor, n, _started)

    def configure(self, model_dir: str, options: ScoringOptions) -> None:
        """The model and settings the windows are scored with (each worker loads the model once)."""
        self.job = (model_dir, options)

    @property
    def in_flight(self) -> int:
        return len(self.pending)

    def submit(self, seq: int, texts: list[Any]) -> None:
        assert self.job is not None, "configure() first"
        try:
            self.pending[self.executor.submit(_score, *self.job, texts)] = (seq, texts)
        except BrokenProcessPool:
            raise WorkerError(DIED) from None

    def take_back(self) -> tuple[int, list[Any]] | None:
        """A window no worker has started yet (to score it in this process), if any."""
        for future, task in reversed(self.pending.items()):
            if future.cancel():
                del self.pending[future]
                return task
        return None

    def finished(self, timeout: float | None = 0) -> list[tuple[int, ScoredWindow]]:
        """Windows already scored (waiting up to ``timeout`` seconds for one; None: until one is)."""
        if not self.pending:
            return []
        done = wait_first(list(self.pending), timeout)
        out = []
        for future in done:
            seq, _ = self.pending.pop(future)
            try:
                out.append((seq, future.result()))
            except BrokenProcessPool:
                raise WorkerError(DIED) from None
            except Exception as e:
                raise WorkerError(f"scoring failed: {type(e).__name__}: {e}") from None
        return out

    def close(self) -> None:
        """Stop the workers: at once if anything is left (an error, Ctrl-C), else after their last window."""
        if self.closed:
            return
        self.closed = True
        if self.pending:
            self.pending.clear()
            stop_at_once(self.executor)
        else:
            self.executor.shutdown(wait=True, cancel_futures=True)


def start_ignoring_ctrl_c(executor: ProcessPoolExecutor, n: int, task: Callable[[], object]) -> None:
    """Start ``n`` workers of ``executor`` (one ``task`` each) born ignoring Ctrl-C. The terminal sends it
    to the whole process group, and a worker still importing would print a KeyboardInterrupt traceback.
    An ignored signal stays ignored across exec; SIGINT is also blocked meanwhile, so that a Ctrl-C in
    these milliseconds stays pending here (Linux never discards a blocked signal) and reaches this
    process once its handler is back, instead of being lost. Then the workers are stopped at once."""
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        for _ in range(n):
            executor.submit(task)
    finally:
        signal.signal(signal.SIGINT, previous)
        try:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)  # a pending Ctrl-C is handled in this call
        except KeyboardInterrupt:
            stop_at_once(executor)
            raise


def stop_at_once(executor: ProcessPoolExecutor) -> None:
    """Stop ``executor``'s workers mid-window (an error, Ctrl-C) and wait for its manager thread.

    Kill first, then shut down: Python 3.11 offers no public way to stop a worker mid-window (hence the
    private ``_processes``), and an executor shut down while a worker is still dying can write its stop
    message into a pipe nobody reads (a BrokenPipeError on stderr). Then join the manager thread:
    left running, it closes its wake-up pipe while the interpreter's exit hook may be writing to it,
    which prints an ``OSError: [Errno 9]`` traceback after the one-line error (Python 3.11's
    ``_ThreadWakeup.wakeup`` takes no lock; CPython gh-125451 added one in later releases)."""
    for process in list((getattr(executor, "_processes", None) or {}).values()):
        with contextlib.suppress(Exception):
            process.kill()
    manager = getattr(executor, "_executor_manager_thread", None)
    executor.shutdown(wait=False, cancel_futures=True)
    if manager is not None:
        manager.join(timeout=30)  # the workers are dead: it ends at once; never hang an exit on it
