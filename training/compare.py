"""A challenger against the champion on the same labelled documents, before it is promoted.

Both models run through the one inference pipeline (training.report.evaluate). The difference in
accuracy (micro-F1 for multi-label models) comes with a paired test, because the two models see the
same documents: exact McNemar on the documents where exactly one of them is right (single-label), a
paired bootstrap otherwise; and a 95% paired bootstrap interval of the difference. Beside it: the
classes that moved, calibration (ECE) on these documents, the faithfulness each fit recorded, and
each model's n-gram head share.
"""

from __future__ import annotations

import unicodedata
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import binomtest
from sklearn.metrics import f1_score

from han.pipeline import Pipeline, document_problem
from han.saved_model import ModelDirectoryError, SavedModel
from han.segment import LanguageError, has_words
from model_store import ModelNotFoundError, load, resolve_tag
from training.report import evaluate
from training.sources import DataError, load_source

RESAMPLES = 1000
ALPHA = 0.05  # better or worse only below this p value
MOVED = 0.02  # a class "moved" when its F1 changed by at least this much: 2 points, what a reader would notice


class CompareError(ValueError):
    """One line naming the problem (unknown tag, models of different tasks/labels, unreadable data)."""


def compare(new: str, old: str, data: str | Path, text_column: str | None = None, label_column: str | None = None,
            limit: int | None = None, seed: int = 0, progress: Any = None) -> dict[str, Any]:
    """Both models (a model directory or a BentoML tag each) on the labelled documents of ``data``.

    ``limit``: a sample of that many rows, drawn with ``seed`` and kept in file order (the first rows
    of a file sorted by label, as IMDB's test split is, would be one class); ``seed`` also seeds the
    bootstrap.
    """
    (new_model, new_tag), (old_model, old_tag) = _load(str(new)), _load(str(old))
    check_comparable(new_model, old_model, new_tag, old_tag)
    multi = bool(new_model.config.multi_label)
    texts, labels, rows, total = read_labelled(data, text_column, label_column, multi, limit, seed)
    targets = encode_targets(labels, new_model.labels, multi, str(data), rows)
    result = compare_saved(new_model, old_model, texts, targets, seed=seed, progress=progress)
    name = Path(str(data)).name if Path(str(data)).exists() else str(data)
    return {"new": str(new), "old": str(old), "new_tag": new_tag, "old_tag": old_tag, "data": name,
            "sample": None if len(rows) == total else {"rows": len(rows), "of": total, "seed": seed}} | result


def _load(ref: str) -> tuple[SavedModel, str]:
    """The model and the NAME:VERSION it is now (a directory: as given), resolved once, so that the
    two agree while a promotion moves NAME:production."""
    try:
        tag = ref if Path(ref).is_dir() else resolve_tag(ref)
    except ModelNotFoundError:
        tag = ref  # load's message names directories too
    try:
        return load(tag), tag
    except (ModelNotFoundError, ModelDirectoryError, LanguageError) as e:  # unknown, corrupt, or no tokenizer
        raise CompareError(f"{tag}: {e}" if tag not in str(e) else str(e)) from None


def check_comparable(new: SavedModel, old: SavedModel, new_name: str, old_name: str) -> None:
    check_labels(new.labels, bool(new.config.multi_label), old.labels, bool(old.config.multi_label),
                 new_name, old_name)


def check_labels(new_labels: list[str], new_multi: bool, old_labels: list[str], old_multi: bool,
                 new_name: str, old_name: str) -> None:
    """Two models answer the same question only with the same task and label set (in any order)."""
    new_task, old_task = ("multi-label" if multi else "single-label" for multi in (new_multi, old_multi))
    if new_task != old_task:
        raise CompareError(f"{new_name} is {new_task} and {old_name} {old_task}: they cannot be compared")
    if sorted(new_labels) != sorted(old_labels):
        only = sorted(set(new_labels) ^ set(old_labels))
        raise CompareError(f"{new_name} and {old_name} have different labels ({', '.join(only[:5])} in one only): "
                           "they cannot be compared")


def read_labelled(data: str | Path, text_column: str | None, label_column: str | None, multi_label: bool,
                  limit: int | None = None, seed: int = 0) -> tuple[list[Any], list[Any], list[int], int]:
    """Texts, labels, their rows in the file and its row count. The file is read as ``han-train``
    reads a split (training.sources: Parquet, CSV, JSON Lines, a folder per class, a hub name)."""
    if limit is not None and limit < 1:
        raise CompareError(f"limit must be 1 or more, not {limit}")
    import datasets

    bars = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()  # datasets' "Generating train split" bar: noise before the comparison
    try:
        table = load_source(str(data))
    except DataError as e:
        raise CompareError(str(e)) from None
    finally:
        if bars:
            datasets.enable_progress_bars()
    text_column = text_column or "text"
    label_column = label_column or ("labels" if multi_label and "labels" in table.column_names else "label")
    for column in (text_column, label_column):
        if column not in table.column_names:
            raise CompareError(f"{data}: no column {column!r} (it has {', '.join(table.column_names)}); "
                               "name it with --text-column / --label-column")
    total, rows = len(table), list(range(len(table)))
    if limit is not None and limit < total:
        rows = sorted(int(i) for i in np.random.default_rng(seed).choice(total, limit, replace=False))
        table = table.select(rows)
    if not total:
        raise CompareError(f"{data}: no documents")
    table = table.select_columns([text_column, label_column])
    return list(table[text_column]), list(table[label_column]), rows, total


def encode_targets(labels: list[Any], names: list[str], multi_label: bool, where: str,
                   rows: list[int] | None = None) -> np.ndarray:
    """Class indices, or a 0/1 matrix for a multi-label model (each row a list of labels)."""
    index = {unicodedata.normalize("NFC", name): i for i, name in enumerate(names)}  # é in one form or two
    known = ", ".join(names[:10]) + (", ..." if len(names) > 10 else "")
    targets = np.zeros((len(labels), len(names)) if multi_label else len(labels), dtype=np.int64)
    for i, label in enumerate(labels):
        row = rows[i] if rows else i
        if multi_label != isinstance(label, (list, tuple)):
            raise CompareError(f"{where}: row {row} has the label {label!r}, but the models are " + (
                "multi-label: each row needs a list of labels" if multi_label else "single-label: one label a row"))
        for one in label if multi_label else [label]:
            name = None if one is None else unicodedata.normalize("NFC", str(one))
            if name is None or name not in index:
                raise CompareError(f"{where}: row {row} has the label {one!r}, which the models do not know "
                                   f"(they know {known})")
            if multi_label:
                targets[i, index[name]] = 1
            else:
                targets[i] = index[name]
    return targets


def compare_saved(new: SavedModel, old: SavedModel, texts: list[Any], targets: np.ndarray, seed: int = 0,
                  progress: Any = None) -> dict[str, Any]:
    """The comparison of two loaded models on ``texts`` (``targets`` in the new model's label order).
    Documents without a word (empty, missing) are left out for both, as a fit's evaluation leaves
    them out, and counted as ``skipped``."""
    readable = [i for i, text in enumerate(texts) if document_problem(text) is None
                and all(has_words(text, m.segmenter.max_chars) for m in (new, old))]
    if not readable:
        raise CompareError("no document with words to compare the models on")
    skipped = len(texts) - len(readable)
    texts, targets = [texts[i] for i in readable], targets[readable]
    reports = {}
    for role, saved in (("new", new), ("old", old)):
        order = [saved.labels.index(label) for label in new.labels]  # the same labels, maybe in another order
        mine = targets[:, np.argsort(order)] if targets.ndim == 2 else np.array(order)[targets]
        reports[role] = (evaluate(Pipeline(saved, batch_size=256), texts, mine, progress=progress), saved)
    multi = bool(new.config.multi_label)
    predicted = {role: _predictions(report, new.labels, multi) for role, (report, _) in reports.items()}
    rng = np.random.default_rng(seed)
    if multi:
        truth = targets.astype(bool)
        # micro-F1 = 2 hits / (true + predicted labels): per-document counts make a resample a few sums
        hits = {role: (truth & p).sum(1) for role, p in predicted.items()}
        sizes = {role: truth.sum(1) + p.sum(1) for role, p in predicted.items()}
        scores = {role: _micro_f1(hits[role], sizes[role]) for role in predicted}
        diffs = _bootstrap(lambda idx: _micro_f1(hits["new"][idx], sizes["new"][idx])
                           - _micro_f1(hits["old"][idx], sizes["old"][idx]), len(texts), rng)
        p_value, test = float(min(1.0, 2 * min((diffs <= 0).mean(), (diffs >= 0).mean()))), "paired bootstrap"
        if scores["new"] == scores["old"]:
            p_value = 1.0
    else:
        right = {role: p == targets for role, p in predicted.items()}
        scores = {role: float(r.mean()) for role, r in right.items()}
        gained = right["new"].astype(np.float64) - right["old"]  # +1, 0 or -1 a document
        diffs = _bootstrap(lambda idx: gained[idx].mean(), len(texts), rng)
        p_value, test = mcnemar_exact(int((right["new"] & ~right["old"]).sum()),
                                      int((~right["new"] & right["old"]).sum())), "exact McNemar"
    difference = scores["new"] - scores["old"]
    verdict = "no clear difference" if p_value >= ALPHA or difference == 0 else (
        "better" if difference > 0 else "worse")
    return {
        "documents": len(texts), "skipped": skipped, "task": "multi-label" if multi else "single-label",
        "metric": "micro_f1" if multi else "accuracy",
        "new_score": round(scores["new"], 4), "old_score": round(scores["old"], 4),
        "difference": round(difference, 4),
        "interval": [round(float(np.quantile(diffs, 0.025)), 4), round(float(np.quantile(diffs, 0.975)), 4)],
        "p_value": float(f"{p_value:.4g}"), "test": test, "verdict": verdict,
        "classes": _classes(new.labels, targets, predicted, multi),
        "calibration": {role: report["calibration"]["ece_after"] for role, (report, _) in reports.items()},
        "faithfulness": {role: _faithfulness(saved) for role, (_, saved) in reports.items()},
        "ngram_share": {role: _share(saved) for role, (_, saved) in reports.items()},
    }


def mcnemar_exact(only_new: int, only_old: int) -> float:
    """Two-sided exact McNemar: the documents only one model gets right, split as a fair coin would."""
    n = only_new + only_old
    return 1.0 if n == 0 else float(binomtest(only_new, n, 0.5).pvalue)


def worse_beyond_noise(result: dict[str, Any]) -> bool:
    """Whether the challenger (new) scores lower and the paired test says it is not noise (p < ALPHA):
    what ``han-model promote`` refuses without --force."""
    return result.get("verdict") == "worse"


def _predictions(report: dict[str, Any], labels: list[str], multi: bool) -> np.ndarray:
    if multi:
        return np.array([[label in r.labels for label in labels] for r in report["results"]], dtype=bool)
    index = {label: i for i, label in enumerate(labels)}
    return np.array([index[r.label] for r in report["results"]])


def _micro_f1(hits: np.ndarray, sizes: np.ndarray) -> float:
    """From each document's labels right (hits) and its true plus predicted labels (sizes)."""
    return float(2 * hits.sum() / max(1, sizes.sum()))


def _bootstrap(statistic: Any, n: int, rng: np.random.Generator) -> np.ndarray:
    return np.array([statistic(rng.integers(0, n, n)) for _ in range(RESAMPLES)])


def _classes(labels: list[str], targets: np.ndarray, predicted: dict[str, np.ndarray], multi: bool) -> dict:
    """Each class's F1 under both models; single-label: its documents that turned right or wrong."""
    out = {}
    for i, label in enumerate(labels):
        truth = targets[:, i].astype(bool) if multi else targets == i
        f1 = {role: float(f1_score(truth, (p[:, i] if multi else p == i), zero_division=0))
              for role, p in predicted.items()}
        entry = {"f1_new": round(f1["new"], 4), "f1_old": round(f1["old"], 4),
                 "change": round(f1["new"] - f1["old"], 4), "support": int(truth.sum())}
        if not multi:
            right_new, right_old = predicted["new"][truth] == i, predicted["old"][truth] == i
            entry |= {"now_right": int((right_new & ~right_old).sum()),
                      "now_wrong": int((~right_new & right_old).sum())}
        entry["moved"] = abs(entry["change"]) >= MOVED
        out[label] = entry
    return out


def _faithfulness(saved: SavedModel) -> dict[str, Any] | None:
    recorded = saved.metadata.get("faithfulness")
    if not isinstance(recorded, dict) or not isinstance(recorded.get("methods"), dict):
        return None
    out = {}
    for method, figures in recorded["methods"].items():
        ratio = (figures.get("x_random") or {}).get("top1_sentence_drop") or {}
        out[method] = {"top_sentence_x_random": ratio.get("ratio"), "interval": ratio.get("interval"),
                       "comprehensiveness": figures.get("comprehensiveness_aopc"),
                       "sufficiency": figures.get("sufficiency_aopc")}
    return out


def _share(saved: SavedModel) -> float | None:
    """The HAN's share beside its n-gram head: the head's own, which its scores use (the fit's
    metadata["ngram_head"] records the same); None for the HAN alone."""
    return None if saved.ngrams is None else round(float(saved.ngrams.han_share), 4)


def format_comparison(r: dict[str, Any]) -> str:
    """The comparison as a short plain-text report."""
    low, high = r["interval"]
    notes = ([f"a sample of {r['sample']['of']:,} rows, seed {r['sample']['seed']}"] if r.get("sample") else []) + (
        [f"{r['skipped']:,} without words left out"] if r.get("skipped") else [])
    noted = f" ({'; '.join(notes)})" if notes else ""
    lines = [
        f"{r.get('new_tag', r.get('new'))} (new) against {r.get('old_tag', r.get('old'))} (old) on {r.get('data')}: "
        f"{r['documents']:,} documents{noted}, {r['task']}",
        f"  {r['metric']}: new {r['new_score']:.4f}, old {r['old_score']:.4f}, difference {r['difference']:+.4f} "
        f"(95% interval {low:+.4f} to {high:+.4f}; {r['test']} p = {r['p_value']:.3g}): {r['verdict']}",
        f"  calibration (ECE): new {r['calibration']['new']:.4f}, old {r['calibration']['old']:.4f}",
        "  n-gram head, the HAN's share: new {}, old {}".format(
            *(("none (the HAN alone)" if s is None else f"{s:g}") for s in (r["ngram_share"]["new"],
                                                                             r["ngram_share"]["old"]))),
    ]
    classes = r["classes"]
    moved = [label for label, c in classes.items() if c["moved"]]
    lines.append(f"  classes that moved (F1 by {MOVED} or more): {', '.join(moved[:20]) or 'none'}"
                 + (f" and {len(moved) - 20} more" if len(moved) > 20 else ""))
    if len(classes) <= 20:
        turned = "now_right" in next(iter(classes.values()))
        lines.append(f"    {'class':<24} {'F1 old':>7} {'F1 new':>7} {'change':>7}"
                     + (f" {'now right':>9} {'now wrong':>9}" if turned else ""))
        for label, c in classes.items():
            lines.append(f"    {label[:24]:<24} {c['f1_old']:>7.3f} {c['f1_new']:>7.3f} {c['change']:>+7.3f}"
                         + (f" {c['now_right']:>9} {c['now_wrong']:>9}" if turned else ""))
    for role in ("new", "old"):
        recorded = {m: v for m, v in (r["faithfulness"][role] or {}).items() if v["top_sentence_x_random"]}
        lines.append(f"  faithfulness recorded for {role} (top sentence, x random): " + ("; ".join(
            f"{m} {v['top_sentence_x_random']}" + (" [{}, {}]".format(*v["interval"]) if v["interval"] else "")
            for m, v in recorded.items()) or "none"))
    return "\n".join(lines)
