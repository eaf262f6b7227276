"""The monitor's figures gathered while the log streams by: a few numbers a document in flat arrays (about
50 bytes), never the records themselves, so that ``han-model monitor`` and ``GET /monitor`` hold a window
of millions of documents in tens of megabytes (``monitoring.report`` makes the figures of them).

A version whose directory is gone from the store (deleted) has no profile and no known task: its
expected and realised figures are kept both ways (single- and multi-label) and chosen at the end, from
what its answers show, as ``monitoring.report.report`` does with the records.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from monitoring.report import _iso, _seconds, expected_right, figures, looks_multi_label, realised_right, series_of

Facts = tuple[Mapping[str, Any] | None, Sequence[str], bool]


class Stream:
    """One version's (and role's) documents, as numbers."""

    def __init__(self, tag: str, role: str, facts: Facts | None, first: Mapping[str, Any]) -> None:
        self.tag, self.role, self.facts = tag, role, facts
        self.labels = list(facts[1]) if facts else sorted(first["scores"])
        self.multi = facts[2] if facts else False  # without facts: any answer that looks multi-label makes it so
        self.seq, self.times = array("q"), array("d")
        self.words, self.oov, self.codes = array("d"), array("d"), array("q")
        self.expected = [array("d")] if facts else [array("d"), array("d")]  # single-label, multi-label
        self.right = [array("d")] if facts else [array("d"), array("d")]
        self.names: dict[Any, int] = {}
        self.first = self.last = str(first["time"])

    def add(self, seq: int, record: Mapping[str, Any], truth: Sequence[str] | None) -> None:
        if self.facts is None and not self.multi:
            self.multi = looks_multi_label([record])
        kinds = [self.facts[2]] if self.facts else [False, True]
        profile = self.facts[0] if self.facts else None
        for kind, expected, right in zip(kinds, self.expected, self.right, strict=True):
            expected.append(expected_right(record, profile, kind))
            right.append(math.nan if truth is None else realised_right(record, truth, self.labels, kind))
        self.seq.append(seq)
        self.times.append(_seconds(str(record["time"])))
        self.words.append(float(record["words"]))
        self.oov.append(float(record["oov"]))
        self.codes.append(self.names.setdefault(record["label"], len(self.names)))
        self.last = str(record["time"])

    def trim(self, first_seq: int) -> None:
        """Forget the documents read before ``first_seq`` (the page's cap: the window's newest documents)."""
        cut = int(np.searchsorted(np.frombuffer(self.seq, dtype=np.int64), first_seq)) if len(self.seq) else 0
        if cut:
            for column in (self.seq, self.times, self.words, self.oov, self.codes, *self.expected, *self.right):
                del column[:cut]
            if len(self.times):
                self.first = _iso(self.times[0])

    def columns(self) -> tuple[np.ndarray, ...]:
        kind = 0 if self.facts else int(self.multi)
        return (np.frombuffer(self.expected[kind], dtype=float), np.frombuffer(self.right[kind], dtype=float),
                np.frombuffer(self.words, dtype=float), np.frombuffer(self.oov, dtype=float),
                np.frombuffer(self.codes, dtype=np.int64), list(self.names))

    def report(self, with_series: bool) -> dict[str, Any]:
        profile = self.facts[0] if self.facts else None
        entry = {"model": self.tag, "role": self.role,
                 **figures(*self.columns(), self.first, self.last, profile, self.multi)}
        if with_series:
            entry["series"] = series_of(np.frombuffer(self.times, dtype=float), *self.columns(), profile, self.multi)
        return entry


class Window:
    """The window's documents, read one at a time: each version's ``Stream``, and, with ``keep``, only the
    newest ``keep`` documents (``cut`` then says how many were read in all)."""

    def __init__(self, feedback: Mapping[tuple[str, str], Sequence[str]],
                 facts_of: Callable[[str], Facts | None], keep: int | None = None) -> None:
        self.feedback, self.facts_of, self.keep = feedback, facts_of, keep
        self.streams: dict[tuple[str, str], Stream] = {}
        self.facts: dict[str, Facts | None] = {}
        self.read = 0

    def add_all(self, records: Iterable[Mapping[str, Any]]) -> Window:
        for record in records:
            self.add(record)
        if self.keep is not None:
            self._trim()
        return self

    def add(self, record: Mapping[str, Any]) -> None:
        tag, role = record["model"], record.get("role", "production")
        if tag not in self.facts:
            self.facts[tag] = self.facts_of(tag)
        stream = self.streams.get((tag, role))
        if stream is None:
            stream = self.streams[tag, role] = Stream(tag, role, self.facts[tag], record)
        stream.add(self.read, record, self.feedback.get((record["id"], record.get("request_id"))))
        self.read += 1
        if self.keep is not None and self.read % self.keep == 0 and self.read > self.keep:
            self._trim()  # at most twice ``keep`` documents held

    def _trim(self) -> None:
        if self.read > self.keep:  # type: ignore[operator]
            for stream in self.streams.values():
                stream.trim(self.read - self.keep)  # type: ignore[operator]
            self.streams = {key: s for key, s in self.streams.items() if len(s.seq)}

    @property
    def kept(self) -> int:
        return sum(len(stream.seq) for stream in self.streams.values())

    @property
    def cut(self) -> bool:
        return self.kept < self.read

    def first_time(self) -> str | None:
        """The time of the first document kept: where the window read really starts."""
        firsts = [(stream.seq[0], stream.first) for stream in self.streams.values() if len(stream.seq)]
        return min(firsts)[1] if firsts else None

    def reports(self, with_series: bool = False) -> list[dict[str, Any]]:
        """One report per (version, role), in order of their first document kept."""
        ordered = sorted(self.streams.values(), key=lambda stream: stream.seq[0])
        return [stream.report(with_series) for stream in ordered]


MASK = 2**64 - 1


def _hash(*parts: Any) -> int:
    """A record's or an id's 64 bits (Python's hash: the same for the two reads of one process)."""
    return hash(parts) & MASK


class ExportChoice:
    """``han-model export-log``'s choice of rows, made on a first read of the log with a few numbers a record:
    each id once, at the place of its last answer, with the answer its feedback judged where there is one
    (its text is what was labelled), else that last answer. ``rows_of`` then picks those rows out of a second
    read, holding only a judged answer that a later one of its id has yet to place."""

    def __init__(self, feedback: Mapping[tuple[str, str], Sequence[str]], roles: Collection[str] | None,
                 labelled_only: bool) -> None:
        self.feedback, self.roles, self.labelled_only = feedback, roles, labelled_only
        self.answered: set[int] = set()  # (id, request) production answered (--role all): its shadow copy is not
        self.textless: dict[int, bool] = {}  # ids answered with HAN_LOG_TEXT=0: judged?
        self.per_label: dict[str, bool] = {}  # each version: do its answers look multi-label?
        self.seen: set[tuple[str, str]] = set()  # the judged answers still in the log
        self.ids, self.keys, self.judged, self.tags = array("Q"), array("Q"), array("b"), array("q")
        self.tag_names: dict[str, int] = {}
        self.rows = self.labelled = 0
        self.chosen_tags: set[str] = set()

    def see(self, record: Mapping[str, Any]) -> None:
        """A record of the first read (every role: a judged answer of another role is still in the log)."""
        answer = (record["id"], record.get("request_id"))
        judged = answer in self.feedback
        if judged:
            self.seen.add(answer)
        if self.roles is not None and record.get("role") not in self.roles:
            return
        if self.roles is None:
            if record.get("role") == "shadow" and _hash(*answer) in self.answered:
                return
            if record.get("role", "production") == "production":
                self.answered.add(_hash(*answer))
        if "text" not in record:
            key = _hash(record["id"])
            self.textless[key] = self.textless.get(key, False) or judged
            return
        tag = record["model"]
        self.per_label[tag] = self.per_label.get(tag, False) or looks_multi_label([record])
        self.ids.append(_hash(record["id"]))
        self.keys.append(_key(record))
        self.judged.append(judged)
        self.tags.append(self.tag_names.setdefault(tag, len(self.tag_names)))

    def choose(self) -> ExportChoice:
        """Each id's row: ``rows`` of them, ``labelled`` with feedback, from versions ``chosen_tags``."""
        ids, keys = np.frombuffer(self.ids, dtype=np.uint64), np.frombuffer(self.keys, dtype=np.uint64)
        judged, n = np.frombuffer(self.judged, dtype=np.int8).astype(bool), len(self.ids)
        self.unique, back = np.unique(ids[::-1], return_index=True)
        last = n - 1 - back
        content, has_judged = last.copy(), np.zeros(len(self.unique), dtype=bool)
        at = np.nonzero(judged)[0]
        if len(at):
            judged_ids, back = np.unique(ids[at][::-1], return_index=True)
            where = np.searchsorted(self.unique, judged_ids)
            content[where], has_judged[where] = at[len(at) - 1 - back], True
        keep = has_judged if self.labelled_only else np.ones(len(self.unique), dtype=bool)
        self.kept_ids, self.labelled_ids = self.unique[keep], self.unique[keep & has_judged]
        place, content = last[keep], content[keep]
        self.rows, self.labelled = int(keep.sum()), int((keep & has_judged).sum())
        names = list(self.tag_names)
        self.chosen_tags = {names[i] for i in np.unique(np.frombuffer(self.tags, dtype=np.int64)[content]).tolist()}
        order = np.argsort(keys[place], kind="stable")
        self.place_keys, self.place_ids = keys[place][order], ids[place][order]
        self.same, self.done = (place == content)[order], np.zeros(len(place), dtype=bool)
        apart = place != content
        order = np.argsort(keys[content[apart]], kind="stable")
        self.content_keys, self.content_ids = keys[content[apart]][order], ids[content[apart]][order]
        return self

    def rows_of(self, records: Iterable[Mapping[str, Any]]) -> Iterator[Mapping[str, Any]]:
        """The chosen records out of a second read of the log, in the order of their places."""
        held: dict[int, Mapping[str, Any]] = {}
        for record in records:
            if "text" not in record:
                continue
            key = np.uint64(_key(record))
            i = int(np.searchsorted(self.place_keys, key))
            if i < len(self.place_keys) and self.place_keys[i] == key:
                if not self.done[i]:
                    self.done[i] = True
                    row = record if self.same[i] else held.pop(int(self.place_ids[i]), None)
                    if row is not None:
                        yield row
                continue
            j = int(np.searchsorted(self.content_keys, key))
            if j < len(self.content_keys) and self.content_keys[j] == key:
                held[int(self.content_ids[j])] = record

    def lacking(self) -> int:
        """The ids left out for want of their text (HAN_LOG_TEXT=0): of those with feedback alone, with
        ``labelled_only``."""
        kept = set(self.kept_ids.tolist())
        return sum(1 for key, fed in self.textless.items() if key not in kept and (fed or not self.labelled_only))

    def gone(self) -> int:
        """The ids with feedback that the file lacks because their judged answer is no longer in the log:
        the log's size cap deleted its file before the feedback came, or before this export."""
        exported = set(self.labelled_ids.tolist())
        return len({key for answer in self.feedback if answer not in self.seen
                    and (key := _hash(answer[0])) not in exported})


def _key(record: Mapping[str, Any]) -> int:
    return _hash(record["id"], record.get("request_id"), record.get("role"), record.get("time"))
