"""``han-score INPUT OUTPUT``: classify every row of a Parquet, CSV or JSON Lines file with a HAN model.

    han-score reviews.parquet scores.parquet --model han-imdb:latest --id-column id
    han-score reviews.csv scores.jsonl --explain --top-sentences 3 --top-words 5
    han-score big.jsonl part-2.parquet --num-shards 4 --shard-index 2      # one of 4 workers
    han-score big.jsonl part-2.parquet --num-shards 4 --shard-index 2 --resume   # after a crash

How it runs: the main process streams the input (``service.batch_input``) and cuts it into
windows of ``--window`` rows. ``--workers`` processes score windows, the main process
included: each segments a whole window with spaCy and classifies it with ``han.Predictor``
(length-sorted batches inside the window), so on two cores one process's tokenisation overlaps
the other's model forward (``service.batch_worker``). Spawned workers only get windows once
their model is loaded, the main process scores while they start, and at the end it takes back
windows still queued for them. Results are put back in input order and every ``--chunk-size``
rows are committed atomically (``service.batch_output``): a run killed at any moment and rerun
with ``--resume`` ends with every row exactly once. Rows that cannot be scored go to
``OUTPUT.errors.jsonl``.

Exit codes: 0 done; 1 the job failed midway (committed chunks are kept; fix and --resume);
2 nothing was scored (bad arguments, unreadable input, missing column, unknown model,
existing output); 130 interrupted.

This module imports only the standard library at the top: scoring workers are spawned and
re-import the ``__main__`` module, which must stay cheap. The heavy imports live in ``run``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_T0 = time.monotonic()


def trace(event: str) -> None:
    """With HAN_SCORE_TRACE=1, log when each phase happens (seconds since start-up) to stderr."""
    if os.environ.get("HAN_SCORE_TRACE"):
        print(f"han-score +{time.monotonic() - _T0:7.2f}s {event}", file=sys.stderr, flush=True)


class BatchError(Exception):
    """Stops the job with a one-line message; ``code`` is the exit status."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


def _positive(value: str) -> int:
    n = int(value)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {n}")
    return n


def _non_negative(value: str) -> int:
    n = int(value)
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {n}")
    return n


def default_workers() -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, 16))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="han-score",
        description="Classify every row of a Parquet, CSV or JSON Lines file with a HAN model. "
        "Output type follows OUTPUT's extension (.parquet, .jsonl, .csv): one row per scored input row, "
        "in input order, with the row index, the id (--id-column), the label(s) and every label's score. "
        "Rows that cannot be scored go to OUTPUT.errors.jsonl.",
    )
    p.add_argument("input", metavar="INPUT", help="a .parquet, .csv or .jsonl file (read as a stream)")
    p.add_argument("output", metavar="OUTPUT", help="the .parquet, .jsonl or .csv file to write")
    p.add_argument("--model", help="BentoML model tag or model directory (default: $HAN_MODEL_TAG or han-imdb:latest)")
    p.add_argument("--text-column", default="text", help="column holding the document text (default: text)")
    p.add_argument("--id-column", help="column to copy into the output as 'id' (the row index is always written)")
    p.add_argument(
        "--explain",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="also write the top sentences and words with their attention weights (default: no)",
    )
    p.add_argument("--top-sentences", type=_positive, default=3, help="sentences per explanation (default: 3)")
    p.add_argument("--top-words", type=_positive, default=5, help="words per explanation (default: 5)")
    p.add_argument("--batch-size", type=_positive, default=64, help="documents per model batch (default: 64)")
    p.add_argument(
        "--num-shards",
        type=_positive,
        default=1,
        help="split the input across N independent runs: row i belongs to shard i %% N (default: 1)",
    )
    p.add_argument("--shard-index", type=_non_negative, default=0, help="which shard this run scores (0..N-1)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted run from its last committed chunk")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output or partial run")
    p.add_argument(
        "--chunk-size",
        type=_positive,
        default=5_000,
        help="input rows per atomically committed chunk: the most work a kill can lose (default: 5000)",
    )
    p.add_argument(
        "--window",
        type=_positive,
        default=500,
        help="rows scored together by one process, length-sorted into batches (default: 500)",
    )
    p.add_argument(
        "--workers",
        type=_positive,
        default=None,
        help="scoring processes, this one included; each segments and runs the model on whole windows "
        f"(default: the usable cores, here {default_workers()})",
    )
    p.add_argument("--threads", type=_positive, default=1, help="torch threads per scoring process (default: 1)")
    p.add_argument("--quiet", action="store_true", help="no progress bar and no summary")
    p.add_argument("--summary-json", metavar="FILE", help="also write the summary as JSON to FILE")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, _interrupt)  # `kill` stops as cleanly as Ctrl-C
    try:
        return run(args)
    except BatchError as e:
        print(f"han-score: error: {e}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        print(
            f"han-score: interrupted; committed chunks are kept in {args.output}.parts "
            "(rerun with --resume to continue)",
            file=sys.stderr,
        )
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("BENTOML_DO_NOT_TRACK", "true")
    from service import batch_input, batch_output  # light: their heavy imports are inside functions

    # Cheap checks first: no process is started for a job that cannot run.
    if args.shard_index >= args.num_shards:
        raise BatchError(f"--shard-index must be below --num-shards ({args.num_shards}), not {args.shard_index}")
    if args.resume and args.overwrite:
        raise BatchError("--resume and --overwrite contradict each other; pass one")
    input_path, output = Path(args.input), Path(args.output)
    if output.resolve() == input_path.resolve():
        raise BatchError(f"{output}: the output would overwrite the input")
    try:
        batch_input.check_input_path(input_path)
        batch_output.check_output_path(output)
    except (batch_input.InputError, batch_output.OutputError) as e:
        raise BatchError(str(e)) from None
    if output.exists() and not batch_output.parts_dir(output).exists() and not args.overwrite:
        if not args.resume:
            raise BatchError(f"{output} already exists; pass --overwrite to replace it")
        if not args.quiet:
            print(
                f"han-score: {output} is already complete; nothing to resume (use --overwrite to score again)",
                file=sys.stderr,
            )
        return 0

    # Worker processes start now: importing torch and spaCy takes them seconds, which overlap
    # this process importing its own and checking the input and the model.
    workers = default_workers() if args.workers is None else args.workers
    pool = WorkerPool(workers - 1) if workers > 1 else None
    try:
        return _check_and_run(args, input_path, output, pool, workers, started)
    finally:
        if pool:
            pool.close()


def _check_and_run(
    args: argparse.Namespace, input_path: Path, output: Path, pool: WorkerPool | None, workers: int, started: float
) -> int:
    import pyarrow as pa

    from service import batch_input, batch_output
    from service.batch_worker import ScoringOptions

    # Arrow's default pool (mimalloc) keeps freed reading buffers mapped: measured on IMDB test,
    # +87 MB of RSS at 25,000 rows over 5,000 (one big row group); glibc's pool, +27 MB.
    pa.set_memory_pool(pa.system_memory_pool())
    trace("imported")

    # Everything else that can be wrong before any work is done is checked here, each in one line.
    try:
        source = batch_input.open_input(input_path, args.text_column, args.id_column)
    except batch_input.InputError as e:
        raise BatchError(str(e)) from None
    trace("input opened")
    model_dir, saved = _resolve_model(args.model)
    trace("model checked")
    spec = batch_output.OutputSpec(
        list(saved.labels),
        bool(saved.model.config.multi_label),
        args.id_column is not None,
        source.id_is_int,
        args.explain,
    )
    try:
        fmt = batch_output.output_format(output, spec)
        output.parent.mkdir(parents=True, exist_ok=True)
    except (batch_output.OutputError, OSError) as e:
        raise BatchError(str(e)) from None
    options = ScoringOptions(args.explain, args.top_sentences, args.top_words, args.batch_size, threads=args.threads)
    stat = input_path.stat()
    job = {
        "input": str(input_path.resolve()),
        "input_size": stat.st_size,
        "input_mtime_ns": stat.st_mtime_ns,
        "text_column": args.text_column,
        "id_column": args.id_column,
        "num_shards": args.num_shards,
        "shard_index": args.shard_index,
        "model": str(Path(model_dir).resolve()),
        "explain": args.explain,
        "top_sentences": args.top_sentences if args.explain else None,
        "top_words": args.top_words if args.explain else None,
        "output_format": fmt.suffix,
    }
    partial = batch_output.PartialOutput(output, fmt)
    try:
        return _run_job(args, source, partial, job, Scorer(pool, model_dir, saved, options), workers, started)
    finally:
        partial.unlock()


def _run_job(
    args: argparse.Namespace,
    source: Any,
    partial: Any,
    job: dict[str, Any],
    scorer: Scorer,
    workers: int,
    started: float,
) -> int:
    from service import batch_input, batch_output

    try:
        opened = _open_partial(partial, job, args)
    except batch_output.OutputError as e:
        raise BatchError(str(e)) from None
    if opened is None:
        if not args.quiet:
            print(f"han-score: {partial.output} is already complete; nothing to resume", file=sys.stderr)
        return 0

    job_run = JobRun(args, source, partial, scorer, workers, started)
    try:
        summary = job_run.run()
    except (batch_input.InputError, batch_output.OutputError, OSError) as e:
        raise BatchError(f"{e}; {job_run.committed_note()}", code=1) from None
    except BatchError as e:
        raise BatchError(f"{e}; {job_run.committed_note()}", code=e.code) from None
    if args.summary_json:
        Path(args.summary_json).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    if not args.quiet:
        print_summary(summary)
    return 0


def _resolve_model(ref: str | None) -> tuple[str, Any]:
    """The model directory and the loaded SavedModel; a bad reference is a one-line BatchError."""
    import model_store
    from han import ModelDirectoryError

    ref = ref or model_store.default_model_tag()
    try:
        model_dir = model_store.model_path(ref)
        saved = model_store.load(model_dir)
    except (model_store.ModelNotFoundError, ModelDirectoryError) as e:
        raise BatchError(str(e)) from None
    return str(model_dir), saved


def _open_partial(partial: Any, job: dict[str, Any], args: argparse.Namespace) -> Any:
    """Start, resume or refuse, depending on what exists at OUTPUT; None when OUTPUT is already complete."""
    output = partial.output
    if partial.dir.exists():
        partial.lock()
        manifest = partial.read_manifest() if not args.overwrite else None
        if args.overwrite or (args.resume and manifest is None):
            partial.start(job)
        elif args.resume:
            changed = sorted(k for k in job if manifest["job"].get(k) != job[k])
            if changed:
                raise BatchError(
                    f"{partial.dir} holds a partial run with other settings ({', '.join(changed)} differ); "
                    "rerun it with the same ones, or pass --overwrite to start over"
                )
            partial.resume(manifest)
        else:
            done = manifest["counts"]["read"] if manifest else 0
            raise BatchError(
                f"{output}: an interrupted run left partial output in {partial.dir} ({done:,} rows committed); "
                "pass --resume to continue it or --overwrite to start over"
            )
        return partial
    if output.exists() and not args.overwrite:
        if args.resume:
            return None
        raise BatchError(f"{output} already exists; pass --overwrite to replace it")
    partial.lock()
    partial.start(job)
    return partial


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
        from service.batch_output import Chunk
        from service.batch_worker import score_window

        scorer = self.scorer
        scorer.start()
        progress = make_progress(self.args.quiet)
        task = progress.add_task("scoring", total=None, completed=self.partial.manifest["counts"]["read"])
        self._count_rows_in_background(progress, task)
        windows = self.windows()
        meta: dict[int, tuple[list[int], list[Any], bool]] = {}  # seq -> (rows, ids, ends_chunk)
        done: dict[int, list[tuple]] = {}  # scored windows waiting for an earlier one
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
                results = done.pop(emit_seq)
                rows, ids, ends_chunk = meta.pop(emit_seq)
                for row, id_value, result in zip(rows, ids, results, strict=True):
                    chunk.add(row, id_value, result)
                progress.advance(task, len(rows))
                if ends_chunk:
                    self.partial.commit(chunk, rows[-1] + 1, self.elapsed())
                    trace(f"chunk committed: rows < {rows[-1] + 1}")
                    chunk = Chunk(self.partial.fmt.spec)
                emit_seq += 1
                self.emitted += len(rows)
                if not first:
                    first.append((time.monotonic(), self.emitted))
                    trace("first window back")

        try:
            with progress:
                trace("scoring")
                exhausted = False
                while True:
                    # Keep each worker that has loaded its model busy: one window in work, one queued.
                    while pool and not exhausted and pool.in_flight < 2 * pool.ready:
                        item = next_window()
                        if item is None:
                            exhausted = True
                        else:
                            pool.submit(*item)
                    if pool:
                        for seq, results in pool.finished():
                            done[seq] = results
                        emit()
                    # This process scores too: a new window, or at the end one still queued for a worker.
                    item = None
                    if not exhausted and len(done) < max_ahead:
                        item = next_window()
                        exhausted = item is None
                    if item is None and pool and exhausted:
                        item = pool.steal()
                    if item is not None:
                        seq, texts = item
                        done[seq] = score_window(scorer.predictor, texts, self.options)
                        self.windows_here += 1
                        emit()
                    elif pool and pool.in_flight:
                        seq, results = pool.get()
                        done[seq] = results
                        emit()
                    elif exhausted:
                        break
                if chunk.size:  # the input ended inside a chunk
                    self.partial.commit(chunk, chunk.last_row + 1, self.elapsed())
                trace("all windows scored")
                self.partial.record_elapsed(self.elapsed(), self.runs)
                self.partial.finish()
                trace("output merged")
        finally:
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


# ---------------------------------------------------------------------------------------------
# Scoring: this process, plus worker processes


class Scorer:
    """This process's Predictor plus the worker pool (if any): ``--workers`` scoring processes in all."""

    def __init__(self, pool: WorkerPool | None, model_dir: str, saved: Any, options: Any) -> None:
        self.pool = pool
        self.model_dir = model_dir
        self.saved = saved
        self.options = options
        self.predictor: Any = None

    def start(self) -> None:
        """Tell the workers which model to load, and get this process ready to score."""
        from han import Pipeline
        from service.batch_worker import tune_process

        if self.pool:
            self.pool.configure(self.model_dir, self.options)
        tune_process(self.options.threads)
        self.predictor = Pipeline(
            self.saved, batch_size=self.options.batch_size, max_batch_tokens=self.options.max_batch_tokens
        )

    def close(self) -> None:
        if self.pool:
            self.pool.close()


def _worker_entry(*args: Any) -> None:
    """Spawned process target; lives here (a light module) so that unpickling it imports nothing heavy."""
    from service.batch_worker import worker_main

    worker_main(*args)


class WorkerPool:
    """Spawned scoring processes pulling (seq, texts) tasks from one queue; results come back tagged.

    The processes start importing at once; ``configure`` tells them the model to load.
    """

    def __init__(self, n: int) -> None:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")  # a clean interpreter: no inherited threads or torch state
        # multiprocessing's resource tracker (a process started with the first queue, inheriting
        # this environment) warns at exit about a queue semaphore that a worker killed while still
        # importing had registered, then finds it already removed: noise on the user's terminal,
        # not a leak.
        quiet = "ignore:resource_tracker:UserWarning"
        filters = os.environ.get("PYTHONWARNINGS", "")
        if quiet not in filters.split(","):
            os.environ["PYTHONWARNINGS"] = f"{filters},{quiet}" if filters else quiet
        self.size = n
        self.ready = 0  # workers that have loaded the model
        self.in_flight = 0  # tasks submitted and not yet returned
        self.closed = False
        self.setup = ctx.Queue()
        self.tasks = ctx.Queue()
        self.results = ctx.Queue()
        self.procs = [
            ctx.Process(
                target=_worker_entry,
                args=(self.setup, self.tasks, self.results, os.getpid()),
                name=f"han-score-worker-{k}",
                daemon=True,
            )
            for k in range(n)
        ]
        for proc in self.procs:
            proc.start()
        trace(f"{n} worker process(es) started")

    def configure(self, model_dir: str, options: Any) -> None:
        for _ in self.procs:
            self.setup.put((model_dir, options))

    def submit(self, seq: int, texts: list[Any]) -> None:
        self.tasks.put((seq, texts))
        self.in_flight += 1

    def steal(self) -> tuple[int, list[Any]] | None:
        """Take back a task no worker has picked up yet (to score it in this process), if any."""
        import queue

        try:
            task = self.tasks.get_nowait()
        except queue.Empty:
            return None
        self.in_flight -= 1
        return task

    def finished(self) -> list[tuple[int, list[tuple]]]:
        """Results that are already back (does not wait)."""
        out = []
        while True:
            item = self._receive(timeout=None)
            if item is None:
                break
            out.append(item)
        return out

    def get(self) -> tuple[int, list[tuple]]:
        """The next result, waiting for it; a worker that died or failed stops the job."""
        while True:
            item = self._receive(timeout=0.5)
            if item is not None:
                return item
            dead = [p for p in self.procs if p.exitcode is not None]
            if dead:
                item = self._receive(timeout=1.0)  # a worker that failed says why just before it exits
                if item is not None:
                    return item
                raise BatchError(
                    f"a scoring worker died (exit code {dead[0].exitcode}; killed, or out of memory?)", code=1
                )

    def _receive(self, timeout: float | None) -> tuple[int, list[tuple]] | None:
        """One result, or None if none came within ``timeout`` (None: do not wait at all)."""
        import queue

        from service.batch_worker import FATAL, READY

        while True:
            try:
                kind, seq, payload = self.results.get(timeout=timeout) if timeout else self.results.get_nowait()
            except queue.Empty:
                return None
            if kind == FATAL:
                raise BatchError(payload, code=1)
            if kind == READY:
                self.ready += 1
                trace(f"worker {payload} ready")
                continue
            self.in_flight -= 1
            return seq, payload

    def close(self) -> None:
        """Stop the workers: politely when all is done, otherwise (an error, Ctrl-C) at once.

        A worker still starting up (importing torch) cannot see the stop message for seconds,
        and holds nothing worth saving, so it is killed rather than waited for.
        """
        if self.closed:
            return
        self.closed = True
        polite = self.in_flight == 0 and self.ready == self.size
        for _ in self.procs:
            self.setup.put(None)
            self.tasks.put(None)
        deadline = time.monotonic() + (2.0 if polite else 0.0)
        for proc in self.procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        for q in (self.setup, self.tasks, self.results):
            q.cancel_join_thread()


# ---------------------------------------------------------------------------------------------
# Progress and summary


def make_progress(quiet: bool) -> Any:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        ProgressColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    from rich.text import Text

    class RateColumn(ProgressColumn):
        def render(self, task: Any) -> Text:
            speed = task.finished_speed or task.speed
            return Text(f"{speed:,.0f} docs/s" if speed else "- docs/s", style="progress.data.speed")

    return Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        RateColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        disable=quiet,
    )


def print_summary(s: dict[str, Any]) -> None:
    from rich.console import Console

    console = Console(stderr=True, highlight=False)
    shard = f" (shard {s['shard'][0]} of {s['shard'][1]})" if s["shard"][1] > 1 else ""
    labels = ", ".join(f"{label} {n:,}" for label, n in s["labels"].items()) or "-"
    lines = [
        f"han-score: wrote {s['output']}{shard}",
        f"  rows read   {s['rows_read']:>12,}",
        f"  scored      {s['scored']:>12,}",
        f"  failed      {s['failed']:>12,}  (details in {s['errors_file']})"
        if s["failed"]
        else f"  failed      {s['failed']:>12,}",
        f"  labels      {labels}",
        f"  wall time   {s['wall_s']:>11.1f}s  "
        f"({s['rows_this_run']:,} rows this run, {s['docs_per_s'] or 0:,.0f} docs/s)",
    ]
    if s["resumed_from_row"] is not None or s["runs"] > 1:
        lines.append(
            f"  resumed     from input row {s['resumed_from_row'] or 0:,}; {s['runs']} runs, "
            f"{s['total_elapsed_s']:.1f}s in all"
        )
    console.print("\n".join(lines), markup=False)


if __name__ == "__main__":
    sys.exit(main())
