"""``han-model``: compare a retrained model with the one in production, promote it, roll it back.

    han-model compare han-imdb:NEW han-imdb:production --data ../shared/datasets/imdb/test.parquet
    han-model promote han-imdb:NEW                 # refused if worse than production beyond the noise
    han-model rollback han-imdb                    # back to the version before
    han-model status han-imdb                      # the production version, its history, the servers
    han-model monitor han-imdb --since 24h         # accuracy estimated and on feedback, input shift
    han-model export-log han-imdb feedback.jsonl --labelled-only    # the log with its feedback, for han-train
    han-model shadow han-imdb:NEW --fraction 0.2   # a challenger on live traffic, into the log only

A name's first registered version is its production version; a later fit is served only once promoted.
Services started with ``HAN_MODEL_TAG=NAME`` (or ``NAME:production``, the default for han-imdb) and
sharing the model store follow the pointer within seconds; ``promote`` and ``rollback`` wait until
every running one serves the new version, and put the pointer back if one cannot load it or they are
interrupted first (Ctrl-C: exit 130; SIGTERM: 143). Nothing
here is reachable over HTTP: whoever may change the served model needs the model store.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from han.environment import apply_defaults
from model_store import ModelNotFoundError, adopt_production, production_version, resolve_tag
from model_store.production import (
    PromotionError,
    deployment_dir,
    live_replicas,
    locked,
    read_pointer,
    record_decision,
    rollback_target,
    split_tag,
    write_json,
)
from monitoring.feedback_store import StoreError
from registry.loop_commands import CommandError
from registry.moves import Interrupted, move, wait_seconds

WAIT_SECONDS = 60.0
LoopErrors = (CommandError, StoreError)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="han-model", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    compare = commands.add_parser("compare", help="both models on the same labelled documents")
    compare.add_argument("new", help="the challenger: a tag (NAME:VERSION) or a model directory")
    compare.add_argument("old", help="the champion, e.g. NAME:production")
    _data_arguments(compare, required=False)
    compare.add_argument("--shadow", action="store_true",
                         help="instead of --data: the challenger's shadow answers in the log, against production's "
                         "on the same live documents (agreement, and accuracy on their feedback)")
    compare.add_argument("--since", help="with --shadow: a span back from now (24h, 7d) or an ISO time")
    compare.add_argument("--until", help="with --shadow: an ISO time or a span back from now (default: now)")
    compare.add_argument("--store", help="with --shadow: the feedback store (default: $HAN_FEEDBACK_STORE, else "
                         "the one beside the production pointer)")
    compare.add_argument("--json", metavar="FILE", help="also write the comparison as JSON")

    promote = commands.add_parser("promote", help="make a version the one in production")
    promote.add_argument("tag", help="NAME:VERSION (or NAME:latest)")
    _data_arguments(promote, required=False)
    promote.add_argument("--force", action="store_true",
                         help="promote without a comparison, or although it is worse beyond the noise")
    promote.add_argument("--wait", type=wait_seconds, default=WAIT_SECONDS, metavar="SECONDS",
                         help=f"how long to wait for the running services to follow (default {WAIT_SECONDS:g})")

    rollback = commands.add_parser("rollback", help="put the previous production version back")
    rollback.add_argument("name", help="the model name, e.g. han-imdb")
    rollback.add_argument("--wait", type=wait_seconds, default=WAIT_SECONDS, metavar="SECONDS")

    status = commands.add_parser("status", help="the production version, its history and the services")
    status.add_argument("name")

    from registry import loop_commands as loop
    from registry import shadow_commands  # the way back: the log, feedback, shadow

    loop.add_arguments(commands)
    shadow_commands.add_arguments(commands)
    args = parser.parse_args(argv)
    for field in ("name", "tag", "new", "old"):  # '' would resolve to the default model and act on it
        value = getattr(args, field, None)
        if value is not None and not split_tag(value)[0].strip():
            parser.error(f"{field}: {value!r} names no model (a name like han-imdb, or NAME:VERSION)")
    if args.command == "compare" and bool(args.data) == bool(args.shadow):
        parser.error("compare takes labelled documents (--data FILE) or the shadow log (--shadow), one of them")
    return args


def _data_arguments(parser: argparse.ArgumentParser, required: bool) -> None:
    parser.add_argument("--data", required=required, metavar="FILE",
                        help="labelled documents (Parquet, CSV or JSON Lines)" + ("" if required else
                        ": compare with the production version on them first"))
    parser.add_argument("--text-column", default=None, help="the text column (default: text)")
    parser.add_argument("--label-column", default=None, help="the label column (default: label, or labels)")
    parser.add_argument("--limit", type=int, default=None, help="compare on a seeded sample of this many rows")


def comparison_path(new: str, old: str) -> Path:
    name, new_version = split_tag(new)
    return deployment_dir(name) / "comparisons" / f"{new_version}-vs-{split_tag(old)[1]}.json"


def run_compare(new: str, old: str, args: argparse.Namespace) -> dict[str, Any]:
    if getattr(args, "shadow", False):
        from registry.shadow_commands import format_shadow, shadow_comparison

        result = shadow_comparison(new, old, args)
        print(format_shadow(result), flush=True)
        if "verdict" not in result:  # no feedback yet: nothing promote could rest on
            return result
    else:
        from training.compare import compare, format_comparison

        result = compare(new, old, args.data, text_column=args.text_column, label_column=args.label_column,
                         limit=args.limit)
        print(format_comparison(result), flush=True)
    tags = [_store_tag(ref) for ref in (new, old)]
    if all(tags) and split_tag(tags[0])[0] == split_tag(tags[1])[0]:  # kept where promote looks for it
        path = comparison_path(*tags)
        kept = _refusal_kept(path, result)
        if kept is not None:
            print(f"the gate keeps the refusal on {kept:,} documents: this comparison, on "
                  f"{result.get('documents') or 0:,}, is smaller (compare on at least as many, or promote with "
                  "--force)", flush=True)
            return result
        write_json(path, result)  # whole or not at all: promote may read it meanwhile
    return result


def _refusal_kept(path: Path, result: dict[str, Any]) -> int | None:
    """The documents of a stored "worse" verdict that ``result`` is too small to replace: a refusal stands
    until a comparison on at least as many documents says otherwise (a compare on 3 documents said "no
    clear difference" and let a refused challenger through). None: ``result`` may be stored."""
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(stored, dict) or stored.get("verdict") != "worse" or result.get("verdict") == "worse":
        return None
    before = int(stored.get("documents") or 0)
    return before if int(result.get("documents") or 0) < before else None


def _store_tag(ref: str) -> str | None:
    if Path(ref).is_dir():
        return None
    try:
        return resolve_tag(ref)
    except ModelNotFoundError:
        return None


def stored_comparison(new: str, old: str) -> dict[str, Any] | None:
    """A comparison of ``new`` with ``old``: from ``han-model compare``, else from the fit
    (``--export.compare_with``, kept in the model's metadata)."""
    path = comparison_path(new, old)
    if path.is_file():
        try:
            found = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise PromotionError(f"{path}: unreadable comparison ({e}); run `han-model compare {new} {old}` "
                                 "again") from None
        if not isinstance(found, dict):
            raise PromotionError(f"{path}: not a comparison; run `han-model compare {new} {old}` again")
        return found
    from model_store import load_metadata

    found = load_metadata(new).get("comparison")
    if isinstance(found, dict) and old in (found.get("old_tag"), found.get("old")):
        return found
    return None


# Below this many documents a comparison's "no clear difference" says little: on 100 documents a model 5
# points worse is told apart about one time in four, on 200 about one in two (McNemar, 10% of answers changed).
FEW_DOCUMENTS = 200


def promote(args: argparse.Namespace) -> int:
    tag = resolve_tag(args.tag)
    name, _ = split_tag(tag)
    with locked(name):
        current = adopt_production(name)  # a store from before registration wrote the pointer: its first version
        if current is None:  # the store lists no version of the name, though the tag resolved
            raise PromotionError(f"no version of {name} is listed in the model store")
        if current == tag:
            print(f"{tag} is already in production")
            return 0
        details: dict[str, Any] = {"forced": bool(args.force)}
        if args.data:  # stored where the gate reads it, unless a refusal on more documents stands
            run_compare(tag, current, args)
        comparison = stored_comparison(tag, current)
        if comparison is None and not args.force and (gone := _not_stored(current)):
            raise PromotionError(
                f"{current}, the version in production, is no longer in the model store ({gone}), so nothing can "
                f"be compared with it: `han-model rollback {name}` serves the version before it, or --force "
                f"promotes {tag}")
        if comparison is None and not args.force:
            raise PromotionError(
                f"{tag} has not been compared with {current}, the version in production: run "
                f"`han-model compare {tag} {current} --data FILE`, or promote with --data FILE (or --force)")
        if comparison is not None:
            details["comparison"] = _summary(comparison)
            if comparison.get("verdict") == "worse" and not args.force:  # training.compare.worse_beyond_noise
                record_decision(name, {"tag": tag, "production": current, **details, "decision": "refused"})
                raise PromotionError(
                    f"refused: {tag} is worse than {current} beyond the noise on "
                    f"{comparison.get('data') or 'its comparison'} ({_figures(comparison)}); "
                    "--force promotes it anyway")
        if comparison is not None and (documents := int(comparison.get("documents") or 0)) < FEW_DOCUMENTS:
            print(f"warning: the comparison with {current} rests on {documents:,} document(s) "
                  f"({comparison.get('data') or 'its data'}): too few to tell a worse model from an equal one unless "
                  f"it is far worse; `han-model promote {tag} --data FILE` compares on a labelled file of more",
                  file=sys.stderr)
        # on the record once the pointer has moved (forced without a comparison: there all the same)
        promoted = {"tag": tag, "production": current, "comparison": None, **details, "decision": "promoted"}
        moved = move(name, tag, "promote", details, args.wait, "promoted", promoted)
        _end_shadow_of(name, tag)
        return moved


def rollback(args: argparse.Namespace) -> int:
    name = split_tag(args.name)[0]
    with locked(name):
        adopt_production(name)  # so that a store from before registration wrote the pointer has a history
        return move(name, rollback_target(name), "rollback", {}, args.wait, "rolled back to")


def status(args: argparse.Namespace) -> int:
    from model_store.upgrade import served_before
    from model_store.versions import warn_damaged
    from monitoring.shadow import read_shadow

    name = split_tag(args.name)[0]
    warn_damaged(name)
    record = read_pointer(name)
    healthy = True  # status 1 where the pointer or the shadow names a version no longer stored
    if record is None:
        first = production_version(name)
        if first is None and not read_shadow(name) and not live_replicas(name):
            raise ModelNotFoundError(f"{name}: no version in the model store, and no service follows the name "
                                     "(`bentoml models list` shows the names there)")
        print(f"{name}: production is {first} (its first registered version; no pointer written yet)" if first
              else f"{name}: no version in the model store")
        if first and (note := served_before(name)):
            print(f"  {note}")
    else:
        print(f"{name}: production is {record['tag']}")
        if gone := _not_stored(record["tag"]):
            print(f"  {record['tag']} is not in the model store ({gone}): no service can start on it and han-score "
                  f"cannot read it; `han-model rollback {name}` or `han-model promote {name}:VERSION` mends it")
            healthy = False
        for entry in record.get("history", [])[-10:]:
            extra = " (forced)" if entry.get("forced") else ""
            print(f"  {entry['at']}  {entry['action']:<8} {entry['tag']}{extra}")
    if asked := read_shadow(name):
        print(f"  shadow: {asked['tag']} with {asked['fraction']:.0%} of documents since {asked.get('since')}")
        if gone := _not_stored(asked["tag"]):
            print(f"  the shadow {asked['tag']} is not in the model store ({gone}): `han-model shadow {name} --stop` "
                  "ends it")
            healthy = False
    for key, report in live_replicas(name).items():
        failed = f"; could not load {report['failed']['tag']}" if report.get("failed") else ""
        loading = f"; loading {report['loading']}" if report.get("loading") else ""
        shadow = report.get("shadow") or {}
        shadowing = (f"; shadow {shadow['tag']} ({shadow.get('answered', 0):,} answered, "
                     f"{shadow.get('dropped', 0):,} dropped)" if shadow.get("tag") else "")
        if (shadow.get("failed") or {}).get("tag"):
            shadowing += f"; cannot shadow {shadow['failed']['tag']} ({shadow['failed']['reason']})"
        pinned = " (pinned: started on that version, it does not follow the pointer)" if report.get("pinned") else ""
        print(f"  service {key}: serving {report['serving']}{pinned}{loading}{failed}{shadowing}")
    return 0 if healthy else 1


def _end_shadow_of(name: str, tag: str) -> None:
    """Production shadowing itself doubles the log for nothing: the shadow of the version now promoted ends."""
    from monitoring.shadow import read_shadow, stop_shadow

    if (read_pointer(name) or {}).get("tag") == tag and (read_shadow(name) or {}).get("tag") == tag:
        stop_shadow(name)
        print(f"{name}: the shadow of {tag} ended (it is production now)")


def _not_stored(tag: str) -> str | None:
    """Why the store cannot give ``tag`` (deleted by `bentoml models delete`, or not whole), or None."""
    try:
        resolve_tag(tag)
    except ModelNotFoundError as e:
        return str(e)
    return None


def _summary(comparison: dict[str, Any]) -> dict[str, Any]:
    keys = ("data", "documents", "metric", "new_score", "old_score", "difference", "interval", "p_value", "verdict")
    return {key: comparison.get(key) for key in keys}


def _figures(c: dict[str, Any]) -> str:
    """The comparison's figures in a few words; those a comparison lacks (one kept by an older version) left out."""
    parts = []
    if c.get("new_score") is not None and c.get("old_score") is not None:
        parts.append(f"{c.get('metric', 'score')} {c['new_score']:.4f} against {c['old_score']:.4f}")
    if c.get("difference") is not None:
        parts.append(f"difference {c['difference']:+.4f}")
    if c.get("interval"):
        low, high = c["interval"]
        parts.append(f"95% interval [{low:+.4f}, {high:+.4f}]")
    if c.get("p_value") is not None:
        parts.append(f"{c.get('test', 'p')} p = {c['p_value']:.3g}")
    return ", ".join(parts) or "no figures kept"


def write_whole(path: Path, text: str) -> None:
    """``text`` into ``path`` through a temporary file beside it, renamed over it when complete: a full disk
    or an interruption leaves the file as it was (or absent), never empty or half-written."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("w", encoding="utf-8") as out:
            out.write(text)
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise OSError(f"{path}: not written ({e.strerror or e})") from None
        raise


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    apply_defaults()
    try:
        if args.command == "compare":
            result = run_compare(args.new, args.old, args)
            if args.json:
                write_whole(Path(args.json), json.dumps(result, indent=2) + "\n")
            return 0
        from registry import loop_commands as loop
        from registry import shadow_commands

        return {"promote": promote, "rollback": rollback, "status": status, "monitor": loop.monitor,
                "export-log": loop.export_log, "shadow": shadow_commands.shadow}[args.command](args)
    except (PromotionError, ModelNotFoundError) as e:
        print(f"error: {e.args[0] if e.args else e}", file=sys.stderr)
        return 1
    except LoopErrors as e:  # a bad window, an unreadable log or feedback store: one line
        print(f"error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # the model store cannot be read or written (permissions, a full disk)
        print(f"error: {e}", file=sys.stderr)
        return 1
    except ValueError as e:  # training.compare.CompareError, imported only where a comparison runs
        compare = sys.modules.get("training.compare")
        if compare is None or not isinstance(e, compare.CompareError):
            raise
        print(f"error: {e}", file=sys.stderr)
        return 1
    except Interrupted as e:  # a promote or rollback: the pointer is back, and the line printed says so
        return 128 + e.signum
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
