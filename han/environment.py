"""The one place for the process environment every entry point wants: offline, no telemetry.

Nothing here downloads models or data at run time, and BentoML must not phone home; the
entry points (han-train, han-score, the service, ``make run``) call ``apply_defaults`` first.
A value the user already set wins.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import sys
from typing import Any

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
TRIM_THRESHOLD = 32 << 20  # free memory above this at a heap's top goes back to the kernel (tune_process)

DEFAULTS = {
    "BENTOML_DO_NOT_TRACK": "true",
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    # Ray (han-score --engine ray): no usage stats sent, no dashboard metrics exporter.
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_ENABLE_RECORD_ACTOR_TASK_LOGGING": "0",
}


def apply_defaults(env: dict[str, str] | None = None) -> dict[str, str]:
    """Set each default in ``env`` (``os.environ`` if None) unless already set; returns ``env``."""
    target = os.environ if env is None else env
    for key, value in DEFAULTS.items():
        target.setdefault(key, value)
    return target  # type: ignore[return-value]


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, e.g. under ``taskset`` or a container)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def requested_threads() -> int:
    """The threads a process may compute with: ``OMP_NUM_THREADS`` where set, else its usable cores."""
    return int(os.environ.get("OMP_NUM_THREADS") or 0) or usable_cores()


def tune_process(threads: int = 1) -> None:
    """Settings for a process that runs the model (han-score's scoring processes, a serving worker):
    one torch thread by default (a second one measured no faster and slower beside any other busy
    process: BENCHMARKS.md), and glibc malloc kept from thrashing.

    Each batch allocates and frees tensors of several MB. By default glibc serves those with
    mmap/munmap (and trims the heap after big frees), so every batch page-faults fresh zeroed
    memory: measured, a third of the model's time went to the kernel (1000 IMDB reviews:
    user 1.35 s + sys 0.66 s; with these settings user 1.26 s + sys 0.05 s). Allocations up to
    32 MB stay on the heap; free memory above 32 MB at its top is still given back (a threshold
    of 256 MB cost han-score's main process 60 MB of RSS at 25,000 rows for no measurable speed).
    """
    import torch

    torch.set_num_threads(threads)
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(1)
    libc = _glibc()
    if libc is not None:
        libc.mallopt(M_MMAP_THRESHOLD, 32 << 20)  # 32 MB is glibc's largest allowed value
        libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)


def freeze_loaded_objects() -> None:
    """Exempt everything loaded so far (libraries, the model, the vocabulary) from garbage collection.

    A serving worker holds about 260,000 tracked objects after start-up, and a full collection walks
    them all (about 120 ms); each document's explanation allocates a few hundred short-lived objects,
    which set collections off. After ``gc.freeze()`` collections walk only what came later: measured
    in process, 0.13 ms of a document's 2.4 ms went to the collector before, 0.03 ms after.
    Call it once, after the model is loaded.
    """
    gc.collect()
    gc.freeze()


def release_free_memory() -> None:
    """Give the heap's free pages back to the kernel (glibc's ``malloc_trim``; elsewhere nothing),
    after emptying Python's type attribute cache.

    ``tune_process`` keeps freed memory on the heap for the next batch; a serving worker calls this
    once it has been idle a while, so that a burst of load does not leave it holding the burst's
    peak (measured in process: 16 to 29 MB given back after bursts of batches; about 1 ms a call).
    The type cache keeps a reference to the name of every attribute looked up on a type, and
    C code (numpy's ``cumsum``, among others) looks names up by strings it makes on the spot: a
    few hundred such strings, made among a large request's millions of short-lived objects, each
    kept one of Python's 1 MB memory arenas from being given back (measured: 256 documents of 40 kB
    with full explanations left 8-15 MB behind; 455 strings, 27 kB, held it all).
    """
    clear_type_cache = getattr(sys, "_clear_internal_caches", None) or getattr(sys, "_clear_type_cache", None)
    if clear_type_cache is not None:  # lookups refill it at their next use
        clear_type_cache()
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
        # malloc_trim empties the free chunks of every arena, but the top of a thread's arena (where
        # the inference thread's freed tensors merge) goes back only when a large free() finds it
        # over the trim threshold, which tune_process raised to 32 MB: lower it for one such free.
        # (docs/experiments.md, 2026-11-26; tests/test_service_units.py shows malloc_trim alone giving none of it back.)
        libc.mallopt(M_TRIM_THRESHOLD, 128 << 10)
        libc.free(libc.malloc(256 << 10))  # 256 kB: over the 64 kB at which free() trims
        libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)


@functools.cache
def _glibc() -> Any:
    """glibc through ctypes on Linux; None elsewhere (or where it cannot be loaded, e.g. musl)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.malloc.restype = ctypes.c_void_p
        libc.malloc.argtypes = [ctypes.c_size_t]
        libc.free.argtypes = [ctypes.c_void_p]
        return libc
    except OSError:
        return None
