"""Tokenising a split for training: segmentation into token keys and label strings, batch by batch,
in as many processes as the split is worth (``datasets.map`` runs these module-level functions)."""

from __future__ import annotations

import unicodedata
from functools import cache
from typing import Any

import numpy as np
from pytorch_lightning.utilities import rank_zero_info

from han.environment import usable_cores
from han.segment import Segmenter, SegmenterConfig
from training.sources import DataError


def processes(rows: int) -> int | None:
    """All usable cores for a large split (tens of seconds on one core), one process for a small
    one, which forking would only slow down."""
    n = min(usable_cores(), rows // 2000)
    return n if n > 1 else None


@cache
def _segmenter(config: SegmenterConfig) -> Segmenter:
    """One per process and configuration (tokenising workers build theirs on their first batch)."""
    return Segmenter(config)


def tokenise_batch(
    batch: dict[str, list],
    indices: list[int],
    *,
    split: str,
    source: str,
    text_column: str,
    label_column: str | None,
    multi_label: bool,
    config: SegmenterConfig,
) -> dict[str, list]:
    """One batch of a split: texts segmented into token keys, labels into lists of strings, and each
    document's row in its file; documents with no words dropped (nothing to learn from). Module level, so
    tokenising processes can run it."""
    texts = batch[text_column]
    for i, text in zip(indices, texts, strict=True):
        require_text(text, i, split, source)
    labels = batch[label_column] if label_column else [None] * len(texts)
    kept, keys, targets, rows = [], [], [], []
    for i, segment, label in zip(indices, _segmenter(config).segment_many(texts), labels, strict=True):
        if segment.is_empty:
            continue
        kept.append(segment.text)
        keys.append(segment.token_keys)
        targets.append(label_strings(label, multi_label, split, source, i) if label_column else [])
        rows.append(i)
    return {"text": kept, "keys": keys, "target": targets, "row": rows}


def report_wordless(split: str, source: str, total: int, kept: Any) -> None:
    """One log line for a split's rows left out for having no word (only spaces, markup, control
    characters; a present text, unlike a missing one): their count and first rows. ``kept``: the rows kept."""
    if len(kept) == total or not len(kept):
        return
    left = np.setdiff1d(np.arange(total), np.asarray(kept))
    first = ", ".join(map(str, left[:5].tolist())) + (", ..." if len(left) > 5 else "")
    rank_zero_info(f"{split} ({source}): {len(left):,} of {total:,} rows have no word and are left out (rows {first})")


def label_order(labels: set[str]) -> list[str]:
    """Integer labels (ASCII digits, an optional minus) in numeric order first, then the rest sorted."""
    def key(x: str) -> tuple[bool, int, str]:
        number = x.isascii() and x.removeprefix("-").isdecimal()
        return not number, int(x) if number else 0, x
    return sorted(labels, key=key)


def require_text(text: Any, row: int, split: str, source: str) -> str:
    """The document's text, or a DataError naming its row in the file."""
    if not isinstance(text, str):
        raise DataError(f"{split} ({source}) row {row}: the text is {type(text).__name__}, not a string")
    return text


def label_strings(label: Any, multi_label: bool, split: str, source: str, row: int | None = None) -> list[str]:
    """The document's labels as strings, in Unicode's composed form (NFC); an empty or whitespace-only label,
    or a missing one in a list, is a DataError naming its row (``sources.refuse_missing_values`` names most
    before tokenising)."""
    where = f"{split} ({source})" + ("" if row is None else f" row {row}")
    if multi_label:
        if not isinstance(label, (list, tuple)):
            raise DataError(f"{where}: multi_label is set but the label is {type(label).__name__}, not a list")
        for x in label:
            if x is None or not str(x).strip():
                raise DataError(f"{where}: the label list holds {'None' if x is None else 'an empty label'}; "
                                "give every label a name")
        return [_composed(str(x)) for x in label]
    if label is None or isinstance(label, (list, tuple, dict)):
        raise DataError(f"{where}: a label must be a string or an integer, not {label!r}")
    if not str(label).strip():
        raise DataError(f"{where}: the label is empty; give every label a name")
    return [_composed(str(label))]


def _composed(label: str) -> str:
    """A label in Unicode's composed form (NFC): "é" as one character or as "e" and an accent (macOS) looks
    the same and is one class (``sources.refuse_missing_values`` says so when a file had the other)."""
    return label if unicodedata.is_normalized("NFC", label) else unicodedata.normalize("NFC", label)
