"""``han-model monitor`` and ``han-model export-log``: the inference log and the feedback, read back.

    han-model monitor han-imdb --since 24h          # each version that served: estimate, feedback, shift
    han-model export-log han-imdb labelled.jsonl --labelled-only    # for han-train fit --data.train

Both read the model store's folder only (the log and, by default, the SQLite feedback store beside
the production pointer; ``$HAN_FEEDBACK_STORE`` or ``--store`` names another), so they run wherever
the store is mounted, with no service running.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Collection, Iterable, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from model_store.production import deployment_dir, noted_feedback_store, split_tag
from monitoring.log_files import log_folder, read_log
from monitoring.profiles import model_facts, why_no_profile

FEEDBACK_STORE_ENV = "HAN_FEEDBACK_STORE"
_SPAN = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
_NOT_REPORTED = ("text", "text_sha256")  # the monitor holds the window's records: without their text


class CommandError(ValueError):
    """A bad argument or an unreadable input: one line for the user."""


def add_arguments(commands: Any) -> None:
    """The two sub-commands, on han-model's sub-parsers."""
    monitor = commands.add_parser("monitor", help="the model in production: accuracy estimated and realised, shift")
    monitor.add_argument("name", help="the model name, e.g. han-imdb")
    _window(monitor)
    monitor.add_argument("--json", metavar="FILE", help="also write the report (with its series over time) as JSON")
    export = commands.add_parser("export-log", help="the logged documents with their feedback, for han-train")
    export.add_argument("name", help="the model name, e.g. han-imdb")
    export.add_argument("out", help="the file to write: .jsonl, .csv or .parquet")
    export.add_argument("--labelled-only", action="store_true", help="only documents with feedback (--data.train)")
    export.add_argument("--overwrite", action="store_true", help="replace OUT if it exists (else refused)")
    export.add_argument(
        "--role",
        default="production",
        choices=["production", "shadow", "all"],
        help="whose answers to export (default: production)",
    )
    _window(export)


def _window(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--since", help="a span back from now (30m, 24h, 7d) or an ISO time (default: all)")
    parser.add_argument("--until", help="an ISO time or a span back from now (default: now)")
    parser.add_argument(
        "--store",
        help=f"the feedback store: a SQLite file or postgresql:// URL "
        f"(default: ${FEEDBACK_STORE_ENV}, else the one beside the production pointer)",
    )


def parse_time(value: str | None, option: str) -> datetime | None:
    """``--since``/``--until``: a span back from now, or an ISO date or time (UTC unless it says)."""
    if not value:
        return None
    if match := _SPAN.match(value.strip()):
        try:
            return datetime.now(UTC) - timedelta(**{_UNITS[match[2]]: float(match[1])})
        except OverflowError:  # before year 1, or more days than a timedelta holds
            raise CommandError(f"{option}: {value!r} reaches back before the year 1; leave {option} out to read "
                               "everything") from None
    try:
        when = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise CommandError(f"{option}: {value!r} is neither a span (30m, 24h, 7d) nor an ISO time") from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def store_url(args: argparse.Namespace) -> str | None:
    return args.store or os.environ.get(FEEDBACK_STORE_ENV, "").strip() or None


def default_store(name: str) -> Path:
    return deployment_dir(name) / "feedback.sqlite3"


def feedback_map(name: str, url: str | None, since: datetime | None,
                 until: datetime | None) -> dict[tuple[str, str], list[str]]:
    """(id, request_id) of each answer made in the window that a feedback judged -> its true labels: a reused
    id's other answers have none (monitoring.feedback_store's ``joined``)."""
    from monitoring.feedback_store import open_store

    path = default_store(name)
    if url is None and (noted := noted_feedback_store(name)):
        raise CommandError(f"the service records {name}'s feedback in {noted[0]} ({noted[1]}), not in {path}: "
                           f"pass --store URL or set {FEEDBACK_STORE_ENV}")
    if url is None and not path.exists():
        return {}
    with open_store(url, path, existing=True) as store:  # read as it streams: never every row at once
        return {(row.id, row.request_id): row.feedback
                for row in store.joined(since=since, until=until, labelled_only=True) if row.feedback is not None}


def logged(
    name: str,
    since: datetime | None,
    until: datetime | None,
    roles: Iterable[str] | None = None,
    drop: Collection[str] = (),
) -> Iterator[dict[str, Any]]:
    """``read_log`` of a name's log, in time order; a file that cannot be read is one line for the user."""
    folder = log_folder(name)
    try:
        yield from read_log(folder, since, until, roles, drop=drop)
    except OSError as e:
        raise CommandError(f"{folder}: cannot read the inference log ({e.strerror or e})") from None


def monitor(args: argparse.Namespace) -> int:
    """Streams the window: a few numbers a document are kept (``monitoring.estimates``), never the records."""
    from monitoring.estimates import Window

    name = split_tag(args.name)[0]
    since, until = parse_time(args.since, "--since"), parse_time(args.until, "--until")
    records = logged(name, since, until, drop=_NOT_REPORTED)
    first = next(records, None)
    if first is None:
        window = f" since {since.astimezone(UTC):%Y-%m-%d %H:%M} UTC" if since else ""
        print(f"{name}: no logged request{window} (the log is {log_folder(name)})")
        return 0
    feedback = feedback_map(name, store_url(args), since, until)
    read = Window(feedback, model_facts)
    read.add(first)
    read.add_all(records)
    reports = read.reports(with_series=bool(args.json))
    for entry in reports:
        print(format_entry(entry, read.facts.get(entry["model"])))
    if args.json:
        Path(args.json).write_text(json.dumps({"name": name, "versions": reports}, indent=2) + "\n", encoding="utf-8")
    return 0


def format_entry(entry: dict[str, Any], facts: tuple[Any, ...] | None) -> str:
    """One version's report as a few readable lines."""
    fb, shift = entry["feedback"], entry["shift"]
    lines = [
        f"{entry['model']} ({entry['role']}): {entry['documents']:,} documents, "
        f"{entry['first']} to {entry['last']}",
        "  predicted: " + ", ".join(f"{label} {share:.1%}" for label, share in entry["predicted"].items()),
        f"  estimated accuracy (from the scores, before labels{'' if facts else '; no profile to correct them'}): "
        f"{entry['estimated_accuracy']:.4f}",
    ]
    if fb["documents"]:
        low, high = fb["interval"]
        lines.append(
            f"  realised accuracy on {fb['documents']:,} with feedback: {fb['accuracy']:.4f} "
            f"[{low:.4f}, {high:.4f}]; estimated on the same: {fb['estimated_on_them']:.4f} "
            f"(error {fb['estimated_on_them'] - fb['accuracy']:+.4f})"
        )
    else:
        lines.append("  realised accuracy: no feedback yet")
    if facts is None or facts[0] is None:
        lines.append(f"  input shift: not tested ({why_no_profile(entry['model'])})")
        return "\n".join(lines)
    parts = []
    for key, what in (("words", "length"), ("oov", "out-of-vocabulary share")):
        test = shift.get(key)
        if test:
            parts.append(
                f"{what} median {test['median']:g} against {test['reference_median']:g} "
                f"(KS {test['statistic']:.3f}, p {test['p_value']:.3g})"
                f"{' SHIFTED' if test['flagged'] else ''}"
            )
    if test := shift.get("predicted"):
        parts.append(
            f"predicted labels (distance {test['distance']:.3f}, p {test['p_value']:.3g})"
            f"{' SHIFTED' if test['flagged'] else ''}"
        )
    verdict = "SHIFTED beyond noise" if shift["flagged"] else "no shift beyond noise"
    lines.append(f"  input shift against the training profile: {verdict}")
    lines.extend(f"    {part}" for part in parts)
    return "\n".join(lines)


def export_log(args: argparse.Namespace) -> int:
    """Each logged id once (its last answer) with its feedback: ``label`` for a single-label model,
    ``labels`` (a list) for a multi-label one, decided once for the model, never row by row (han-train
    reads one label column of one type). An unlabelled row's label is null: ``--data.unlabeled`` reads
    the text alone, and ``--data.train`` names the row should one slip in. The log is read twice, never
    held: first a few numbers a record to choose each id's row, then again to write the chosen rows."""
    name = split_tag(args.name)[0]
    out = Path(args.out)
    if out.suffix not in (".jsonl", ".csv", ".parquet"):
        raise CommandError(f"{out}: the output must end in .jsonl, .csv or .parquet")
    if out.exists() and not args.overwrite:  # a labelled file from an earlier round, say: never replaced unasked
        raise CommandError(f"{out} already exists; pass --overwrite to replace it")
    since, until = parse_time(args.since, "--since"), parse_time(args.until, "--until")
    roles = None if args.role == "all" else {args.role}
    from monitoring.estimates import ExportChoice  # numpy: imported when needed, not at every han-model start

    feedback = feedback_map(name, store_url(args), since, until)
    choice = ExportChoice(feedback, roles, args.labelled_only)
    for record in logged(name, since, until):  # every role: whether a judged answer is still in the log
        choice.see(record)
    chosen = choice.choose()
    lacking, gone = choice.lacking(), choice.gone()
    what = " with feedback" if args.labelled_only else ""
    if not chosen.rows and lacking:
        raise CommandError(f"{log_folder(name)}: no logged document{what} in the window has its text ({lacking:,} "
                           "were logged without it, HAN_LOG_TEXT=0): there is nothing to train on")
    if not chosen.rows:
        lost = f" ({gone:,} with feedback whose log lines the log's size cap deleted)" if gone else ""
        raise CommandError(f"{name}: no logged document{what} in the window{lost}; nothing written")
    multi = multi_label_task(name, chosen.chosen_tags, choice.per_label)
    if multi and out.suffix == ".csv":
        raise CommandError(f"{out}: {name} is multi-label, and a CSV cell cannot hold a list of labels that "
                           "han-train reads: write .jsonl or .parquet")
    label_sets: dict[tuple[str, ...], list[str]] = {}  # a relabelled model's versions: said, not hidden
    for tag in sorted(chosen.chosen_tags):
        if (facts := model_facts(tag)) is not None:
            label_sets.setdefault(tuple(facts[1]), []).append(tag)
    if len(label_sets) > 1:
        sets = "; ".join(f"{', '.join(tags)}: {', '.join(labels)}" for labels, tags in label_sets.items())
        print(f"note: the window's versions have different labels ({sets}); the file holds them all "
              "(--since/--until export one set)", file=sys.stderr)
    labelled = 0

    def rows() -> Iterator[dict[str, Any]]:
        nonlocal labelled
        for record in chosen.rows_of(logged(name, since, until, roles)):
            truth = feedback.get((record["id"], record.get("request_id")))
            labelled += truth is not None
            yield export_row(record["id"], record, truth, multi)

    written = _write(rows(), out, multi)
    missing = chosen.rows - written  # deleted by the log's cap between the two reads
    if not written:
        raise CommandError(f"{log_folder(name)}: the log's files were deleted while they were read (its size cap?); "
                           "nothing written")
    print(f"wrote {written:,} documents ({labelled:,} with feedback) to {out}; label column: "
          f"{'labels' if multi else 'label'}")
    if lacking:
        print(f"left out {lacking:,} logged documents{what} whose text was not logged (HAN_LOG_TEXT=0)",
              file=sys.stderr)
    if gone:
        print(f"left out {gone:,} documents with feedback whose log lines are gone (the log's size cap deleted them "
              "before the export): their text cannot be exported", file=sys.stderr)
    if missing:
        print(f"left out {missing:,} documents whose log file the size cap deleted while the export read it",
              file=sys.stderr)
    return 0


def multi_label_task(name: str, tags: Collection[str], per_label: Mapping[str, bool]) -> bool:
    """Whether the exported versions are multi-label: each version's config where the store still has it,
    else what its logged answers show (``per_label``). Versions of both kinds cannot share one file."""
    kinds = {}
    for tag in sorted(tags):
        facts = model_facts(tag)
        kinds[tag] = facts[2] if facts is not None else per_label.get(tag, False)
    if len(set(kinds.values())) > 1:
        multi = ", ".join(tag for tag, kind in kinds.items() if kind)
        raise CommandError(f"{name}: the window holds single-label and multi-label versions ({multi} multi-label); "
                           "export each apart with --since/--until")
    return any(kinds.values())


def export_row(doc_id: str, record: Mapping[str, Any], truth: list[str] | None, multi: bool) -> dict[str, Any]:
    """One exported document; its label is null without feedback."""
    if multi:
        label: dict[str, Any] = {"labels": None if truth is None else list(truth)}
        predicted = list(record.get("labels") or [])
    else:
        label, predicted = {"label": truth[0] if truth else None}, record["label"]
    return {"id": doc_id, "text": record["text"], **label, "predicted": predicted, "model": record["model"],
            "time": record["time"]}


def _write(rows: Iterable[dict[str, Any]], out: Path, multi: bool) -> int:
    """Written beside ``out`` as the rows come (a chunk at a time for CSV and Parquet) and moved into place:
    never half a file. Returns the rows written."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    written = 0
    try:
        if out.suffix == ".jsonl":
            with tmp.open("w", encoding="utf-8") as f:
                for row in rows:
                    f.write(json.dumps(row, ensure_ascii=False) + "\n")
                    written += 1
        else:
            import pandas as pd

            writer = None
            with tmp.open("wb") as f:
                for chunk in _chunks(rows, 20_000):
                    frame = pd.DataFrame(chunk)
                    if out.suffix == ".csv":
                        frame.to_csv(f, index=False, header=written == 0)
                    else:
                        import pyarrow as pa
                        import pyarrow.parquet as pq

                        table = pa.Table.from_pandas(frame, schema=_schema(multi), preserve_index=False)
                        writer = writer or pq.ParquetWriter(f, table.schema)
                        writer.write_table(table)
                    written += len(chunk)
                if writer is not None:
                    writer.close()
        if written:
            os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return written


def _chunks(rows: Iterable[dict[str, Any]], size: int) -> Iterator[list[dict[str, Any]]]:
    chunk: list[dict[str, Any]] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _schema(multi: bool) -> Any:
    """The exported Parquet columns, fixed: a chunk of unlabelled rows must not make the label column null."""
    import pyarrow as pa

    text, labels = pa.string(), pa.list_(pa.string())
    label = [("labels", labels), ("predicted", labels)] if multi else [("label", text), ("predicted", text)]
    return pa.schema([("id", text), ("text", text), *label, ("model", text), ("time", text)])
