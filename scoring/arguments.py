"""han-score's command line: its arguments and their checks (standard library only: see ``scoring.cli``)."""

from __future__ import annotations

import argparse
import os

from han.methods import DEFAULT_METHOD, METHODS


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
    """The usable cores, at most 16. Counted here rather than with ``han.environment.usable_cores``:
    importing ``han`` imports torch and spaCy, seconds that must come after the workers are spawned
    (so that their own imports overlap) and never before --help or a Ctrl-C handler."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, 16))


BARE = object()  # --explain given without a method (not a str: argparse runs a str const through type=)


def _method(value: str) -> str:
    """An explanation method; a file name after a bare --explain gets the fix in the message."""
    if value in METHODS:
        return value
    fix = "; put --explain after INPUT OUTPUT, or write --explain=METHOD" if "." in value or "/" in value else ""
    raise argparse.ArgumentTypeError(f"{value!r} is not a method (choose from {', '.join(METHODS)}){fix}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="han-score",
        description="Classify every row of a Parquet, CSV or JSON Lines file with a HAN model. "
        "Output type follows OUTPUT's extension (.parquet, .jsonl, .csv): one row per scored input row, "
        "in input order, with the row index, the id (--id-column, or a column named id), the label(s) and "
        "every label's score. "
        "Rows that cannot be scored go to OUTPUT.errors.jsonl.",
    )
    p.add_argument("input", metavar="INPUT", help="a .parquet, .csv or .jsonl file (read as a stream)")
    p.add_argument("output", metavar="OUTPUT", help="the .parquet, .jsonl or .csv file to write")
    p.add_argument("--model",
                   help="BentoML model tag or model directory (default: $HAN_MODEL_TAG or han-imdb:production)")
    p.add_argument("--text-column", default="text", help="column holding the document text (default: text)")
    p.add_argument("--id-column", help="column to copy into the output as 'id', each document's id (default: the "
                   "input's column named id, if it has one; the row index is always written)")
    p.add_argument(
        "--explain",
        nargs="?",
        const=BARE,  # a bare --explain: the default method, or an old --explain-method's (deprecated())
        type=_method,
        metavar="METHOD",
        help=f"also write the top sentences and words with their weights, by METHOD ({', '.join(METHODS)}; "
        f"default {DEFAULT_METHOD}; the others are signed: positive for the label, negative against it); "
        "after INPUT OUTPUT, or as --explain=METHOD (default: no explanation)",
    )
    # Flags of earlier releases, still accepted with a warning (deprecated(): at least one release before removal).
    p.add_argument("--no-explain", dest="old_no_explain", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--explain-method", dest="old_explain_method", type=_method, help=argparse.SUPPRESS)
    p.add_argument("--top-sentences", type=_positive, default=3, help="sentences per explanation (default: 3)")
    p.add_argument("--top-words", type=_positive, default=5, help="words per explanation (default: 5)")
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
    p.add_argument(
        "--engine",
        choices=("local", "ray"),
        default="local",
        help="local: this machine's worker processes (default); ray: Ray Data, locally or on a cluster "
        "(needs `pip install .[ray]` and an id: --id-column, or a column named id; INPUT may be a folder, a glob "
        "or s3://...; OUTPUT is a folder of part files)",
    )
    p.add_argument("--address", help="--engine ray: the cluster to join (auto, ray://HOST:PORT); default: Ray here")
    p.add_argument("--concurrency", type=_positive, help="--engine ray: scoring actors (default: the cluster's CPUs)")
    p.add_argument("--num-cpus", type=_positive, help="--engine ray without --address: CPUs for local Ray")
    p.add_argument(
        "--input-format",
        choices=("parquet", "csv", "json"),
        help="--engine ray: the input type when INPUT's name does not tell it (a folder)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar and no summary")
    p.add_argument("--summary-json", metavar="FILE", help="also write the summary as JSON to FILE")
    return p


def deprecated(args: argparse.Namespace) -> list[str]:
    """Reads the flags of earlier releases into today's (their meaning then) and returns a warning line for
    each: ``--no-explain`` (no explanation, today's default) and ``--explain-method M`` (the method of a
    bare ``--explain``; without ``--explain`` it explained nothing, and still does not). Either beside an
    ``--explain`` that says otherwise is ArgumentTypeError: a contradiction is not settled silently."""
    warnings = []
    if args.old_no_explain and args.explain is not None:
        raise argparse.ArgumentTypeError("--no-explain and --explain contradict each other; pass one")
    if args.old_explain_method is not None and args.explain not in (None, BARE, args.old_explain_method):
        raise argparse.ArgumentTypeError(f"--explain={args.explain} and --explain-method {args.old_explain_method} "
                                         "contradict each other; pass --explain=METHOD alone")
    if args.old_no_explain:
        warnings.append("--no-explain is deprecated and will be removed in a later release: "
                        "leave it out (no explanation is the default)")
        args.explain = None
    if args.old_explain_method is not None:
        method = args.old_explain_method
        if args.explain is not None:
            args.explain = method
            fix = f"write --explain={method}"
        else:  # as before: the method of an --explain not given, so nothing is explained
            fix = f"without --explain it explains nothing, as before (--explain={method} explains by {method})"
        warnings.append(f"--explain-method is deprecated and will be removed in a later release: {fix}")
    if args.explain is BARE:
        args.explain = DEFAULT_METHOD
    return warnings
