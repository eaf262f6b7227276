"""One run of a han-score job: read windows, score them here and on the workers, commit chunks in
input order, merge.

The main process streams the input and cuts it into windows of ``--window`` rows (never straddling
a chunk). Windows go to the worker processes (two in flight per worker) and this process scores
windows too; at the end it takes back windows no worker has started. Scored windows are put back
in input order and every ``--chunk-size`` rows are committed atomically (``scoring.partial``).
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Iterator
from typing import Any

from scoring.formats import Chunk, ScoredWindow
from scoring.progress import make_progress
from scoring.score import ScoringOptions, score_texts
from scoring.workers import Workers


class Scorer:
    """This process's pipeline plus the worker processes (if any): ``--workers`` scoring processes in all."""

    def __init__(self, pool: Workers | None, model_dir: str, saved: Any, options: ScoringOptions) -> None:
        self.pool = pool
        self.model_dir = model_dir
        self.saved = saved
        self.options = options
        self.pipeline: Any = None

    def start(self) -> None:
        """Tell the workers which model to score with, and get this process ready to score."""
        if self.pool:
            self.pool.configure(self.model_dir, self.options)
        from han import Pipeline
        from han.environment import freeze_loaded_objects, tune_process

        tune_process()
        self.pipeline = Pipeline(self.saved)
        freeze_loaded_objects()

    def close(self) -> None:
        if self.pool:
            self.pool.close()


class JobRun:
    """One run of a job: read windows, score them on the workers, commit chunks in input order, merge."""

    def __init__(
        self, args: argparse.Namespace, source: Any, partial: Any, scorer: Scorer, workers: int, started: float
    ) -> None:
        self.args = args
        self.source = source
        self.partial = partial
        self.scorer = scorer
        self.options = scorer.options
        self.workers = workers
        self.started = started
        self.resumed_from = partial.next_row
        self.previous_elapsed = float(partial.manifest.get("elapsed_s", 0.0))
        self.runs = int(partial.manifest.get("runs", 0)) + 1
        partial.manifest["runs"] = self.runs  # recorded with the next commit
        self.read_this_run = 0
        self.emitted = 0
        self.windows_here = 0  # windows scored by this process (the rest by the workers)

    def committed_note(self) -> str:
        counts = self.partial.manifest.get("counts", {})
        return f"{counts.get('read', 0):,} rows are committed in {self.partial.dir} (fix the cause, then --resume)"

    def elapsed(self) -> float:
        return self.previous_elapsed + time.monotonic() - self.started

    def windows(self) -> Iterator[tuple[list[tuple[int, Any, Any]], bool]]:
        """(rows, ends_chunk): windows of at most --window rows that never straddle a chunk boundary."""
        chunk_left, window_size = self.args.chunk_size, self.args.window
        window: list[tuple[int, Any, Any]] = []
        rows = self.source.iter_rows(self.partial.next_row, self.args.num_shards, self.args.shard_index)
        for item in rows:
            window.append(item)
            chunk_left -= 1
            if chunk_left == 0:
                yield window, True
                window, chunk_left = [], self.args.chunk_size
            elif len(window) == window_size:
                yield window, False
                window = []
        if window:
            yield window, True

    def run(self) -> dict[str, Any]:
        scorer = self.scorer
        scorer.start()
        progress = make_progress(self.args.quiet)
        task = progress.add_task("scoring", total=None, completed=self.partial.manifest["counts"]["read"])
        self._count_rows_in_background(progress, task)
        windows = self.windows()
        meta: dict[int, tuple[list[int], list[Any], bool]] = {}  # seq -> (rows, ids, ends_chunk)
        done: dict[int, ScoredWindow] = {}  # scored windows waiting for an earlier one
        chunk = Chunk(self.partial.fmt.spec)
        next_seq = emit_seq = 0
        first: list[tuple[float, int]] = []  # (time, rows emitted) when the first window came back
        pool = scorer.pool
        max_ahead = 8  # scored windows held back (waiting for a slower worker's earlier one), at most

        def next_window() -> tuple[int, list[Any]] | None:
            nonlocal next_seq
            window = next(windows, None)
            if window is None:
                return None
            rows, ends_chunk = window
            seq, next_seq = next_seq, next_seq + 1
            meta[seq] = ([r for r, _, _ in rows], [i for _, i, _ in rows], ends_chunk)
            self.read_this_run += len(rows)
            return seq, [t for _, _, t in rows]

        def emit() -> None:
            """Write out, in input order, every window that is scored and has no gap before it."""
            nonlocal emit_seq, chunk
            while emit_seq in done:
                scored = done.pop(emit_seq)
                rows, ids, ends_chunk = meta.pop(emit_seq)
                chunk.add(rows, ids, scored)
                progress.advance(task, len(rows))
                if ends_chunk:
                    self.partial.commit(chunk, rows[-1] + 1, self.elapsed())
                    chunk = Chunk(self.partial.fmt.spec)
                emit_seq += 1
                self.emitted += len(rows)
                if not first:
                    first.append((time.monotonic(), self.emitted))

        try:
            with progress:
                exhausted = False
                while True:
                    # Keep each worker busy: one window in work, one queued. Windows already back are
                    # collected first: counted as in flight, they would keep a worker's next window
                    # from being sent, and it would sit idle until this process had scored its own.
                    if pool:
                        for seq, scored in pool.finished():
                            done[seq] = scored
                        emit()
                    while pool and not exhausted and pool.in_flight < 2 * pool.size:
                        item = next_window()
                        if item is None:
                            exhausted = True
                        else:
                            pool.submit(*item)
                    # This process scores too: a new window, or at the end one still queued for a worker.
                    item = None
                    if not exhausted and len(done) < max_ahead:
                        item = next_window()
                        exhausted = item is None
                    if item is None and pool and exhausted:
                        item = pool.take_back()
                    if item is not None:
                        seq, texts = item
                        done[seq] = score_texts(scorer.pipeline, texts, self.options)
                        self.windows_here += 1
                        emit()
                    elif pool and pool.in_flight:
                        for seq, scored in pool.finished(timeout=None):
                            done[seq] = scored
                        emit()
                    elif exhausted:
                        break
                if chunk.size:  # the input ended inside a chunk
                    self.partial.commit(chunk, chunk.last_row + 1, self.elapsed())
                self.partial.record_elapsed(self.elapsed(), self.runs)
                self.partial.finish()
        finally:
            # Close the reader now (Ctrl-C or an error can leave it mid-file): left to interpreter
            # shutdown, a datasets generator's cleanup finds its modules gone and prints a traceback.
            windows.close()
            scorer.close()
        end = time.monotonic()
        wall = end - self.started
        steady = None  # rate after the first window is back: without start-up (imports, model load)
        if first and end > first[0][0] and self.emitted > first[0][1]:
            steady = round((self.emitted - first[0][1]) / (end - first[0][0]), 1)
        counts = self.partial.manifest["counts"]
        return {
            "input": str(self.source.path),
            "output": str(self.partial.output),
            "errors_file": str(self.partial.errors_path),
            "shard": [self.args.shard_index, self.args.num_shards],
            "rows_read": counts["read"],
            "scored": counts["scored"],
            "failed": counts["failed"],
            "labels": counts["labels"],
            "resumed_from_row": self.resumed_from or None,
            "rows_this_run": self.read_this_run,
            "wall_s": round(wall, 3),
            "docs_per_s": round(self.read_this_run / wall, 1) if wall > 0 else None,
            "steady_docs_per_s": steady,
            "total_elapsed_s": round(self.previous_elapsed + wall, 3),
            "runs": self.runs,
            "workers": self.workers,
            "windows": next_seq,
            "windows_scored_here": self.windows_here,
        }

    def _count_rows_in_background(self, progress: Any, task: Any) -> None:
        n, i = self.args.num_shards, self.args.shard_index

        def count() -> None:
            total = self.source.count_rows()
            if total is not None:
                progress.update(task, total=max(0, (total - i + n - 1) // n))

        if self.source.fmt == "parquet":
            count()
        else:
            threading.Thread(target=count, name="han-score-count", daemon=True).start()
