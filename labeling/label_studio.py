"""Label Studio's formats: the tasks ``han-label next`` writes, and the exports ``han-label import`` reads.

A task carries the document (``data.text``, and its id as ``data.doc_id``: Label Studio's JSON-min and
CSV exports put the task's own number in ``id``) and one prediction, the pre-annotation an annotator
starts from: the model's label (a ``choices`` result) and its top sentences as highlighted spans (a
``labels`` result named ``evidence``), with ``model_version`` the model's tag and ``score`` its score.
``label_config`` is the project's labelling config that these names fit.

Exports: the JSON export (a list of tasks with their ``annotations``), JSON-min (a record per
annotated task, the data fields flattened, the choice under ``label``) and CSV (the same columns).
What cannot become a training row (a skipped task, annotators who disagree, a label the model does
not know) is returned as a ``Problem`` naming the task, for one line each. Labels are read in Unicode's
composed form (NFC), as han-train reads them; the texts as they are (the evidence spans' offsets are in them).
"""

from __future__ import annotations

import csv
import json
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from xml.sax.saxutils import quoteattr

CHOICES = "label"  # the Choices tag's name: the document's label
EVIDENCE = "evidence"  # the Labels tag's name: the highlighted sentences
TEXT = "text"
DOC_ID = "doc_id"
SPLIT = "split"  # a task marked validation by han-label next (its random holdout)


class ExportError(ValueError):
    """The export cannot be read at all (one line naming the file, and the line or row where known)."""


def label_config(labels: list[str], multi_label: bool) -> str:
    """The labelling config of a project for ``han-label next``'s tasks."""
    choices = "".join(f"\n    <Choice value={quoteattr(label)}/>" for label in labels)
    return (
        "<View>\n"
        f'  <Text name="{TEXT}" value="${TEXT}"/>\n'
        f'  <Labels name="{EVIDENCE}" toName="{TEXT}">\n'
        f'    <Label value="{EVIDENCE}" background="#FFD54F"/>\n  </Labels>\n'
        f'  <Choices name="{CHOICES}" toName="{TEXT}" choice="{"multiple" if multi_label else "single"}" '
        f'showInLine="true">{choices}\n  </Choices>\n'
        "</View>\n"
    )


def task(doc_id: str, text: str, chosen: list[str], score: float, model_version: str,
         sentences: list[tuple[int, int, str]], extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """One task: the document and the model's pre-annotation (its label(s) and its top sentences)."""
    result: list[dict[str, Any]] = [
        {"id": "label", "from_name": CHOICES, "to_name": TEXT, "type": "choices", "value": {"choices": chosen}}
    ]
    for k, (start, end, sentence) in enumerate(sentences):
        result.append({"id": f"s{k}", "from_name": EVIDENCE, "to_name": TEXT, "type": "labels",
                       "value": {"start": start, "end": end, "text": sentence, "labels": [EVIDENCE]}})
    return {"data": {TEXT: text, DOC_ID: doc_id, **(extra or {})},
            "predictions": [{"model_version": model_version, "score": round(score, 6), "result": result}]}


@dataclass
class Problem:
    where: str  # "task 12 (document r-7)"
    what: str


@dataclass
class Labelled:
    rows: list[dict[str, Any]] = field(default_factory=list)  # id, text, label(s)
    problems: list[Problem] = field(default_factory=list)  # tasks left out
    notices: list[Problem] = field(default_factory=list)  # tasks imported, with something to say
    seen_labels: set[str] = field(default_factory=set)
    recomposed: int = 0  # annotations whose labels were in another Unicode form than NFC (``_composed``)


def read_export(path: Path, labels: list[str], multi_label: bool) -> Labelled:
    """The training rows of a Label Studio export (JSON, JSON-min or CSV, by content and extension)."""
    if not path.is_file():
        raise ExportError(f"{path}: file not found")
    if path.suffix.lower() == ".csv":
        records = _csv_records(path)
        return _from_min(path, records, labels, multi_label, row_word="row", first=2)
    try:
        raw = path.read_text(encoding="utf-8-sig")  # a BOM: saved again by an editor
    except UnicodeDecodeError as e:
        raise ExportError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason}); Label Studio exports UTF-8") from None
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ExportError(f"{path}: line {e.lineno} column {e.colno}: not valid JSON ({e.msg})") from None
    if not isinstance(data, list):
        raise ExportError(f"{path}: not a Label Studio export (a JSON list of tasks), but a JSON {type(data).__name__}")
    if any(not isinstance(t, dict) for t in data):
        k = next(i for i, t in enumerate(data) if not isinstance(t, dict))
        raise ExportError(f"{path}: item {k + 1}: not a task (a JSON object)")
    if data and all("annotations" in t or "data" in t for t in data):
        return _from_full(path, data, labels, multi_label)
    return _from_min(path, data, labels, multi_label, row_word="item", first=1)


def _csv_records(path: Path) -> list[dict[str, Any]]:
    csv.field_size_limit(1 << 30)
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:  # a BOM: the export saved again from a spreadsheet
            return list(csv.DictReader(f))
    except UnicodeDecodeError:
        from scoring.read_causes import not_utf8

        problem = not_utf8(path, "csv") or "not UTF-8 text; Label Studio exports UTF-8"  # its row and line
        raise ExportError(f"{path}: {problem}") from None
    except csv.Error as e:
        raise ExportError(f"{path}: not a readable CSV file ({e})") from None


def _doc(value: Any) -> str | None:
    """A document id as text (an id 0 is one), None where there is none."""
    return None if value is None or value == "" else str(value)


def _where(task_id: Any, doc_id: Any) -> str:
    return f"task {task_id}" + (f" (document {doc_id})" if doc_id not in (None, "") else "")


def _from_full(path: Path, tasks: list[dict[str, Any]], labels: list[str], multi_label: bool) -> Labelled:
    """Each document once: the tasks of one document (its id and its text: imported twice, say) pool their
    annotations, so that two that disagree are reported, not written as two rows with two labels."""
    out = Labelled()
    by_doc: dict[tuple[str, str], tuple[str, dict[str, Any], set[tuple[str, ...]], bool]] = {}
    texts = _Texts()
    for k, t in enumerate(tasks, 1):
        data = t.get("data")
        if not isinstance(data, dict) or not isinstance(data.get(TEXT), str):
            raise ExportError(f"{path}: item {k}: a task without data.{TEXT}: not an export of han-label's tasks")
        where = _where(t.get("id", k), data.get(DOC_ID))
        answers = []
        for a in t.get("annotations") or []:
            if not isinstance(a, dict) or a.get("was_cancelled"):
                continue
            chosen = _composed(out, _choices(a.get("result")))
            if chosen or (chosen is not None and multi_label):  # submitted with no label: a multi-label "none"
                answers.append(tuple(sorted(chosen)))
        skipped = any(isinstance(a, dict) and a.get("was_cancelled") for a in t.get("annotations") or [])
        key = (_doc(data.get(DOC_ID)) or f"task {t.get('id', k)}", data[TEXT])
        texts.note(out, key, where, t.get("id", k))
        first_where, first_data, pooled, any_skipped = by_doc.get(key, (where, data, set(), False))
        by_doc[key] = (first_where, first_data, pooled | set(answers), any_skipped or skipped)
    for where, data, answers, skipped in by_doc.values():
        _add(out, where, data, answers, labels, multi_label, skipped)
    return out


class _Texts:
    """The first task of each document id, to report a task whose id names another text than an earlier
    task's (a pool whose ids repeat): it is a document of its own, not pooled with the other."""

    def __init__(self) -> None:
        self.first: dict[str, tuple[str, Any]] = {}  # id -> (its first text, that task's number)

    def note(self, out: Labelled, key: tuple[str, str], where: str, task_id: Any) -> None:
        doc, text = key
        first_text, first_task = self.first.setdefault(doc, (text, task_id))
        if first_text != text:
            out.notices.append(Problem(where, f"its document id {doc} is also task {first_task}'s, "
                                              "with another text: imported as a document of its own (each id "
                                              "should name one document: han-label next --labelled leaves "
                                              "documents out by id)"))


def _choices(result: Any) -> list[str] | None:
    """An annotation's chosen labels: its ``choices`` results named ``CHOICES``, else those of the one
    ``choices`` tag it has under another name (a project set up with its own labelling config); [] where
    it chose none (submitted with no choice); None where it has choices under several other names."""
    results = [r for r in result or [] if isinstance(r, dict) and r.get("type", "choices") == "choices"]
    named = [r for r in results if r.get("from_name") == CHOICES]
    if not named and len({r.get("from_name") for r in results}) == 1:
        named = results
    if not named and results:
        return None  # which tag is the label?
    return [c for r in named for c in (r.get("value") or {}).get("choices") or [] if isinstance(c, str)]


def _from_min(path: Path, records: list[dict[str, Any]], labels: list[str], multi_label: bool, row_word: str,
              first: int) -> Labelled:
    out = Labelled()
    if records and TEXT not in records[0]:
        raise ExportError(f"{path}: {row_word} {first}: no '{TEXT}' field (fields: {', '.join(map(str, records[0]))}):"
                          " not an export of han-label's tasks")
    if records and not any(CHOICES in r for r in records):
        raise ExportError(f"{path}: no {row_word} has a '{CHOICES}' field (fields: {', '.join(map(str, records[0]))}):"
                          f" nothing is annotated, or the project's Choices tag has another name (han-label next's"
                          f" label config names it '{CHOICES}')")
    by_doc: dict[tuple[str, str], tuple[str, dict[str, Any], set[tuple[str, ...]]]] = {}
    texts = _Texts()
    for k, r in enumerate(records, first):
        if not isinstance(r.get(TEXT), str):
            raise ExportError(f"{path}: {row_word} {k}: no '{TEXT}' field: not an export of han-label's tasks")
        chosen = _composed(out, _min_choices(r.get(CHOICES)))
        if chosen is None:
            raise ExportError(f"{path}: {row_word} {k}: '{CHOICES}' is {r.get(CHOICES)!r}, not a label or labels")
        key = (_doc(r.get(DOC_ID)) or _doc(r.get("id")) or str(k), r[TEXT])
        if key not in by_doc:
            where = _where(r.get("id", k), r.get(DOC_ID))
            texts.note(out, key, where, r.get("id", k))
            by_doc[key] = (where, r, set())
        # a record per annotation; a task never annotated has one with annotation_id null (CSV: empty)
        annotated = r.get("annotation_id", 0) not in (None, "")
        if chosen or (multi_label and annotated):  # submitted with no label: a multi-label "none"
            by_doc[key][2].add(tuple(sorted(chosen)))
    for where, r, answers in by_doc.values():
        _add(out, where, r, answers, labels, multi_label, skipped=False)  # a cancelled annotation has no record
    return out


def _composed(out: Labelled, chosen: list[str] | None) -> list[str] | None:
    """Labels in Unicode's composed form (NFC), as han-train reads them: a label typed on macOS can come as
    "e" and an accent, which looks like "é" and would not be the model's label; counted in ``out``."""
    if not chosen or all(unicodedata.is_normalized("NFC", c) for c in chosen):
        return chosen
    out.recomposed += 1
    return [unicodedata.normalize("NFC", c) for c in chosen]


def _min_choices(value: Any) -> list[str] | None:
    """JSON-min's and CSV's choice cell: a label, {"choices": [...]} (multiple), or empty; None if neither."""
    if value is None or value == "":
        return []
    if isinstance(value, str) and value.startswith("{"):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return None
    if isinstance(value, dict):
        value = value.get("choices")
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    return None


def _add(out: Labelled, where: str, data: dict[str, Any], answers: set[tuple[str, ...]], labels: list[str],
         multi_label: bool, skipped: bool) -> None:
    if not answers:
        why = " (the annotator skipped it)" if skipped else ""
        out.problems.append(Problem(where, "skipped: no annotation" + why))
        return
    if len(answers) > 1:
        shown = "; ".join(", ".join(a) or "no label" for a in sorted(answers))
        out.problems.append(Problem(where, f"left out: its annotators disagree ({shown})"))
        return
    chosen = list(next(iter(answers)))
    out.seen_labels.update(chosen)
    unknown = [c for c in chosen if c not in labels]
    if unknown:
        shown = ", ".join(map(repr, unknown))
        out.problems.append(Problem(where, f"left out: label {shown} is not one of the model's"))
        return
    if not multi_label and len(chosen) > 1:
        shown = ", ".join(chosen)
        out.problems.append(Problem(where, f"left out: {len(chosen)} labels ({shown}) for a single-label model"))
        return
    row: dict[str, Any] = {"id": _doc(data.get(DOC_ID)) or "", "text": data[TEXT]}
    row["labels" if multi_label else "label"] = chosen if multi_label else chosen[0]
    if data.get(SPLIT) == "validation":  # han-label next's random holdout: han-train fit validates on it
        row[SPLIT] = "validation"
    out.rows.append(row)
