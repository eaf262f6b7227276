"""The process settings every entry point applies, and the one module of han that reads the environment.

Offline and no telemetry: nothing downloads models or data at run time, and BentoML must not phone home
(``apply_defaults``; a value the user set wins). The glibc malloc tuning lives here, not in scoring or the
service, because both need it and neither may import the other.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import sys
from collections.abc import Iterator
from typing import Any

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8  # glibc's mallopt parameters
# Free memory above this at a heap's top goes back to the kernel (tune_process). At 32 MB a window of
# thousands of documents (han-score's) gave its batches' arrays back and faulted them in again: 40 page
# faults a review, 8% of the CPU in the kernel. An idle serving worker gives it back anyway
# (release_free_memory), and a process's peak is the same either way.
TRIM_THRESHOLD = 128 << 20
# The garbage collector's thresholds in a process that runs the model (tune_process). Each collection walks
# the objects alive, and a window's explanations are hundreds of thousands of them: at Python's (700, 10,
# 10) collections took a quarter of han-score --explain's time. The pipeline's objects form no cycles, so
# reference counting frees them; collections are for the rare cycle, and an idle serving worker collects.
GC_THRESHOLDS = (10_000, 100, 100)

DEFAULTS = {
    "BENTOML_DO_NOT_TRACK": "true",
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
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


def pinned_threads() -> int | None:
    """The threads the user pinned a process to with ``OMP_NUM_THREADS``, if any: None where it is no count
    of threads (``abc``, ``1.5``, ``-2``), which OpenMP ignores as well (``ignored_threads``). Of a list
    (``4,2``, threads per nesting level) the first."""
    value = (os.environ.get("OMP_NUM_THREADS") or "").split(",")[0].strip()
    return int(value) if value.isascii() and value.isdigit() and int(value) > 0 else None


def ignored_threads() -> str | None:
    """A warning for an ``OMP_NUM_THREADS`` that is set but no count of threads; None where it is fine. Every
    command carries on as if unset, as torch's OpenMP does (with a warning naming no value)."""
    value = os.environ.get("OMP_NUM_THREADS")
    if value is None or not value.strip() or pinned_threads() is not None:
        return None
    return f"OMP_NUM_THREADS={value!r} is not a number of threads (a whole number above 0): ignored"


def requested_threads() -> int:
    """The threads a process may compute with: ``OMP_NUM_THREADS`` where set, else its usable cores."""
    return pinned_threads() or usable_cores()


def tune_process(threads: int = 1) -> None:
    """Settings for a process that runs the model (a scoring process, a serving worker): ``threads`` threads
    for numpy's BLAS and for torch (processes, not threads, use the cores), and a batch's arrays of several MB
    kept on the heap rather than mmap'ed and page-faulted afresh every batch (glibc malloc), in one malloc
    arena for every thread: an arena of its own for each thread that handles a burst (the inference
    thread, the gradient helper's pipes) kept that burst's pages, 15 to 25 MB a serving worker at rest, and
    under the GIL the threads hardly allocate at once. Torch is not imported for it: where it is not yet,
    ``OMP_NUM_THREADS`` sets the threads it starts with if it comes. The garbage collector runs less often
    (``GC_THRESHOLDS``)."""
    from threadpoolctl import threadpool_limits

    gc.set_threshold(*GC_THRESHOLDS)

    threadpool_limits(threads, user_api="blas")
    torch = sys.modules.get("torch")
    if torch is None:
        os.environ["OMP_NUM_THREADS"] = str(threads)
    else:
        torch.set_num_threads(threads)
        with contextlib.suppress(RuntimeError):
            torch.set_num_interop_threads(1)
    libc = _glibc()
    if libc is not None:
        libc.mallopt(M_MMAP_THRESHOLD, 32 << 20)  # 32 MB is glibc's largest allowed value
        libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
        libc.mallopt(M_ARENA_MAX, 1)


def freeze_loaded_objects() -> None:
    """Exempt everything loaded so far (libraries, the model) from garbage collection, so that the collections
    an explanation's short-lived objects set off walk only what came later. Call it once, after the model loads."""
    gc.collect()
    gc.freeze()


def release_free_memory() -> None:
    """Give the heap's free pages back to the kernel (glibc's ``malloc_trim``; elsewhere nothing), so that an
    idle serving worker does not keep a burst's peak. Python's type attribute cache is emptied first: the
    names C code makes on the spot (numpy's among them), kept there, pin whole memory arenas."""
    clear_type_cache = getattr(sys, "_clear_internal_caches", None) or getattr(sys, "_clear_type_cache", None)
    if clear_type_cache is not None:  # lookups refill it at their next use
        clear_type_cache()
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
        # A thread arena's top (the inference thread's freed tensors) goes back only at a large free()
        # over the trim threshold, not with malloc_trim: lower the threshold for one such free.
        libc.mallopt(M_TRIM_THRESHOLD, 128 << 10)
        libc.free(libc.malloc(256 << 10))  # 256 kB: over the 64 kB at which free() trims
        libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)


@contextlib.contextmanager
def torch_left_out() -> Iterator[None]:
    """Imports inside see no torch, unless it is imported already. For spaCy: thinc, under it, imports
    torch when it can (for models a blank tokenizer never runs), about 180 MB in a process that never
    computes a gradient (a serving worker, han-score's). Torch can be imported after, as usual."""
    if "torch" in sys.modules:
        yield
        return
    sys.modules["torch"] = None  # type: ignore[assignment]  # `import torch` raises ImportError
    try:
        yield
    finally:
        if "torch" in sys.modules and sys.modules["torch"] is None:
            del sys.modules["torch"]


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


def process_alive(pid: int) -> bool:
    """Whether a process of this host still runs (its staging folders are then its own, not leftovers)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
