"""``han-label``: which documents to label next, and the labels back from Label Studio.

    han-label next SOURCE --n 200 --out queue.json     # Label Studio tasks, pre-annotated (or .jsonl)
    han-label import export.json labelled.jsonl        # Label Studio's export -> a file han-train reads

A round: ``han-label next``, label in Label Studio, ``han-label import``, then ``han-train fit
--data.train labelled.jsonl --model.init_from NAME:production`` and the usual compare and promote.
Every problem with the input is one line naming the file (and the row); outputs are written whole
(a temporary file renamed) or not at all.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import threading
import unicodedata
from pathlib import Path
from typing import Any

from labeling.outputs import WriteError, config_path, write_next, write_rows
from labeling.strategies import DEFAULT_STRATEGY, STRATEGIES

OUTPUTS = (".json", ".jsonl")
IMPORT_OUTPUTS = (".jsonl", ".csv", ".parquet")
TOP_SENTENCES = 3
HOLDOUT = 0.1  # han-label next's share drawn at random for validation (the benchmark's STRATEGY-dev)


class LabelError(Exception):
    """A one-line error for the user."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="han-label", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    nxt = sub.add_parser("next", help="choose the documents to label next")
    nxt.add_argument("source", metavar="SOURCE",
                     help="a .parquet, .csv or .jsonl file or a folder han-train reads (labelled rows are left "
                          "out), or log:NAME, the inference log of model NAME's service")
    nxt.add_argument("--n", type=_positive, required=True, help="how many documents to choose")
    nxt.add_argument("--out", required=True, help="FILE.json (Label Studio tasks, with FILE.label-config.xml "
                                                  "beside it) or FILE.jsonl")
    nxt.add_argument("--model", help="BentoML tag or model directory (default: NAME:production for log:NAME, "
                                      "else $HAN_MODEL_TAG or han-imdb:production)")
    nxt.add_argument("--strategy", choices=STRATEGIES, default=DEFAULT_STRATEGY,
                     help=f"how to choose (default {DEFAULT_STRATEGY}: the benchmark's winner, BENCHMARKS.md)")
    nxt.add_argument("--labelled", nargs="*", default=[], metavar="FILE",
                     help="files of documents already labelled (han-label import's), left out by id and by text")
    nxt.add_argument("--text-column", default="text")
    nxt.add_argument("--id-column", help="the documents' id column (default: a column named id, else row-N)")
    nxt.add_argument("--holdout", type=_fraction, default=HOLDOUT,
                     help=f"the share of the N drawn at random and marked split=validation, which han-train fit "
                          f"validates on (default {HOLDOUT}; 0: none): the chosen documents are the model's "
                          f"hardest, and a fit that validates on them stops early and weighs its n-gram head on "
                          f"noise (docs/labeling.md)")
    nxt.add_argument("--seed", type=int, default=0, help="for the random and diverse strategies and the holdout")
    nxt.add_argument("--since", help="log:NAME only: records since this long ago (24h, 7d) or an ISO time")
    nxt.add_argument("--store", help="log:NAME only: the feedback store's URL (default: $HAN_FEEDBACK_STORE, "
                                      "else the one beside the production pointer)")
    nxt.add_argument("--workers", type=_positive, default=None,
                     help="scoring processes, this one included (default: the usable cores)")
    nxt.add_argument("--quiet", action="store_true", help="no progress bar")
    imp = sub.add_parser("import", help="a Label Studio export -> a file han-train reads")
    imp.add_argument("export", metavar="EXPORT", help="Label Studio's JSON, JSON-min (.json) or CSV (.csv) export")
    imp.add_argument("out", metavar="OUT", help="a .jsonl, .csv or .parquet file of id, text and label (or labels)")
    imp.add_argument("--model", help="the model whose labels the export must use (default: as han-label next)")
    return parser


def _fraction(value: str) -> float:
    try:
        share = float(value)
    except ValueError:
        share = -1.0
    if not 0 <= share < 1:
        raise argparse.ArgumentTypeError(f"must be a share from 0 up to 1, not {value!r}")
    return share


def _positive(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {value!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {n}")
    return n


def command() -> None:
    sys.exit(main())


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from scoring.workers import interrupt  # KeyboardInterrupt, held back while the futures' locks are held

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        from han.environment import apply_defaults

        apply_defaults()
        return {"next": run_next, "import": run_import}[args.command](args)
    except (LabelError, WriteError) as e:
        print(f"han-label: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("han-label: interrupted; nothing written", file=sys.stderr)
        return 130
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _model(ref: str | None) -> tuple[str, str, Any]:
    """(model directory, tag or directory as given, SavedModel); a bad reference is a LabelError."""
    import model_store

    try:
        directory, saved = model_store.open_model(ref)
        ref = ref or model_store.default_model_tag()
        if Path(ref).is_dir():  # a model directory outside the store (BentoML would read it as a tag, lowercased)
            return str(directory), str(ref), saved
        try:
            tag = model_store.resolve_tag(ref)
        except model_store.ModelNotFoundError:
            tag = str(ref)
    except model_store.ModelOpenError as e:
        raise LabelError(str(e)) from None
    except model_store.production.PromotionError as e:  # BENTOML_HOME a file, or a pointer that cannot be read
        raise LabelError(f"{e} (check BENTOML_HOME)") from None
    return str(directory), tag, saved


def _check_out(path: Path, allowed: tuple[str, ...], flag: str) -> None:
    if path.suffix.lower() not in allowed:
        raise LabelError(f"{flag} {path}: the file's extension must be one of {', '.join(allowed)}")
    if not path.parent.is_dir():
        raise LabelError(f"{flag} {path}: folder {path.parent} does not exist")
    if path.is_dir():
        raise LabelError(f"{flag} {path}: is a folder")
    try:  # a file can be made and written there (a full disk): known now, not after the whole pool is scored
        with tempfile.TemporaryFile(dir=path.parent) as probe:
            probe.write(bytes(4096))
            probe.flush()
    except OSError as e:
        raise LabelError(f"{flag} {path}: cannot write in {path.parent} ({e.strerror or e})") from None


def _not_an_input(out: Path, flag: str, inputs: list[tuple[str, str]]) -> None:
    """Refuse an output that is one of the command's inputs: writing it would destroy what it reads."""
    for what, path in inputs:
        if out.resolve() == Path(path).resolve():
            raise LabelError(f"{flag} {out}: is {what}; writing there would overwrite it: choose another file")


# -- next ------------------------------------------------------------------------------------------
def run_next(args: argparse.Namespace) -> int:
    """``han-label next``: score the pool, choose, write the tasks (atomically); 0 on success."""
    from labeling import pool as pools

    out = Path(args.out)
    _check_out(out, OUTPUTS, "--out")
    inputs = [] if args.source.startswith("log:") else [("the pool", args.source)]
    _not_an_input(out, "--out", [*inputs, *(("a --labelled file", p) for p in args.labelled)])
    scorers = pools.Scorers((pools.default_workers() if args.workers is None else args.workers) - 1)
    try:
        _next(args, out, scorers)
    except BaseException:
        scorers.close(abandon=True)
        raise
    scorers.close()
    return 0


def _next(args: argparse.Namespace, out: Path, scorers: Any) -> None:
    import numpy as np

    from labeling import pool as pools
    from labeling.strategies import choose

    from_log = args.source.startswith("log:")
    model_dir, tag, saved = _model(args.model or (f"{args.source[4:]}:production" if from_log else None))
    try:
        pool = _open(args)
        left_out_ids, left_out_hashes = pools.labelled_keys(pool)
        for path in args.labelled:
            ids, hashes = _labelled_file(path, args.text_column)
            left_out_ids |= ids
            left_out_hashes |= hashes
    except pools.PoolError as e:
        raise LabelError(str(e)) from None
    ready = _Prepared()
    rows, copies = _unlabelled_rows(pool, left_out_ids, left_out_hashes)
    if copies:
        print(f"han-label: {pool.name}: {copies:,} rows repeat an earlier row's text: left out (each text is "
              "chosen once)", file=sys.stderr)
    if len(pool) == 0:
        raise LabelError(f"{pool.name}: the pool is empty (no rows)")
    if len(rows) == 0:
        raise LabelError(f"{pool.name}: all {len(pool):,} of its documents are labelled already: nothing to choose")
    if len(rows) < args.n:
        raise LabelError(f"{pool.name}: {len(rows):,} unlabelled documents, fewer than --n {args.n:,}")
    if len(rows) <= pools.WINDOW:
        scorers.close(abandon=True)  # one window: this process scores it
    progress = _progress(args.quiet)
    with progress:
        bar = progress.add_task("scoring the pool", total=len(rows))
        try:
            probs, vectors, bad = pools.score(pool, model_dir, rows, scorers, lambda n: progress.advance(bar, n))
        except pools.PoolError as e:
            raise LabelError(f"{pool.name}: {e}") from None
    scorers.close(abandon=True)  # their work is done: stopped at once, not after torch's slow teardown
    bad_rows = {row for row, _ in bad}
    for row, reason in bad[:10]:
        print(f"han-label: {pool.name}: row {row} ({_doc_id(pool, row)}): left out: {reason}", file=sys.stderr)
    if len(bad) > 10:
        print(f"han-label: {pool.name}: {len(bad) - 10:,} more rows left out for the same reasons", file=sys.stderr)
    good = np.array([k for k, row in enumerate(rows) if int(row) not in bad_rows], dtype=np.int64)
    if len(good) < args.n:
        raise LabelError(f"{pool.name}: {len(good):,} documents that can be classified, fewer than --n {args.n:,}")
    multi = saved.config.multi_label
    ready.join()
    held = round(args.n * args.holdout)
    picked = choose(args.strategy, args.n - held, probs[good].astype(np.float64), vectors[good].astype(np.float32),
                    seed=args.seed, multi_label=multi, threshold=saved.threshold)
    if held:  # drawn at random from the rest: a validation split as the pool is, not as the strategy chose
        rest = np.setdiff1d(np.arange(len(good)), picked)
        picked = np.concatenate([picked, np.sort(np.random.default_rng(args.seed).choice(rest, held, replace=False))])
    chosen_rows = rows[good[picked]]
    results = pools.explain(pool, model_dir, chosen_rows, TOP_SENTENCES)
    records = _records(results, pool, chosen_rows, probs[good[picked]], saved, tag, args.strategy,
                       validation=set(range(args.n - held, args.n)))
    write_next(out, records, saved.labels, multi)
    print(f"han-label: {len(records):,} of {len(rows):,} unlabelled documents chosen ({args.strategy}) -> {out}"
          + (f" and {config_path(out)}" if out.suffix.lower() == ".json" else ""), file=sys.stderr)


def _open(args: argparse.Namespace) -> Any:
    from labeling import pool as pools

    if args.source.startswith("log:"):
        from registry.loop_commands import store_url

        return pools.open_log(args.source[4:], _since(args.since), store_url(args))
    if args.since or args.store:
        raise LabelError("--since and --store read the inference log only (SOURCE log:NAME)")
    return pools.open_file(args.source, args.text_column, args.id_column, None)


def _since(value: str | None) -> Any:
    if not value:
        return None
    from registry.loop_commands import CommandError, parse_time

    try:
        return parse_time(value, "--since")
    except CommandError as e:
        raise LabelError(str(e)) from None


def _labelled_file(path: str, text_column: str) -> tuple[set[str], set[str]]:
    from labeling import pool as pools

    if Path(path).is_file() and Path(path).stat().st_size == 0:  # nothing labelled yet (not "the pool is empty")
        return set(), set()
    labelled = pools.open_file(path, text_column, None, None, text_fallback="text")  # han-label import's column
    ids, hashes = set(), set()
    for batch in labelled.table.iter(batch_size=pools.WINDOW):
        ids.update(d for d in batch["id"] if d and not d.startswith("row-"))
        hashes.update(pools.text_hash(t) for t in batch["text"] if isinstance(t, str))
    return ids, hashes


def _unlabelled_rows(pool: Any, ids: set[str], hashes: set[str]) -> tuple[Any, int]:
    """The pool's rows to choose from: not labelled (by id or text), and each text once (a copy would take
    a second place in the queue for one document); and how many copies were left out."""
    import numpy as np

    from labeling.pool import WINDOW, text_hash

    keep, seen, copies = [], set(), 0
    named: dict[str, tuple[int, str | None]] = {}  # each id's first row and its text's hash
    for start in range(0, len(pool), WINDOW):
        batch = pool.table[start: start + WINDOW]
        for k, (doc, text) in enumerate(zip(batch["id"], batch["text"], strict=True)):
            digest = text_hash(text) if isinstance(text, str) else None
            _one_text_per_id(pool, named, doc, start + k, digest)
            if doc in ids or digest in hashes:
                continue
            if digest is not None and digest in seen:
                copies += 1
                continue
            seen.add(digest)
            keep.append(start + k)
    return np.array(keep, dtype=np.int64), copies


def _one_text_per_id(pool: Any, named: dict[str, tuple[int, str | None]], doc: Any, row: int,
                     digest: str | None) -> None:
    """Refuse an id that names two different texts: the tasks, the imported labels and ``--labelled`` know
    a document by its id, and would take one for the other. An id on the same text again is that
    document once more (a copy, chosen once); a row without an id (a log's hashed documents) names none."""
    if doc is None or doc == "":
        return
    first = named.setdefault(doc, (row, digest))
    if first[1] != digest:
        raise LabelError(f"{pool.name}: id {doc!r} names two different texts (rows {first[0]} and {row}): "
                         "each id must name one document (see --id-column; without an id column, ids are row-N)")


def _doc_id(pool: Any, row: int) -> str:
    return str(pool.table[int(row)]["id"])


def _progress(quiet: bool) -> Any:
    from scoring.progress import make_progress

    return make_progress(quiet or not sys.stderr.isatty())


class _Prepared(threading.Thread):
    """small-text's imports (sklearn: seconds), made in a thread while the workers score the pool."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.start()

    def run(self) -> None:
        import small_text.query_strategies  # noqa: F401


def _records(results: list[Any], pool: Any, rows: Any, probs: Any, saved: Any, tag: str, strategy: str,
             validation: set[int]) -> list[dict[str, Any]]:
    """The chosen documents with the model's label(s), scores and top sentences, the least certain first;
    those at ``validation`` (positions in ``rows``) marked ``split: validation``."""
    from labeling.strategies import margins

    chosen = pool.table.select(rows.tolist())
    certainty = margins(probs, saved.config.multi_label, saved.threshold)
    order = sorted(range(len(results)), key=lambda k: (float(certainty[k]), k))
    return [{"id": chosen[k]["id"], "text": chosen[k]["text"], "label": results[k].label, "labels": results[k].labels,
             "scores": results[k].scores, "margin": round(float(certainty[k]), 6), "model_version": tag,
             "strategy": "random" if k in validation else strategy,
             **({"split": "validation"} if k in validation else {}),
             "top_sentences": [{"text": s.text, "start": s.start, "end": s.end, "weight": s.weight}
                               for s in results[k].top_sentences or []]} for k in order]


# -- import ----------------------------------------------------------------------------------------
def run_import(args: argparse.Namespace) -> int:
    from labeling.label_studio import ExportError, read_export

    out = Path(args.out)
    _check_out(out, IMPORT_OUTPUTS, "OUT")
    _not_an_input(out, "OUT", [("the export", args.export)])
    _, _, saved = _model(args.model)
    # composed (NFC), as the export's labels are read: a model trained before fits read them so may hold others
    labels, multi = [unicodedata.normalize("NFC", label) for label in saved.labels], saved.config.multi_label
    export = Path(args.export)
    try:
        got = read_export(export, labels, multi)
    except ExportError as e:
        raise LabelError(str(e)) from None
    if got.seen_labels and not got.seen_labels & set(labels):
        raise LabelError(f"{export}: its labels ({', '.join(sorted(got.seen_labels))}) are none of the model's "
                         f"({', '.join(labels)}): an export of another project?")
    for p in got.problems + got.notices:
        print(f"han-label: {export}: {p.where}: {p.what}", file=sys.stderr)
    if got.recomposed:
        print(f"han-label: {export}: {got.recomposed:,} annotations' labels are written in another Unicode form "
              "(decomposed, as macOS writes): imported in the composed form (NFC), as han-train reads labels",
              file=sys.stderr)
    if not got.rows:
        raise LabelError(f"{export}: no annotated task to import ({len(got.problems)} left out, listed above)")
    if multi and out.suffix.lower() == ".csv":
        raise LabelError(f"OUT {out}: a multi-label model's labels need .jsonl or .parquet, not CSV")
    write_rows(out, got.rows)
    print(f"han-label: {len(got.rows):,} labelled documents -> {out}"
          + (f"; {len(got.problems):,} tasks left out (listed above)" if got.problems else "")
          + (f"; {len(got.notices):,} tasks share a document id with another text (listed above)"
             if got.notices else ""), file=sys.stderr)
    return 0


if __name__ == "__main__":
    command()
