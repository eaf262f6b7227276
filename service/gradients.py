"""The gradient-based explanations in a process of their own, beside a serving worker.

Classifying and explaining with attention run ``han.numpy_forward`` and need no torch; the gradient-based
methods (attention_gradient, integrated_gradients, occlusion) run the torch network. ``import torch``
alone would double a worker's memory for good (issue 62), so a worker hands those requests to a helper
process: started on the first such request, it runs the same ``han.Pipeline`` on the same model
directory, and stops once unused for a minute (``HAN_GRADIENT_HELPER_IDLE_S``); the worker stays
torch-free. The price is the helper's start (a few seconds) on the first such request after a quiet spell.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
import weakref
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

_pipeline: Any = None  # in the helper: the one pipeline it runs
_stopping: list[threading.Thread] = []  # in the worker: the manager threads of helpers told to stop


def _load(model_dir: str) -> None:
    """The helper's start: the process settings of a worker, then the model."""
    global _pipeline
    from han.environment import apply_defaults, tune_process
    from han.pipeline import Pipeline

    apply_defaults()
    tune_process()
    _pipeline = Pipeline.from_directory(model_dir)


def _classify(texts: list[str], method: str, errors: str) -> tuple[list[Any], list[tuple[int, int]]]:
    profiles: list[tuple[int, int]] = []
    return _pipeline(texts, explain=method, errors=errors, profiles=profiles), profiles


class GradientProcess:
    """``Pipeline.__call__`` with a gradient-based method, run in a helper process for one model directory."""

    def __init__(self, model_dir: Path) -> None:
        self.model_dir = model_dir
        self._pool: ProcessPoolExecutor | None = None
        self._used = 0.0
        self._busy = 0

    def __call__(self, texts: list[str], method: str, errors: str,
                 profiles: list[tuple[int, int]]) -> list[Any]:
        """The pipeline's results (``profiles`` filled as the pipeline would); a helper that died is started
        again, once."""
        self._busy += 1
        try:
            for attempt in (1, 2):
                try:
                    results, profiles[:] = self._started().submit(_classify, texts, method, errors).result()
                    return results
                except BrokenProcessPool:
                    self.stop()
                    if attempt == 2:
                        raise
            raise AssertionError("unreachable")
        finally:
            self._busy -= 1
            self._used = time.monotonic()

    @property
    def running(self) -> bool:
        return self._pool is not None

    def stop_if_idle(self, idle: float) -> None:
        if self._pool is not None and not self._busy and time.monotonic() - self._used >= idle:
            self.stop()

    def stop(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            _stop(pool)

    def _started(self) -> ProcessPoolExecutor:
        if self._pool is None:
            # spawned, not forked: a worker has threads (BentoML's event loop, the inference thread)
            self._pool = ProcessPoolExecutor(1, multiprocessing.get_context("spawn"), initializer=_load,
                                             initargs=(str(self.model_dir),))
            weakref.finalize(self, _stop, self._pool)
        return self._pool


def _stop(pool: ProcessPoolExecutor) -> None:
    """Tell a helper to stop without waiting for it (the event loop's thread), keeping its manager thread
    for ``wait_for_stopped_helpers``."""
    manager = getattr(pool, "_executor_manager_thread", None)  # private: no public handle in 3.11
    pool.shutdown(wait=False, cancel_futures=True)
    _stopping[:] = [t for t in _stopping if t.is_alive()]
    if manager is not None:
        _stopping.append(manager)


def wait_for_stopped_helpers(timeout: float = 10.0) -> None:
    """Before the worker exits: wait for the helpers told to stop. Python 3.11's exit hook writes to a
    stopping pool's wake-up pipe without a lock while the pool's manager thread may be closing it, which
    prints an ``OSError: [Errno 9]`` traceback into the log (CPython gh-125451 added the lock in later releases)."""
    deadline = time.monotonic() + timeout
    while _stopping:
        _stopping.pop().join(max(0.0, deadline - time.monotonic()))
