"""Signs of life for the slow steps after training (evaluation, calibration, the faithfulness check).

Each step logs a line when it starts and one when it ends, with its count and seconds, so a log file
shows what ran and for how long. On a terminal a bar also advances: a task in Lightning's Rich
progress display while that is live (it holds the terminal until the trainer's teardown, and would
swallow any other bar), else a tqdm bar on stderr (tqdm's ``disable=None`` leaves it out of logs,
which would get one line per refresh).
"""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import Any

from pytorch_lightning.utilities import rank_zero_info
from tqdm.auto import tqdm

_progress_bar: Any = None  # the running trainer's progress bar callback (training.export.ExportModel.setup)


def show_in(progress_bar: Any) -> None:
    """Draw the steps' bars in this Lightning progress bar callback where it is a live RichProgressBar."""
    global _progress_bar
    _progress_bar = progress_bar


def _live_rich() -> Any:
    """The Rich Progress of a live RichProgressBar, else None."""
    progress = getattr(_progress_bar, "progress", None)
    live = getattr(progress, "live", None)
    return progress if getattr(_progress_bar, "is_enabled", False) and getattr(live, "is_started", False) else None


class Step:
    """``with Step("evaluating test", 7532) as step:`` ... ``step.update(n)`` or ``step.stage`` as a
    Pipeline's progress; logs "evaluating test: 7,532 documents ..." then "... in 14.2 s". ``detail``
    ends both lines, and ``count`` (the total unless set) is the end line's count."""

    def __init__(self, what: str, total: int, unit: str = "documents", detail: str = "") -> None:
        self.what, self.total, self.unit, self.detail = what, total, unit, detail
        self.count = total
        self._stage: str | None = None
        self._rich: Any = None
        self._task: Any = None
        self._bar: tqdm | None = None
        self._start = 0.0

    def __enter__(self) -> Step:
        rank_zero_info(f"{self.what}: {self.total:,} {self.unit}{self.detail} ...")
        self._start = time.monotonic()
        self._rich = _live_rich()
        if self._rich is not None:
            self._task = self._rich.add_task(self.what, total=self.total)
        else:
            self._bar = tqdm(total=self.total, desc=self.what, unit=self.unit.rstrip("s"), file=sys.stderr,
                             disable=None, leave=False, dynamic_ncols=True)
        return self

    def update(self, n: int) -> None:
        if self._rich is not None:
            self._rich.update(self._task, advance=n)
        elif self._bar is not None:
            self._bar.update(n)

    def stage(self, name: str, n: int) -> None:
        """han.pipeline.Progress: the bar fills once per stage (segmenting, then classifying)."""
        if name != self._stage:
            self._stage = name
            if self._rich is not None:
                self._rich.reset(self._task, total=self.total, description=f"{self.what} ({name})")
            elif self._bar is not None:
                self._bar.reset(self.total)
                self._bar.set_description(f"{self.what} ({name})")
        self.update(n)

    @property
    def seconds(self) -> float:
        return time.monotonic() - self._start

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        if self._rich is not None:
            self._rich.remove_task(self._task)
        elif self._bar is not None:
            self._bar.close()
        if kind is None:
            rank_zero_info(f"{self.what}: {self.count:,} {self.unit} in {self.seconds:.1f} s{self.detail}")
