"""``han-score --engine ray``: the same scoring on Ray Data, from one machine's cores to a cluster.

Ray Data reads the input (a file, a folder or a glob; local or any pyarrow filesystem such as s3://)
as a stream of blocks; ``map_batches`` sends them to an actor pool in which each actor loads the
model once (``RayScorer``) and calls ``scoring.score.score_batch``, the function the local engine
uses too. Ray retries a batch whose actor died and restarts the actor, so a killed worker loses
and duplicates no rows. Output and errors are written as folders of part files.

A distributed read has no global row index, so this engine needs ``--id-column`` to name rows:
its output has ``id`` where the local engine has ``row`` (and ``id``). Ray is imported only here.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from scoring.score import ScoringOptions

READERS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".jsonl": "json", ".ndjson": "json"}
WRITERS = {".parquet": "write_parquet", ".jsonl": "write_json", ".csv": "write_csv"}


class RayEngineError(Exception):
    """The Ray job cannot run or failed (one line); ``code`` as in ``scoring.cli.BatchError``."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


class RayScorer:
    """One actor of the pool: loads the model once, then scores batches with ``score_batch``.

    It returns the scored rows and writes a batch's bad rows itself, as one JSON Lines file in the
    errors folder named after the batch's ids: the whole job is then one streaming pass (read, score,
    write), and a batch that Ray retries after its actor died rewrites the same file, never a second.
    """

    def __init__(
        self, model_dir: str, spec: Any, options: ScoringOptions, text_column: str, id_column: str, errors: str
    ) -> None:
        from han.environment import apply_defaults, tune_process
        from scoring.score import make_pipeline

        apply_defaults()
        tune_process(options.threads)
        self.pipeline = make_pipeline(model_dir, options)
        self.spec, self.options = spec, options
        self.text_column, self.id_column, self.errors = text_column, id_column, errors

    def __call__(self, batch: Any) -> Any:
        import pyarrow.compute as pc

        from scoring.score import score_batch

        table = score_batch(self.pipeline, batch, self.spec, self.options, self.text_column, self.id_column)
        bad = pc.is_valid(table["reason"])
        if pc.any(bad).as_py():
            self._write_errors(table.filter(bad).select(["id", "reason"]).to_pylist())
            table = table.filter(pc.invert(bad))
        return table.drop_columns(["row", "reason"])

    def _write_errors(self, rows: list[dict[str, Any]]) -> None:
        import hashlib
        import json

        fs, folder = _filesystem(self.errors)
        fs.create_dir(folder, recursive=True)
        digest = hashlib.sha1(json.dumps([r["id"] for r in rows]).encode()).hexdigest()[:20]
        with fs.open_output_stream(f"{folder}/errors-{digest}.jsonl") as f:
            f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8"))


def input_format(path: str, fmt: str | None) -> str:
    """parquet, csv or json, from ``--input-format`` or the path's extension (a folder needs the flag)."""
    if fmt:
        return fmt
    for suffix, name in READERS.items():
        if path.lower().endswith(suffix):
            return name
    raise RayEngineError(f"{path}: cannot tell the input type from the name; pass --input-format parquet|csv|json")


def output_writer(path: str) -> str:
    for suffix, name in WRITERS.items():
        if path.lower().rstrip("/").endswith(suffix):
            return name
    raise RayEngineError(f"{path}: unsupported output type (end the name with {', '.join(WRITERS)})")


def check_paths(args: argparse.Namespace) -> None:
    """The input and output types known, and no earlier output in the way unless ``--overwrite``:
    checked before anything slow starts."""
    input_format(args.input, getattr(args, "input_format", None))
    output_writer(args.output)
    if not args.overwrite and (_exists(args.output) or _exists(errors_path(args.output))):
        raise RayEngineError(f"{args.output} already exists; pass --overwrite to replace it")


def init_ray(address: str | None, num_cpus: int | None, quiet: bool) -> None:
    """Start Ray here (this machine's cores) or join ``address``; quiet: no dashboard, no worker logs."""
    import ray

    from han.environment import apply_defaults

    apply_defaults()
    if ray.is_initialized():
        return
    # The driver's own core worker logs errors to the terminal, among them one that Ray Data's actor
    # pools trigger on every run (ray-project/ray#53727: constructor arguments in the object store).
    os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "fatal")
    kwargs: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.ERROR, "configure_logging": True}
    if address:
        kwargs["address"] = address
    else:
        kwargs.update(include_dashboard=False, num_cpus=num_cpus)
    ray.init(**kwargs)
    import ray.data

    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = not quiet
    ctx.print_on_execution_start = False
    # Ray Data's INFO lines (each dataset executed, each sink written) would bury the summary.
    for name in ("ray", "ray.data"):
        logging.getLogger(name).setLevel(logging.ERROR if quiet else logging.WARNING)
    # Its advice that the Parquet reader might want a memory reservation, every 30 s, is for clusters
    # short of memory; the summary is what a user needs to see.
    ctx.issue_detectors_config.high_memory_detector_config.detection_time_interval_s = -1


def run(args: argparse.Namespace, model: Callable[[], tuple[str, Any]]) -> dict[str, Any]:
    """Score ``args.input`` into ``args.output`` (a folder of part files) and ``OUTPUT.errors``; the summary.

    ``model`` returns the model directory and the loaded ``SavedModel`` (it is loading while Ray starts);
    the caller has run ``check_paths``.
    """
    import ray.data

    from scoring.formats import OutputSpec

    started = time.monotonic()
    fmt = input_format(args.input, getattr(args, "input_format", None))
    writer = output_writer(args.output)
    init_ray(args.address, args.num_cpus, args.quiet)
    model_dir, saved = model()
    try:
        read = getattr(ray.data, f"read_{fmt}")
        # Reads take a tenth of a CPU: the actors hold the rest, and a read that waited for a whole
        # CPU would never run on a machine whose every core holds an actor (the job would hang).
        extra: dict[str, Any] = {"file_extensions": None} if fmt == "json" else {}
        ds = read(args.input, num_cpus=0.1, **extra)
        schema = ds.schema()
    except Exception as e:
        raise RayEngineError(f"cannot read {args.input}: {_one_line(e)}") from None
    names = list(schema.names) if schema is not None else []
    for column in dict.fromkeys([args.text_column, args.id_column]):
        if column not in names:
            raise RayEngineError(f"{args.input}: no column {column!r} (columns: {', '.join(names) or 'none'})")
    import pyarrow as pa

    id_type = schema.types[names.index(args.id_column)]
    id_is_int = isinstance(id_type, pa.DataType) and pa.types.is_integer(id_type)
    spec = OutputSpec(list(saved.labels), bool(saved.model.config.multi_label), True, id_is_int, args.explain)
    options = ScoringOptions(args.explain, args.explain_method, args.top_sentences, args.top_words, args.batch_size,
                             threads=args.threads)
    concurrency = args.concurrency or max(1, int(ray.cluster_resources().get("CPU", 1)))
    # Blocks of --window rows: a single file is read as one block, which would keep all but one actor idle.
    ds = ds.select_columns(list(dict.fromkeys([args.text_column, args.id_column])))
    scored = ds.repartition(target_num_rows_per_block=args.window).map_batches(
        RayScorer,
        fn_constructor_args=(model_dir, spec, options, args.text_column, args.id_column, errors_path(args.output)),
        batch_size=args.window,
        batch_format="pyarrow",
        compute=ray.data.ActorPoolStrategy(size=concurrency),
        # Half a logical CPU per actor (Ray does not cap threads by it): Ray Data's file-listing
        # and read tasks ask for a whole CPU each, and beside a pool that took every core they
        # would never be scheduled (the job hangs on 2 cores).
        # Ray Data restarts a dead actor and retries its batch (max_restarts, max_task_retries: -1).
        num_cpus=0.5,
    )
    for path in (args.output, errors_path(args.output)):  # --overwrite: only now that the job can start
        _remove(path)
    try:
        # One streaming pass: blocks are read, scored and written as they come, none held.
        getattr(scored, writer)(args.output, ray_remote_args={"num_cpus": 0.1})
        n_errors = _count_rows(errors_path(args.output), "json")
        n_scored = _count_rows(args.output, writer.removeprefix("write_"))
    except Exception as e:
        raise RayEngineError(f"the Ray job failed: {_one_line(e)}", code=1) from None
    elapsed = time.monotonic() - started
    return {
        "engine": "ray",
        "input": args.input,
        "output": args.output,
        "errors_output": errors_path(args.output) if n_errors else None,
        "rows": n_scored + n_errors,
        "rows_read": n_scored + n_errors,
        "scored": n_scored,
        "errors": n_errors,
        "actors": concurrency,
        "elapsed_s": round(elapsed, 3),
        "docs_per_s": round((n_scored + n_errors) / elapsed, 1) if elapsed else None,
    }


def _filesystem(path: str) -> tuple[Any, str]:
    """The pyarrow filesystem and the path on it, for a local path or a URI such as ``s3://``."""
    import pyarrow.fs as pafs

    return pafs.FileSystem.from_uri(path if "://" in path else os.path.abspath(path))


def _exists(path: str) -> bool:
    import pyarrow.fs as pafs

    fs, p = _filesystem(path)
    return fs.get_file_info(p).type != pafs.FileType.NotFound


def _remove(path: str) -> None:
    import pyarrow.fs as pafs

    fs, p = _filesystem(path)
    kind = fs.get_file_info(p).type
    if kind == pafs.FileType.Directory:
        fs.delete_dir(p)
    elif kind == pafs.FileType.File:
        fs.delete_file(p)


def _count_rows(path: str, fmt: str) -> int:
    """Rows written to a folder of part files (Parquet: from the footers); 0 if there is none."""
    import pyarrow.dataset as pds

    if not _exists(path):
        return 0
    fs, p = _filesystem(path)
    return pds.dataset(p, format=fmt, filesystem=fs).count_rows()


def errors_path(output: str) -> str:
    return output.rstrip("/") + ".errors"


def print_summary(summary: dict[str, Any]) -> None:
    print(
        f"han-score (ray): {summary['rows']:,} rows, {summary['scored']:,} scored, {summary['errors']:,} errors, "
        f"{summary['elapsed_s']:.1f} s ({summary['docs_per_s']} docs/s) -> {summary['output']}"
        + (f" (errors: {summary['errors_output']})" if summary["errors_output"] else ""),
        file=sys.stderr,
    )


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text[:300]
