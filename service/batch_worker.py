"""The scoring side of ``han-score``: texts in, one compact result per text out, through ``han.Predictor``.

``score_window`` is the whole inference path of the batch scorer: it checks each text with
``han.predict.document_problem``, segments the good ones with ``predictor.segmenter.segment_many``,
drops those whose ``Segment.is_empty``, and classifies the rest with ``predictor.predict_segments``
(which sorts the window by length into batches and restores the order). The service calls
``Predictor.predict``, which is the same two steps, so a text gets the same label and scores either way.

``worker_main`` runs ``score_window`` in a spawned process of its own (``han-score`` scores in
its main process too). Each process segments *and* classifies whole windows, so with two
processes on two cores one's spaCy pass overlaps the other's model forward; measured against
one tokenising process feeding one model process in BENCHMARKS.md. This module imports only
the standard library at the top (``han``, torch and spaCy inside the functions), so ``han-score``
can spawn its workers first thing and let their imports overlap its own.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from han import Pipeline

# One result per input text, in input order:
#   (OK, label, labels, scores, truncated, top_sentences, top_words)  scores in the model's label order
#   (FAILED, reason)
OK = "ok"
FAILED = "failed"

# Messages from a worker to the parent.
READY = "ready"  # (READY, -1, pid): the model is loaded
DONE = "done"  # (DONE, seq, results)
FATAL = "fatal"  # (FATAL, seq, message): the worker stops


@dataclass(frozen=True)
class ScoringOptions:
    explain: bool = False
    top_sentences: int = 3
    top_words: int = 5
    batch_size: int = 64  # documents per model batch (Predictor.batch_size)
    max_batch_tokens: int = 16_384  # Predictor.max_batch_tokens
    threads: int = 1  # torch intra-op threads in each worker


def score_window(pipeline: Pipeline, texts: list[Any], options: ScoringOptions) -> list[tuple]:
    """Score a window of raw input values; a bad value gives (FAILED, reason) and never raises."""
    from han import DocumentError, TopK
    from han.results import span_records

    explain = TopK(options.top_sentences, options.top_words) if options.explain else None
    results = []
    for r in pipeline(texts, explain=explain, errors="return"):
        if isinstance(r, DocumentError):
            results.append((FAILED, r.reason))
        else:
            top_sentences = span_records(r.top_sentences) if r.top_sentences is not None else None
            top_words = span_records(r.top_words) if r.top_words is not None else None
            scores = [r.scores[label] for label in pipeline.labels]
            results.append((OK, r.label, r.labels, scores, r.truncated, top_sentences, top_words))
    return results


def tune_process(threads: int) -> None:
    """Settings for a process that runs the model: torch threads, and glibc malloc kept from thrashing.

    Each batch allocates and frees tensors of several MB. By default glibc serves those with
    mmap/munmap (and trims the heap after big frees), so every batch page-faults fresh zeroed
    memory: measured, a third of the model's time went to the kernel (1000 IMDB reviews:
    user 1.35 s + sys 0.66 s; with these two settings user 1.26 s + sys 0.05 s). Keeping
    allocations up to 32 MB on the heap and not trimming below 256 MB of free space removes that;
    the cost is that freed memory stays mapped, so RSS stays at its high-water mark (bounded).
    """
    import torch

    torch.set_num_threads(threads)
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(1)
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            import ctypes

            libc = ctypes.CDLL("libc.so.6")
            m_trim_threshold, m_mmap_threshold = -1, -3
            libc.mallopt(m_mmap_threshold, 32 << 20)  # 32 MB is glibc's largest allowed value
            libc.mallopt(m_trim_threshold, 256 << 20)


def make_predictor(model_dir: str, options: ScoringOptions) -> Pipeline:
    from han import Pipeline, SavedModel

    return Pipeline(
        SavedModel.load(model_dir), batch_size=options.batch_size, max_batch_tokens=options.max_batch_tokens
    )


def worker_main(setup: Any, tasks: Any, results: Any, parent_pid: int) -> None:
    """Process entry point: take (model_dir, options) from ``setup``, then score (seq, texts) tasks
    until a None task. Started before the parent has checked the model, so the imports overlap;
    a None setup means there is nothing to do. Exits if the parent dies."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    _die_with_parent()
    import han  # noqa: F401  (torch and spaCy: seconds, spent while the parent does the same)

    config = _get(setup, parent_pid)
    if config is None:
        return
    model_dir, options = config
    tune_process(options.threads)
    try:
        predictor = make_predictor(model_dir, options)
    except Exception as e:  # the parent loaded this model already; report anything odd in one line
        results.put((FATAL, -1, f"a scoring worker could not load the model: {e}"))
        return
    results.put((READY, -1, os.getpid()))
    while (task := _get(tasks, parent_pid)) is not None:
        seq, texts = task
        try:
            out = score_window(predictor, texts, options)
        except Exception as e:
            results.put((FATAL, seq, f"scoring failed: {type(e).__name__}: {e}"))
            return
        results.put((DONE, seq, out))


def _get(q: Any, parent_pid: int) -> Any:
    """The next item of ``q``; if the parent dies meanwhile (nobody would read our results), exit."""
    while True:
        try:
            return q.get(timeout=1.0)
        except queue.Empty:
            if os.getppid() != parent_pid:
                os._exit(1)


def _die_with_parent() -> None:
    """On Linux, ask the kernel to SIGKILL this process when its parent dies (``kill -9`` included)."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(Exception):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
