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
from array import array
from collections.abc import Mapping, Sequence
from typing import Any

from model_store.production import live_replicas, split_tag
from monitoring.report import Z95, wilson
from monitoring.shadow import read_shadow, start_shadow, stop_shadow
from registry.loop_commands import CommandError, feedback_map, logged, parse_time, store_url
from registry.moves import wait_seconds

WAIT_SECONDS = 60.0
ALPHA = 0.05  # better or worse only below this p value (as training.compare)


def add_arguments(commands: Any) -> None:
    shadow = commands.add_parser("shadow", help="send a share of live documents to a challenger too (into the log)")
    shadow.add_argument("tag", help="NAME:VERSION to shadow (with --stop: NAME)")
    shadow.add_argument("--fraction", type=float, default=0.1, help="the share of documents it sees (default 0.1)")
    shadow.add_argument("--stop", action="store_true", help="end the shadow of NAME")
    shadow.add_argument("--wait", type=wait_seconds, default=WAIT_SECONDS, metavar="SECONDS",
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
    feedback = feedback_map(name, store_url(args), since, until)
    pairs = ShadowPairs(challenger, incumbent, feedback)
    for record in logged(name, since, until, drop=("text", "text_sha256")):
        pairs.add(record)
    paired, agree, others, judged = pairs.match()
    if not paired:
        beside = f" (it shadowed {', '.join(others)}: compare with that version)" if others else (
            f": start one with `han-model shadow {challenger} --fraction 0.2`")
        raise CommandError(f"the log has no document that both {challenger} (shadow) and {incumbent} "
                           f"(production) answered{beside}")
    if others:
        print(f"note: left out the documents {challenger} shadowed beside {', '.join(others)}; compared with "
              f"{incumbent} alone", file=sys.stderr)
    return _comparison(paired, agree, judged, [incumbent], challenger, incumbent)


class ShadowPairs:
    """The log's answers, a few numbers each (never the records): a 64-bit key of (request, document), the
    version and the labels as codes. A shadow answer pairs with production's answer to the same key; the
    last answer of a key counts (as a dict would keep it), the pairs in the order their keys first came."""

    def __init__(self, challenger: str, incumbent: str, feedback: Mapping[tuple[str, str], Sequence[str]]) -> None:
        self.challenger, self.incumbent, self.feedback = challenger, incumbent, feedback
        self.production, self.shadow = (array("Q"), array("q"), array("q")), (array("Q"), array("q"))
        self.labels: dict[tuple[str, ...], int] = {}
        self.models: dict[str, int] = {}
        self.judged: dict[int, tuple[str, str]] = {}  # a judged production answer's key: its (id, request_id)

    def add(self, record: Mapping[str, Any]) -> None:
        request, doc = str(record.get("request_id")), str(record["id"])
        key = hash((request, doc)) & (2**64 - 1)
        labels = self.labels.setdefault(tuple(record.get("labels") or []), len(self.labels))
        if record.get("role") == "shadow" and record["model"] == self.challenger:
            self.shadow[0].append(key)
            self.shadow[1].append(labels)
        elif record.get("role", "production") == "production":
            self.production[0].append(key)
            self.production[1].append(self.models.setdefault(record["model"], len(self.models)))
            self.production[2].append(labels)
            if (record["id"], request) in self.feedback:
                self.judged[key] = (record["id"], request)

    def match(self) -> tuple[int, int, list[str], list[tuple[list[str], list[str], Sequence[str]]]]:
        """The pairs with the incumbent: how many, how many agree, the other production versions the
        challenger shadowed, and (production's labels, the challenger's, the truth) of each id judged."""
        import numpy as np

        if not len(self.production[0]) or not len(self.shadow[0]):
            return 0, 0, [], []
        p_keys, s_keys = (np.frombuffer(a, dtype=np.uint64) for a in (self.production[0], self.shadow[0]))
        p_models, p_labels = (np.frombuffer(a, dtype=np.int64) for a in self.production[1:])
        s_labels = np.frombuffer(self.shadow[1], dtype=np.int64)
        keys, back = np.unique(s_keys[::-1], return_index=True)
        _, first = np.unique(s_keys, return_index=True)
        order = np.argsort(first, kind="stable")
        keys, s_last = keys[order], (len(s_keys) - 1 - back)[order]  # each key once: its last answer, in first order
        p_unique, back = np.unique(p_keys[::-1], return_index=True)
        at = np.minimum(np.searchsorted(p_unique, keys), max(len(p_unique) - 1, 0))
        found = p_unique[at] == keys
        p_last = (len(p_keys) - 1 - back)[at]
        names = list(self.models)
        incumbent = self.models.get(self.incumbent, -1)
        others = sorted({names[m] for m in np.unique(p_models[p_last[found]]).tolist()} - {self.incumbent})
        mine = found & (p_models[p_last] == incumbent)
        old, new = p_labels[p_last[mine]], s_labels[s_last[mine]]
        label_names = list(self.labels)
        judged: dict[str, tuple[list[str], list[str], Sequence[str]]] = {}
        for key, o, n in zip(keys[mine].tolist(), old.tolist(), new.tolist(), strict=True):
            if (answer := self.judged.get(key)) is not None:  # a reused id: the last of its pairs in order counts
                judged[answer[0]] = (list(label_names[o]), list(label_names[n]), self.feedback[answer])
        return int(mine.sum()), int((old == new).sum()), others, list(judged.values())


def compare_pairs(pairs: Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]],
                  feedback: Mapping[tuple[str, str], Sequence[str]],
                  challenger: str, old: str) -> dict[str, Any]:
    """The comparison of (production, shadow) answer pairs, in the keys ``han-model promote`` reads of any
    comparison (data, metric, new_score, old_score, difference, interval, p_value, test, verdict), so that a
    challenger worse on the shadow feedback is refused like one worse on labelled data. ``feedback`` maps the
    (id, request_id) of each answer a feedback judged to its truth: a reused id's other pairs are not judged."""
    agree = sum(p["labels"] == s["labels"] for p, s in pairs)
    judged = {p["id"]: (p["labels"], s["labels"], feedback[key]) for p, s in pairs
              if (key := (p["id"], p.get("request_id"))) in feedback}
    return _comparison(len(pairs), agree, list(judged.values()), sorted({p["model"] for p, _ in pairs}),
                       challenger, old)


def _comparison(paired: int, agree: int, labelled: Sequence[tuple[Sequence[str], Sequence[str], Sequence[str]]],
                versions: list[str], challenger: str, old: str) -> dict[str, Any]:
    """``compare_pairs``'s figures from the counts: ``labelled`` holds (production's labels, the challenger's,
    the truth) of each judged document."""
    from scipy.stats import binomtest

    new_right = [sorted(new) == sorted(t) for _, new, t in labelled]
    old_right = [sorted(prod) == sorted(t) for prod, _, t in labelled]
    only_new = sum(n and not o for n, o in zip(new_right, old_right, strict=True))
    only_old = sum(o and not n for n, o in zip(new_right, old_right, strict=True))
    p_value = binomtest(only_new, only_new + only_old).pvalue if only_new + only_old else 1.0
    n = len(labelled)
    result: dict[str, Any] = {
        "new": challenger, "old": old, "production_versions": versions, "paired": paired,
        "agreement": round(agree / paired, 4), "agreement_interval": wilson(agree, paired),
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
