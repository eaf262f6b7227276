"""``han-model shadow`` (start and stop), and the comparison ``han-model compare --shadow`` reads.

    han-model shadow han-imdb:NEW --fraction 0.2    # running services copy 20% of documents to NEW
    han-model compare han-imdb:NEW han-imdb:production --shadow    # agreement, accuracy on the feedback
    han-model shadow han-imdb --stop
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from model_store.production import live_replicas, split_tag
from monitoring.report import Z95, wilson
from monitoring.shadow import read_shadow, start_shadow, stop_shadow
from registry.loop_commands import CommandError, feedback_map, logged, parse_time, store_url

WAIT_SECONDS = 60.0
ALPHA = 0.05  # better or worse only below this p value (as training.compare)


def add_arguments(commands: Any) -> None:
    shadow = commands.add_parser("shadow", help="send a share of live documents to a challenger too (into the log)")
    shadow.add_argument("tag", help="NAME:VERSION to shadow (with --stop: NAME)")
    shadow.add_argument("--fraction", type=float, default=0.1, help="the share of documents it sees (default 0.1)")
    shadow.add_argument("--stop", action="store_true", help="end the shadow of NAME")
    shadow.add_argument("--wait", type=float, default=WAIT_SECONDS, metavar="SECONDS",
                        help=f"how long to wait for the running services to load it (default {WAIT_SECONDS:g})")


def shadow(args: argparse.Namespace) -> int:
    from model_store import resolve_tag

    name = split_tag(args.tag)[0]
    if args.stop:
        record = stop_shadow(name)
        print(f"{name}: shadow of {record['tag']} stopped" if record else f"{name}: no shadow was running")
        return 0
    if split_tag(args.tag)[1] is None:
        raise CommandError(f"{args.tag}: name the version to shadow (NAME:VERSION), or --stop to end one")
    tag = resolve_tag(args.tag)
    try:
        asked = start_shadow(tag, args.fraction)["asked"]
    except ValueError as e:
        raise CommandError(str(e)) from None
    replicas = live_replicas(name)
    if not replicas:
        print(f"shadowing {tag} with {args.fraction:.0%} of documents: no running service follows {name} right "
              "now; services started from now will")
        return 0
    deadline = time.monotonic() + args.wait
    while True:
        reports = {k: (r.get("shadow") or {}) for k, r in live_replicas(name).items() if k in replicas}
        failed = {k: s["failed"]["reason"] for k, s in reports.items()  # this request's, not an earlier one's
                  if (s.get("failed") or {}).get("asked") == asked}
        if failed:
            key, reason = next(iter(failed.items()))
            print(f"{tag} cannot be shadowed: it does not load in the service {key} ({reason}); production is "
                  f"unaffected. `han-model shadow {name} --stop` clears the request")
            return 1
        loaded = [k for k, s in reports.items() if s.get("tag") == tag]
        if len(loaded) == len(reports):
            print(f"shadowing {tag} with {args.fraction:.0%} of documents: {len(loaded)} service worker(s) "
                  f"load it; its answers go to the log only (`han-model compare {tag} {name}:production --shadow`)")
            return 0
        if time.monotonic() > deadline:
            print(f"shadow of {tag} asked for, but {len(reports) - len(loaded)} of {len(reports)} service "
                  f"worker(s) did not load it within {args.wait:g} s: see `han-model status {name}`")
            return 1
        time.sleep(0.25)


def shadow_comparison(new: str, old: str, args: argparse.Namespace) -> dict[str, Any]:
    """The challenger's shadow answers against production's on the same documents: agreement, and
    accuracy of each on the documents with feedback (with McNemar's exact test on the pairs). A shadow
    answer is paired with production's answer to the same request (its copy keeps the request's id) and
    document: a client's ids need not be unique across requests. Only ``old``'s production answers are
    paired: the verdict is filed against it, and the gate trusts it."""
    from model_store import resolve_tag

    name = split_tag(new)[0]
    challenger, incumbent = resolve_tag(new), resolve_tag(old)
    since, until = parse_time(getattr(args, "since", None), "--since"), parse_time(getattr(args, "until", None),
                                                                                    "--until")
    production: dict[tuple[str, str], dict[str, Any]] = {}
    shadowed: dict[tuple[str, str], dict[str, Any]] = {}
    for record in logged(name, since, until, drop=("text", "text_sha256")):
        key = (str(record.get("request_id")), str(record["id"]))
        answer = {"id": record["id"], "request_id": key[0], "model": record["model"],
                  "labels": record.get("labels") or []}
        if record.get("role") == "shadow" and record["model"] == challenger:
            shadowed[key] = answer
        elif record.get("role", "production") == "production":
            production[key] = answer
    others = sorted({p["model"] for key, p in production.items() if key in shadowed} - {incumbent})
    pairs = [(p, s) for key, s in shadowed.items() if (p := production.get(key)) and p["model"] == incumbent]
    if not pairs:
        beside = f" (it shadowed {', '.join(others)}: compare with that version)" if others else (
            f": start one with `han-model shadow {challenger} --fraction 0.2`")
        raise CommandError(f"the log has no document that both {challenger} (shadow) and {incumbent} "
                           f"(production) answered{beside}")
    if others:
        print(f"note: left out the documents {challenger} shadowed beside {', '.join(others)}; compared with "
              f"{incumbent} alone", file=sys.stderr)
    feedback = feedback_map(name, store_url(args), since, until)
    return compare_pairs(pairs, feedback, challenger, incumbent)


def compare_pairs(pairs: Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]],
                  feedback: Mapping[tuple[str, str], Sequence[str]],
                  challenger: str, old: str) -> dict[str, Any]:
    """The comparison of (production, shadow) answer pairs, in the keys ``han-model promote`` reads of any
    comparison (data, metric, new_score, old_score, difference, interval, p_value, test, verdict), so that a
    challenger worse on the shadow feedback is refused like one worse on labelled data. ``feedback`` maps the
    (id, request_id) of each answer a feedback judged to its truth: a reused id's other pairs are not judged."""
    from scipy.stats import binomtest

    agree = sum(p["labels"] == s["labels"] for p, s in pairs)
    judged = {p["id"]: (p, s, feedback[key]) for p, s in pairs if (key := (p["id"], p.get("request_id"))) in feedback}
    labelled = list(judged.values())
    new_right = [sorted(s["labels"]) == sorted(t) for _, s, t in labelled]
    old_right = [sorted(p["labels"]) == sorted(t) for p, _, t in labelled]
    only_new = sum(n and not o for n, o in zip(new_right, old_right, strict=True))
    only_old = sum(o and not n for n, o in zip(new_right, old_right, strict=True))
    p_value = binomtest(only_new, only_new + only_old).pvalue if only_new + only_old else 1.0
    versions = sorted({p["model"] for p, _ in pairs})
    n = len(labelled)
    result: dict[str, Any] = {
        "new": challenger, "old": old, "production_versions": versions, "paired": len(pairs),
        "agreement": round(agree / len(pairs), 4), "agreement_interval": wilson(agree, len(pairs)),
        "data": f"the shadow log ({n:,} live documents with feedback)", "documents": n, "labelled": n,
        "metric": "accuracy",
        "new_score": round(sum(new_right) / n, 4) if n else None,
        "old_score": round(sum(old_right) / n, 4) if n else None,
        "difference": round((only_new - only_old) / n, 4) if n else None,
        "interval": paired_interval(only_new, only_old, n),
        "only_new_right": only_new, "only_old_right": only_old, "p_value": float(f"{p_value:.3g}"),
        "test": "McNemar exact",
    }
    result["new_accuracy"], result["old_accuracy"] = result["new_score"], result["old_score"]
    if n:
        worse = only_new < only_old and p_value < ALPHA
        better = only_new > only_old and p_value < ALPHA
        result["verdict"] = "worse" if worse else "better" if better else "no difference beyond the noise"
    return result


def paired_interval(only_new: int, only_old: int, n: int) -> list[float] | None:
    """The 95% Wald interval of the difference of two proportions measured on the same ``n`` documents,
    from the discordant pairs alone (the concordant ones cancel out of the difference)."""
    if n == 0:
        return None
    d = (only_new - only_old) / n
    se = math.sqrt(max(0.0, only_new + only_old - (only_new - only_old) ** 2 / n)) / n
    return [round(max(-1.0, d - Z95 * se), 4), round(min(1.0, d + Z95 * se), 4)]


def format_shadow(result: Mapping[str, Any]) -> str:
    low, high = result["agreement_interval"]
    lines = [f"shadow: {result['new']} beside production ({', '.join(result['production_versions'])}) on "
             f"{result['paired']:,} live documents",
             f"  agreement with production: {result['agreement']:.4f} [{low:.4f}, {high:.4f}]"]
    if result["labelled"]:
        low, high = result["interval"]
        lines.append(f"  on {result['labelled']:,} with feedback: accuracy {result['new_score']:.4f} against "
                     f"{result['old_score']:.4f}, difference {result['difference']:+.4f} [{low:+.4f}, {high:+.4f}] "
                     f"(right only with the challenger {result['only_new_right']}, only with production "
                     f"{result['only_old_right']}; McNemar exact p = {result['p_value']:.3g}): {result['verdict']}")
    else:
        lines.append("  accuracy: no feedback on these documents yet")
    return "\n".join(lines)


def current_shadow(name: str) -> dict[str, Any] | None:
    return read_shadow(name)
