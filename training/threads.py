"""Torch threads that follow the cores other processes leave free, while training.

Torch's threads meet at every small GRU step, so one that loses its core to another process stalls the
others. Every few seconds the CPU time other processes used (``/proc/stat`` less this process's own)
says how many cores are free, and training takes that many threads, at least one. Linux only; elsewhere,
and when ``OMP_NUM_THREADS`` is set (the one variable training/ reads itself), the count is left as it is.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities import rank_zero_info

CHECK_SECONDS = 3.0
TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _busy_ticks() -> tuple[int, int] | None:
    """(CPU ticks every process has used, ticks this process has used), or None off Linux."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        own = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    values = [int(x) for x in fields]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    return sum(values[:8]) - idle, int(own[11]) + int(own[12])  # utime + stime


def free_cores(others: float, cores: int) -> int:
    """Threads to use when other processes keep ``others`` cores busy (at least one)."""
    return max(1, min(cores, math.floor(cores - others + 0.5)))


class FreeCoreThreads(pl.Callback):
    """Sets torch's intra-op threads to the cores left free by other processes, checked every few seconds."""

    def __init__(self, cores: int, every: float = CHECK_SECONDS) -> None:
        self.cores, self.every = cores, every
        self._last: tuple[float, int, int] | None = None

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        now = time.monotonic()
        if self._last is not None and now - self._last[0] < self.every:
            return
        ticks = _busy_ticks()
        if ticks is None:
            return
        if self._last is not None:
            seconds = now - self._last[0]
            others = ((ticks[0] - self._last[1]) - (ticks[1] - self._last[2])) / TICKS / seconds
            threads = free_cores(others, self.cores)
            if threads != torch.get_num_threads():
                rank_zero_info(f"other processes use {others:.1f} of {self.cores} cores: {threads} torch "
                               f"thread{'s' if threads > 1 else ''}")
                torch.set_num_threads(threads)
        self._last = (now, *ticks)


def thread_callbacks() -> list[pl.Callback]:
    """The callback for a fit whose threads nobody pinned (``OMP_NUM_THREADS`` unset) on several cores."""
    from han.environment import pinned_threads, usable_cores

    cores = usable_cores()
    if pinned_threads() or cores < 2 or _busy_ticks() is None:
        return []
    return [FreeCoreThreads(cores)]
