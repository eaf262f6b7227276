"""``han-score --engine ray``: the same scoring on Ray Data, from one machine's cores to a cluster.

Ray Data reads the input (a file, a folder or a glob; local or any pyarrow filesystem such as s3://)
as a stream of blocks; ``map_batches`` sends them to an actor pool in which each actor loads the
model once (``RayScorer``) and calls ``scoring.score.score_batch``, the function the local engine
uses too, then writes the batch's rows with the local engine's writers (``scoring.formats``). Ray
retries a batch whose actor died and restarts the actor, and the retry rewrites the same part files,
so a killed worker loses and duplicates no rows. Output and errors are folders of part files, written
beside OUTPUT and put in place when the job is done (``scoring.ray_output``).

A distributed read has no global row index, so this engine needs ``--id-column`` to name rows:
its output has ``id`` where the local engine has ``row`` (and ``id``). Ray is imported only here.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scoring import BatchError, Interrupted
from scoring.formats import errors_path
from scoring.ray_output import RayOutput, exists, filesystem
from scoring.read import arrow_csv_as_text, id_column_of
from scoring.read_causes import read_cause
from scoring.score import ScoringOptions

READERS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".jsonl": "json", ".ndjson": "json"}


class RayScorer:
    """One actor of the pool: loads the model once, then scores batches with ``score_batch`` and writes
    them itself (no write tasks, whose worker processes cost more than the writing), each batch as files
    named after its ids and texts, so that a batch Ray retries rewrites the same files; returns the counts."""

    def __init__(
        self, model_dir: str, spec: Any, options: ScoringOptions, text_column: str, id_column: str, errors: str,
        output: str, fmt: str,
    ) -> None:
        from han import Pipeline
        from han.environment import apply_defaults, tune_process

        apply_defaults()
        tune_process()
        self.pipeline = Pipeline.from_directory(model_dir)
        self.spec, self.options = spec, options
        self.text_column, self.id_column, self.errors = text_column, id_column, errors
        self.output, self.fmt = output, fmt

    def __call__(self, batch: Any) -> Any:
        import pyarrow as pa
        import pyarrow.compute as pc

        from scoring.score import score_batch

        table = score_batch(self.pipeline, batch, self.spec, self.options, self.text_column, self.id_column)
        name = _batch_name(batch, self.id_column, self.text_column)
        bad = pc.is_valid(table["reason"])
        n_bad = pc.sum(bad.cast(pa.int64())).as_py() or 0
        if n_bad:
            _write(self.errors, f"errors-{name}.jsonl", table.filter(bad).select(["id", "reason"]))
            table = table.filter(pc.invert(bad))
        if len(table):
            _write(self.output, f"part-{name}.{self.fmt}", table.drop_columns(["row", "reason"]))
        return pa.table({"scored": [len(table)], "errors": [n_bad]})


def _batch_name(batch: Any, id_column: str, text_column: str) -> str:
    """A name from the batch's ids and texts: the same for a retry of the batch, unlike any other batch's."""
    import hashlib

    digest = hashlib.sha1()
    for column in dict.fromkeys([id_column, text_column]):
        digest.update(json.dumps(batch[column].to_pylist(), default=str).encode())
    return digest.hexdigest()[:24]


def _write(folder: str, name: str, table: Any) -> None:
    """``table`` as the file ``folder/name``, written as the local engine writes its output format."""
    from scoring.formats import write_csv, write_jsonl

    fs, path = filesystem(folder)
    # A local OUTPUT is written in its staging folder (``ray_output``), never made again here once removed
    # (the job interrupted): an actor still running then fails instead of leaving a folder behind.
    fs.create_dir(path, recursive="://" in folder)
    with fs.open_output_stream(f"{path}/{name}") as f:
        if name.endswith(".parquet"):
            import pyarrow.parquet as pq

            pq.write_table(table, f)
        elif name.endswith(".csv"):
            write_csv(table.to_pylist(), f, header=table.column_names)
        else:
            write_jsonl(table.to_pylist(), f)


def input_format(path: str, fmt: str | None) -> str:
    """parquet, csv or json, from ``--input-format`` or the path's extension (a folder needs the flag)."""
    if fmt:
        return fmt
    for suffix, name in READERS.items():
        if path.lower().endswith(suffix):
            return name
    raise BatchError(f"{path}: cannot tell the input type from the name; pass --input-format parquet|csv|json")


def output_format(path: str) -> str:
    """parquet, jsonl or csv: the local engine's output types (``scoring.formats``), from the name."""
    from scoring.formats import OUTPUT_FORMATS

    for suffix in OUTPUT_FORMATS:
        if path.lower().rstrip("/").endswith(suffix):
            return suffix.lstrip(".")
    raise BatchError(f"{path}: unsupported output type (end the name with {', '.join(OUTPUT_FORMATS)})")


def check_paths(args: argparse.Namespace) -> None:
    """The input and output types known, and no earlier output in the way unless ``--overwrite``:
    checked before anything slow starts (and again under OUTPUT.lock once Ray is up: ``RayOutput.open``)."""
    input_format(args.input, getattr(args, "input_format", None))
    output_format(args.output)
    if not args.overwrite and (exists(args.output) or exists(errors_path(args.output, folder=True))):
        raise BatchError(f"{args.output} already exists; pass --overwrite to replace it")


def init_ray(address: str | None, num_cpus: int | None, quiet: bool) -> bool:
    """Start Ray here (this machine's cores) or join ``address``; quiet: no dashboard, no worker logs.

    False when this process was already connected to Ray (a caller's session, left as it is)."""
    import ray

    from han.environment import apply_defaults
    from scoring.environment import apply_ray_defaults

    apply_defaults()
    if ray.is_initialized():
        return False
    apply_ray_defaults(local=not address)
    kwargs: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.ERROR, "configure_logging": True}
    if address:
        _reachable(address)
        kwargs["address"] = address
    else:
        kwargs.update(include_dashboard=False, num_cpus=num_cpus)
    try:
        with _without_stderr_line(b"Set ray log level from environment variable RAY_BACKEND_LOG_LEVEL"):
            ray.init(**kwargs)
    except (ConnectionError, ValueError) as e:  # no cluster at the address, or an address Ray cannot read
        if not address:
            raise
        from scoring import BatchError

        raise BatchError(f"--address {address}: {_one_line(e)}") from None
    import ray.data

    # Ray Data's advice to split an input smaller than --window into more blocks is not for this job.
    warnings.filterwarnings("ignore", message="The minimum number of concurrent actors", category=UserWarning)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = not quiet
    # The V1 Parquet reader reads footers in the read tasks; V2 starts footer-reader actors first.
    ctx.use_datasource_v2 = False
    ctx.print_on_execution_start = False
    # Ray Data's INFO lines (each dataset executed, each sink written) would bury the summary.
    for name in ("ray", "ray.data"):
        logging.getLogger(name).setLevel(logging.ERROR if quiet else logging.WARNING)
    # Its logs of a failed task's stack: the same error ends the job, named in one line (``_one_line``).
    for name in ("ray.data._internal.execution.streaming_executor_state", "ray.data.exceptions"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    # Its advice that the Parquet reader might want a memory reservation, every 30 s, is for clusters
    # short of memory; the summary is what a user needs to see.
    ctx.issue_detectors_config.high_memory_detector_config.detection_time_interval_s = -1
    return True


def _reachable(address: str) -> None:
    """A HOST:PORT that nothing answers is named at once: Ray would try it for minutes (ray#46863)."""
    import socket

    from scoring import BatchError

    host, _, port = address.rpartition(":")
    if address.startswith("ray://") or not host or not port.isdigit():
        return  # "auto", a Ray Client URL, or a form Ray itself explains
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=10).close()
    except OSError as e:
        raise BatchError(f"--address {address}: no Ray answers there ({e.strerror or e})") from None


@contextlib.contextmanager
def _without_stderr_line(noise: bytes) -> Any:
    """Standard error (the file descriptor: Ray's C++ core writes to it) held while the block runs, then
    written out less the lines holding ``noise``: the line Ray's core prints, whatever the level, when
    RAY_BACKEND_LOG_LEVEL is set (as RAY_DEFAULTS sets it to keep its errors on actor pools quiet)."""
    import tempfile

    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept = b"".join(line for line in held if noise not in line)
            if kept:
                os.write(2, kept)


def stop_ray() -> None:
    """Disconnect, and stop local Ray's processes if this driver started them (Ray's public API only)."""
    import ray

    if ray.is_initialized():
        ray.shutdown()


def run(args: argparse.Namespace, model: Callable[[], tuple[str, Any]]) -> dict[str, Any]:
    """Score ``args.input`` into ``args.output`` (a folder of part files) and ``OUTPUT.errors``; the summary.

    ``model`` loads the model: its directory and ``SavedModel`` (called while Ray Data samples the input);
    the caller has run ``check_paths``. Ray, when started here, is stopped before this returns.
    """
    started = time.monotonic()
    fmt = input_format(args.input, getattr(args, "input_format", None))
    connected_here = init_ray(args.address, args.num_cpus, args.quiet)
    summary = None
    try:
        summary = _score(args, model, fmt, started)
        return summary
    finally:
        if connected_here:
            try:
                stop_ray()
            except KeyboardInterrupt:
                if summary is None:
                    raise
                raise Interrupted(f"the output {args.output} is complete") from None


def _score(args: argparse.Namespace, model: Callable[[], tuple[str, Any]], fmt: str, started: float) -> dict[str, Any]:
    from concurrent.futures import ThreadPoolExecutor

    import ray.data

    from scoring.formats import OutputSpec

    # The model loads (torch and spaCy imported) once Ray is up, while Ray Data samples the input in a
    # Ray worker: nothing before ray.init imports them, so Ray starts sooner.
    with ThreadPoolExecutor(1, thread_name_prefix="han-model") as pool:
        loading = pool.submit(model)
        try:
            read = getattr(ray.data, f"read_{fmt}")
            # Reads take a tenth of a CPU: the actors hold the rest, and a read that waited for a whole
            # CPU would never run on a machine whose every core holds an actor (the job would hang).
            extra: dict[str, Any] = {"file_extensions": None} if fmt == "json" else {}
            extra |= arrow_csv_as_text(Path(args.input)) if fmt == "csv" else {}  # as the local engine reads
            ds = read(args.input, num_cpus=0.1, **extra)
            schema = ds.schema()
        except Exception as e:
            read_error = f"cannot read {args.input}: {read_cause(args.input, fmt) or _one_line(e)}"
        else:
            read_error = None
        model_dir, saved = loading.result()  # a bad model's one-line error first
    if read_error:
        raise BatchError(read_error)
    names = list(schema.names) if schema is not None else []
    args.id_column = id_column_of(names, args.text_column, args.id_column)
    if args.id_column is None:
        raise BatchError("--engine ray needs --id-column, or a column named id: a distributed read has no global "
                         f"row index (columns: {', '.join(names) or 'none'})")
    for column in dict.fromkeys([args.text_column, args.id_column]):
        if column not in names:
            raise BatchError(f"{args.input}: no column {column!r} (columns: {', '.join(names) or 'none'})")
    import pyarrow as pa

    id_type = schema.types[names.index(args.id_column)]
    id_is_int = isinstance(id_type, pa.DataType) and pa.types.is_integer(id_type)
    spec = OutputSpec(list(saved.labels), bool(saved.config.multi_label), True, id_is_int,
                      args.explain is not None, saved.ngrams is not None)
    options = ScoringOptions(args.explain, args.top_sentences, args.top_words)
    concurrency = args.concurrency or max(1, int(ray.cluster_resources().get("CPU", 1)))
    errors = errors_path(args.output, folder=True)
    # Ray Data's read already splits the input into blocks for the cluster's parallelism, which
    # map_batches cuts into batches of --window rows: no repartition, which copied every block once more.
    # A tenth of a CPU, as the reads: at Ray Data's default of one, beside the actors' half each, a
    # one-CPU Ray (`--num-cpus 1`, a one-core machine) never scheduled it and the job waited forever.
    ds = ds.select_columns(list(dict.fromkeys([args.text_column, args.id_column])), num_cpus=0.1)
    written = RayOutput(args.output, errors, args.overwrite)  # a folder beside OUTPUT until the job is done
    scored = ds.map_batches(
        RayScorer,
        fn_constructor_args=(model_dir, spec, options, args.text_column, args.id_column, written.errors,
                             written.output, output_format(args.output)),
        batch_size=args.window,
        batch_format="pyarrow",
        compute=ray.data.ActorPoolStrategy(size=concurrency),
        # Half a logical CPU per actor (Ray does not cap threads by it): Ray Data's file-listing
        # and read tasks ask for a whole CPU each, and beside a pool that took every core they
        # would never be scheduled (the job hangs on 2 cores).
        # Ray Data restarts a dead actor and retries its batch (max_restarts, max_task_retries: -1).
        num_cpus=0.5,
    )
    written.open()  # only now that the job can start
    try:
        n_scored, n_errors = _stream(args, scored, written)
        written.place()
    except BaseException as e:  # interrupted or failed: no OUTPUT that looks finished
        left = written.discard()
        if isinstance(e, KeyboardInterrupt):
            raise Interrupted(left) from None
        if isinstance(e, BatchError):
            raise BatchError(f"{e}; {left}", code=e.code) from None
        raise
    elapsed = time.monotonic() - started
    return {
        "engine": "ray",
        "input": args.input,
        "output": args.output,
        "errors_output": errors if n_errors else None,
        "rows": n_scored + n_errors,
        "rows_read": n_scored + n_errors,
        "scored": n_scored,
        "errors": n_errors,
        "actors": concurrency,
        "elapsed_s": round(elapsed, 3),
        "docs_per_s": round((n_scored + n_errors) / elapsed, 1) if elapsed else None,
    }


def _stream(args: argparse.Namespace, scored: Any, written: RayOutput) -> tuple[int, int]:
    """Run the job and check its part files; the rows scored and failed."""
    import pyarrow.fs as pafs

    n_scored = n_errors = n_parts = 0
    try:
        # One streaming pass: blocks are read, scored and written by the actors as they come; what
        # reaches this process is each batch's two counts (only a batch's successful attempt counts).
        for counts in scored.iter_batches(batch_size=None, batch_format="pyarrow"):
            scored_per_batch = counts.column("scored").to_pylist()
            n_scored += sum(scored_per_batch)
            n_parts += sum(1 for n in scored_per_batch if n)  # a batch with scored rows writes one part file
            n_errors += sum(counts.column("errors").to_pylist())
    except Exception as e:
        raise BatchError(f"the Ray job failed: {_one_line(e)}", code=1) from None
    # Part files are named after their batch's ids and texts, so two identical batches (the same
    # rows twice in the input) would share one file: a listing of the folder shows it.
    fs, folder = filesystem(written.output)
    files = len(fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True)))
    if files != n_parts:
        raise BatchError(
            f"{args.output}: {n_parts - files:,} batches of rows repeat earlier ones (the same ids and texts) and "
            "share their part file; give each row a unique --id-column", code=1,
        )
    return n_scored, n_errors


def print_summary(summary: dict[str, Any]) -> None:
    print(
        f"han-score (ray): {summary['rows']:,} rows, {summary['scored']:,} scored, {summary['errors']:,} errors, "
        f"{summary['elapsed_s']:.1f} s ({summary['docs_per_s']} docs/s) -> {summary['output']}"
        + (f" (errors: {summary['errors_output']})" if summary["errors_output"] else ""),
        file=sys.stderr,
    )


def _one_line(e: BaseException) -> str:
    """The error that started it, on one line: Ray's own error around a task's is the task's stack as
    text, in which the first ``SomeError: message`` not raised by Ray is the cause."""
    import re

    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e)).strip()
    text = re.split(r"\s*Failed to [^\n]* after \d+/\d+ attempts", text)[0]  # Ray's note of its retries
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if re.match(r"[A-Za-z_][\w.]*(Error|Exception|Invalid)\b[^:]*: ", line) and not line.startswith("ray."):
            text = " ".join([line, *lines[i + 1 : i + 3]]).split("The above exception")[0]
            break
    return (" ".join(text.split()) or type(e).__name__)[:300]
