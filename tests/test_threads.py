"""Torch threads follow the cores other processes leave free while training (training.threads)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from training.threads import FreeCoreThreads, free_cores


def test_the_thread_count_is_the_free_cores_and_at_least_one() -> None:
    assert free_cores(0.0, 2) == 2
    assert free_cores(0.3, 2) == 2
    assert free_cores(1.0, 2) == 1
    assert free_cores(1.9, 2) == 1
    assert free_cores(5.0, 4) == 1
    assert free_cores(1.2, 8) == 7


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_busy_neighbour_takes_a_thread_away() -> None:
    threads = torch.get_num_threads()
    callback = FreeCoreThreads(cores=2, every=0.0)
    # Beside it, one told of two cores more than /proc/stat counts: the others' use, in cores a second, is
    # over half a core (the two neighbours) and at most every core, so it keeps 2 to cpus + 1 threads.
    cpus = sum(line[:3] == "cpu" and line[3:4].isdigit() for line in Path("/proc/stat").read_text().splitlines())
    wide = FreeCoreThreads(cores=cpus + 2, every=0.0)
    busy = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(2)]
    try:
        torch.set_num_threads(2)
        callback.on_train_batch_end(None, None, None, None, 0)  # type: ignore[arg-type]
        wide.on_train_batch_end(None, None, None, None, 0)  # type: ignore[arg-type]
        time.sleep(1.5)
        callback.on_train_batch_end(None, None, None, None, 1)  # type: ignore[arg-type]
        assert torch.get_num_threads() == 1  # two busy neighbours on the (at least) two cores it watches
        wide.on_train_batch_end(None, None, None, None, 1)  # type: ignore[arg-type]
        assert 2 <= torch.get_num_threads() <= cpus + 1, (torch.get_num_threads(), cpus)
    finally:
        for process in busy:
            process.kill()
            process.wait()
        torch.set_num_threads(threads)
