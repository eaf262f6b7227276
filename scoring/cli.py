"""``han-score INPUT OUTPUT``: classify every row of a Parquet, CSV or JSON Lines file with a HAN model.

    han-score reviews.parquet scores.parquet --model han-imdb:latest --id-column id
    han-score reviews.csv scores.jsonl --explain --top-sentences 3 --top-words 5
    han-score big.jsonl part-2.parquet --num-shards 4 --shard-index 2      # one of 4 workers
    han-score big.jsonl part-2.parquet --num-shards 4 --shard-index 2 --resume   # after a crash

How it runs: the main process streams the input (``scoring.read``) and cuts it into windows of
``--window`` rows. ``--workers`` processes score windows, the main process included
(``scoring.job``, ``scoring.workers``): each segments a whole window and classifies it through
``han.Pipeline`` in ``scoring.score.score_texts``, the one scoring function, so on two cores one
process's tokenisation overlaps the other's model forward. Results are put back in input order
and every ``--chunk-size`` rows are committed atomically (``scoring.partial``): a run killed at
any moment and rerun with ``--resume`` ends with every row exactly once. Rows that cannot be
scored go to ``OUTPUT.errors.jsonl``.

Exit codes: 0 done; 1 the job failed midway (committed chunks are kept; fix and --resume); 2 nothing was scored
(bad arguments, unreadable input, missing column, unknown model, existing output); 130 interrupted.

This module imports only the standard library at the top: scoring workers are spawned and
re-import the ``__main__`` module, which must stay cheap. The heavy imports live in ``run``.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

from scoring import BatchError, Interrupted
from scoring.arguments import build_parser, default_workers, deprecated
from scoring.progress import print_summary
from scoring.workers import Workers, interrupt

# A finished output keeps no record of the settings that wrote it (the run's manifest goes with its parts), so
# --resume cannot tell whether this run asks for another model or other explanations: say so every time.
FINISHED_KEEPS_NO_SETTINGS = ("its settings are not kept, so this run's model and options are not applied to it: "
                              "pass --overwrite to score it again")


def command() -> None:
    """``han-score``."""
    sys.exit(main())


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        warnings = deprecated(args)
    except argparse.ArgumentTypeError as e:
        parser.error(str(e))
    for warning in warnings:
        print(f"han-score: warning: {warning}", file=sys.stderr)
    # Ctrl-C, and `kill` as cleanly: KeyboardInterrupt, held back while the futures' locks are held
    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return run(args)
    except BatchError as e:
        print(f"han-score: error: {e}", file=sys.stderr)
        return e.code
    except Interrupted as e:  # what the interrupted run leaves, as it found it
        print(f"han-score: interrupted; {e}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:  # before anything was written (the Ray engine's own output: removed)
        print("han-score: interrupted; nothing written", file=sys.stderr)
        return 130
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _check_written(args: argparse.Namespace) -> None:
    """Refuse an output, errors file or summary that is the input (writing it would destroy what is read),
    a summary that is the output or its errors, and a summary whose folder is missing (found only once
    the job had run)."""
    from scoring.formats import errors_path

    source = Path(args.input).resolve()
    written = [(args.output, "the output"), (errors_path(args.output), "the output's errors file"),
               (errors_path(args.output, folder=True), "the output's errors folder")]
    written += [(args.output.rstrip("/") + ".lock", "the output's lock file (removed when the run ends)")]
    written += [(args.summary_json, "--summary-json")] if args.summary_json else []
    for path, what in written:
        if Path(path).resolve() == source:
            raise BatchError(f"{path}: {what} would overwrite the input")
    summary = Path(args.summary_json).resolve() if args.summary_json else None
    for path, what in written[:3]:  # the summary, written last, would replace what the job wrote
        if summary == Path(path).resolve():
            raise BatchError(f"--summary-json {args.summary_json}: is {what}; writing the summary there would "
                             "replace it: choose another file")
    if args.summary_json and not Path(args.summary_json).resolve().parent.is_dir():
        raise BatchError(f"--summary-json {args.summary_json}: folder {Path(args.summary_json).parent} does not exist")


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    from scoring import formats, partial, read  # light: their heavy imports are inside functions

    if args.shard_index >= args.num_shards:  # either engine (Ray's took --shard-index 5 of 1 and scored all)
        raise BatchError(f"--shard-index must be below --num-shards ({args.num_shards}), not {args.shard_index}")
    _check_written(args)  # either engine: --overwrite removes the output (and its errors file) first
    if args.engine == "ray":
        return _run_ray(args)

    # Cheap checks first: no process is started for a job that cannot run.
    if args.resume and args.overwrite:
        raise BatchError("--resume and --overwrite contradict each other; pass one")
    input_path, output = Path(args.input), Path(args.output)
    if output.is_dir():  # found only at the end, after every row was scored
        raise BatchError(f"{output}: is a folder; the output is a file")
    try:
        read.check_input_path(input_path)
        formats.check_output_path(output)
    except (read.InputError, formats.OutputError) as e:
        raise BatchError(str(e)) from None
    if output.exists() and not partial.parts_dir(output).exists() and not args.overwrite:
        if not args.resume:
            raise BatchError(f"{output} already exists; pass --overwrite to replace it")
        # even with --quiet: a warning, not progress (this run's settings were not applied)
        print(f"han-score: {output} is already complete; nothing to resume ({FINISHED_KEEPS_NO_SETTINGS})",
              file=sys.stderr)
        return 0

    # Worker processes start now: importing torch and spaCy takes them seconds, which overlap
    # this process importing its own and checking the input and the model.
    workers = default_workers() if args.workers is None else args.workers
    pool = Workers(workers - 1) if workers > 1 else None
    try:
        return _check_and_run(args, input_path, output, pool, workers, started)
    finally:
        if pool:
            pool.close()


def _check_and_run(
    args: argparse.Namespace, input_path: Path, output: Path, pool: Workers | None, workers: int, started: float
) -> int:
    import pyarrow as pa

    from han.environment import apply_defaults  # after the workers are spawned: han imports torch
    from scoring import formats, read
    from scoring.job import Scorer
    from scoring.partial import PartialOutput
    from scoring.score import ScoringOptions

    apply_defaults()
    # Arrow's default pool (mimalloc) keeps freed reading buffers mapped, and the process's memory grows.
    pa.set_memory_pool(pa.system_memory_pool())

    # Everything else that can be wrong before any work is done is checked here, each in one line.
    try:
        source = read.open_input(input_path, args.text_column, args.id_column)
    except read.InputError as e:
        raise BatchError(str(e)) from None
    source = _as_started(args, output, source)
    model_dir, saved = _resolve_model(args.model)
    spec = formats.OutputSpec(
        list(saved.labels),
        bool(saved.config.multi_label),
        source.id_column is not None,  # --id-column, or the input's column named id
        source.id_is_int,
        args.explain is not None,
        saved.ngrams is not None,
    )
    try:
        fmt = formats.output_format(output, spec)
        output.parent.mkdir(parents=True, exist_ok=True)
    except (formats.OutputError, OSError) as e:
        raise BatchError(str(e)) from None
    options = ScoringOptions(args.explain, args.top_sentences, args.top_words)
    stat = input_path.stat()
    job = {
        "input": str(input_path.resolve()),
        "input_size": stat.st_size,
        "input_mtime_ns": stat.st_mtime_ns,
        "text_column": args.text_column,
        "id_column": source.id_column,
        "num_shards": args.num_shards,
        "shard_index": args.shard_index,
        "model": str(Path(model_dir).resolve()),
        "explain": args.explain is not None,  # the manifest's keys as before --explain took the method
        "top_sentences": args.top_sentences if args.explain else None,
        "top_words": args.top_words if args.explain else None,
        "explain_method": args.explain,
        "output_format": fmt.suffix,
    }
    partial = PartialOutput(output, fmt)
    try:
        return _run_job(args, source, partial, job, Scorer(pool, model_dir, saved, options), workers, started)
    except KeyboardInterrupt:
        raise Interrupted(_left_behind(partial)) from None
    finally:
        partial.unlock()


def _as_started(args: argparse.Namespace, output: Path, source: Any) -> Any:
    """--resume of a partial run that an earlier release started without --id-column: that release read ids only
    with the flag, where this one takes a column named id. The run goes on as it began, without ids, so that
    its rows are alike (and its manifest's settings are this run's)."""
    from dataclasses import replace

    from scoring import partial, read

    if not args.resume or args.overwrite or args.id_column is not None or source.id_column != read.DEFAULT_ID_COLUMN:
        return source
    recorded = partial.recorded_job(output)
    if not recorded or "id_column" not in recorded or recorded["id_column"] is not None:
        return source
    print(f"han-score: note: {partial.parts_dir(output)} was started without ids (by a release that read them only "
          f"with --id-column): resumed so, its column {read.DEFAULT_ID_COLUMN!r} not read", file=sys.stderr)
    return replace(source, id_column=None, id_is_int=False)


def _left_behind(partial: Any) -> str:
    """What an interrupted run leaves, for its last line: committed chunks (kept for --resume), or nothing (a
    folder committing no row is removed: it would only stop a plain rerun)."""
    if partial.manifest.get("state") == "merged":  # finished, or only the folder's removal was left
        done = f"the output {partial.output} is complete"
        return done + (f"; rerun with --resume to remove {partial.dir}" if partial.dir.exists() else "")
    if not partial.locked:  # interrupted before it took OUTPUT.parts: this run wrote nothing there
        return "nothing written"
    if _drop_if_empty(partial):
        return "no chunk was committed; nothing written"
    return f"committed chunks are kept in {partial.dir} (rerun with --resume to continue)"


def _failed_note(partial: Any, job_run: Any) -> str:
    """After a failure midway: the committed rows kept for --resume, or nothing (no chunk committed)."""
    return "no chunk was committed; nothing written" if _drop_if_empty(partial) else job_run.committed_note()


def _drop_if_empty(partial: Any) -> bool:
    """Remove OUTPUT.parts if this process holds it and its manifest (on disk: this process's copy is a step
    ahead while a commit is written) commits no row; whether it did."""
    import contextlib

    from scoring.formats import OutputError

    try:
        manifest = partial.read_manifest() if partial.locked else {"state": "not ours"}
    except OutputError:  # unreadable: not ours to judge
        return False
    if manifest is None or (manifest["state"] == "running" and not manifest["parts"]):
        with contextlib.suppress(OSError):
            partial.remove()
        return True
    return False


def _run_job(
    args: argparse.Namespace,
    source: Any,
    partial: Any,
    job: dict[str, Any],
    scorer: Any,
    workers: int,
    started: float,
) -> int:
    from scoring import formats, read
    from scoring.job import JobRun
    from scoring.workers import WorkerError

    try:
        opened = _open_partial(partial, job, args)
    except formats.OutputError as e:
        raise BatchError(str(e)) from None
    if opened is None:
        print(f"han-score: {partial.output} is already complete; nothing to resume ({FINISHED_KEEPS_NO_SETTINGS})",
              file=sys.stderr)
        return 0

    job_run = JobRun(args, source, partial, scorer, workers, started)
    try:
        summary = job_run.run()
    except (read.InputError, formats.OutputError, WorkerError, OSError) as e:
        raise BatchError(f"{e}; {_failed_note(partial, job_run)}", code=1) from None
    except BatchError as e:
        raise BatchError(f"{e}; {_failed_note(partial, job_run)}", code=e.code) from None
    _write_summary(args, summary)
    if not args.quiet:
        print_summary(summary)
    return 0


def _run_ray(args: argparse.Namespace) -> int:
    """--engine ray: the model is loaded and checked here (one line if bad) while Ray Data samples the
    input, then Ray Data does the rest."""
    if args.num_shards != 1 or args.resume or args.chunk_size != 5_000:
        raise BatchError("--num-shards, --shard-index, --resume and --chunk-size are for --engine local only")
    try:
        from scoring import ray_engine
    except ImportError as e:
        raise BatchError(f"--engine ray needs Ray Data: pip install '.[ray]' ({e})") from None
    ray_engine.check_paths(args)
    summary = ray_engine.run(args, lambda: _resolve_model(args.model))
    try:
        _write_summary(args, summary)
        if not args.quiet:
            ray_engine.print_summary(summary)
    except KeyboardInterrupt:
        raise Interrupted(f"the output {args.output} is complete") from None
    return 0


def _write_summary(args: argparse.Namespace, summary: dict[str, Any]) -> None:
    """--summary-json, whole or not at all: a full disk there is one line (status 1), the output being complete."""
    if not args.summary_json:
        return
    import os
    import tempfile

    path = Path(args.summary_json)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(summary, indent=2) + "\n")
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)  # as a file written in place gets, not mkstemp's 0600
        os.replace(tmp, path)
    except OSError as e:
        if tmp:
            Path(tmp).unlink(missing_ok=True)
        reason = os.strerror(e.errno) if e.errno else e.strerror or e
        raise BatchError(f"--summary-json {path}: cannot write ({reason}); the output {args.output} is complete",
                         code=1) from None


def _resolve_model(ref: str | None) -> tuple[str, Any]:
    """The model directory and the loaded SavedModel; a bad reference is a one-line BatchError."""
    import model_store

    try:
        model_dir, saved = model_store.open_model(ref)
    except (model_store.ModelOpenError, model_store.production.PromotionError) as e:  # the latter: a bad BENTOML_HOME
        raise BatchError(f"{e}{'' if isinstance(e, model_store.ModelOpenError) else ' (check BENTOML_HOME)'}") from None
    return str(model_dir), saved


def _open_partial(partial: Any, job: dict[str, Any], args: argparse.Namespace) -> Any:
    """Start, resume or refuse, depending on what exists at OUTPUT; None when OUTPUT is already complete.
    OUTPUT.parts that cannot be written (a full disk) is one line, and left as found, or removed if it commits
    nothing (it would stop the rerun)."""
    from scoring.formats import OutputError

    try:
        return _open_or_start(partial, job, args)
    except OutputError:
        _drop_if_empty(partial)
        raise


def _open_or_start(partial: Any, job: dict[str, Any], args: argparse.Namespace) -> Any:
    output = partial.output
    # OUTPUT.lock, held until the output is in place: what is at OUTPUT is judged under it, and a Ray job (which
    # takes it too) can neither replace this run's output nor have its own replaced by it.
    partial.output_lock.take()
    if partial.dir.exists():
        partial.lock()
        manifest = partial.read_manifest() if not args.overwrite else None
        if manifest is None or (manifest["state"] == "running" and not manifest["parts"]):
            if output.exists() and not args.overwrite:  # no row committed: nothing to resume, nothing to keep
                partial.remove()
                return _existing(output, args)
            partial.start(job)
        elif args.resume:
            recorded = manifest["job"]
            changed = [f"{k} {json.dumps(recorded.get(k))} there, {json.dumps(job[k])} now"
                       for k in job if recorded.get(k) != job[k]]
            if changed:
                raise BatchError(
                    f"{partial.dir} holds a partial run with other settings ({'; '.join(changed)}); "
                    "rerun it with the same ones, or pass --overwrite to start over"
                )
            partial.resume(manifest)
        else:
            done = manifest["counts"]["read"]
            raise BatchError(
                f"{output}: an interrupted run left partial output in {partial.dir} ({done:,} rows committed); "
                "pass --resume to continue it or --overwrite to start over"
            )
        return partial
    if output.exists() and not args.overwrite:
        return _existing(output, args)
    partial.lock()
    partial.start(job)
    return partial


def _existing(output: Path, args: argparse.Namespace) -> None:
    """A finished OUTPUT, no --overwrite: nothing to do with --resume, else refused."""
    if args.resume:
        return None
    raise BatchError(f"{output} already exists; pass --overwrite to replace it")
