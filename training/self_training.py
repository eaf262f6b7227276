"""Self-training: with few labels and more unlabelled text, a first model (the teacher), trained on
the labels, labels the unlabelled text (the HAN averaged with its n-gram head, if validation keeps it);
a second model trains on the labels plus the teacher's most confident documents, balanced across
classes, and is the one exported. With ``targets: soft`` (the default) the second model learns the
teacher's scores over every label for those documents (distillation, Hinton et al. 2015) rather than
its top label alone: what the teacher is unsure of stays unsure.

``han-train fit`` runs both when ``self_training.fraction`` is above 0 and ``data.unlabeled`` is set:
the teacher's run goes to ``<run>/teacher`` (exported there, not registered), its labels to
``<run>/pseudo-labelled.parquet``, and the second fit to ``<run>`` as usual. Validation, calibration,
the threshold and the test report see human labels only (``data.pseudo_labelled``). An unlabelled
document with the text of a training, validation or test document is left out (``labelled_texts``): a
file of all the user's text holds the labelled documents too, and a copy of a validation or test
document in the training split would be measured on as trained on.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from han import DocumentResult, Pipeline, SavedModel
from training.sources import DataError, load_source

PSEUDO_FILE = "pseudo-labelled.parquet"
TEACHER_SCORES = "teacher_scores"  # the column of the teacher's scores (label order: TEACHER_LABELS)
TEACHER_LABELS = b"teacher_labels"  # Parquet metadata: the labels, in the order of those scores
TARGETS = ("soft", "hard")
POOL = 4  # the teacher labels at most POOL * max_documents unlabelled documents


class SelfTraining:
    """Settings of self-training (``--self_training.*``).

    Args:
        fraction: the share of the unlabelled documents the teacher labels for the second fit, as an
            equal quota per class (``fraction * documents / classes``, the most confident first); 0
            trains one model only. Unset, the recipe's choice: 1 for single-label data with unlabelled
            text and under 3,000 labelled documents (training.recipe.FEW_LABELS), else 0.
        max_documents: at most this many pseudo-labelled documents in all (the second fit's time
            grows with them); the teacher labels at most four times as many, a seeded sample.
        targets: what the second model learns for those documents: ``soft``, the teacher's scores over
            every label, or ``hard``, its top label.
    """

    def __init__(self, fraction: float | None = None, max_documents: int = 6000, targets: str = "soft") -> None:
        if fraction is not None and not 0 <= fraction <= 1:
            raise ValueError(f"self_training.fraction must be between 0 and 1, not {fraction}")
        if max_documents < 1:
            raise ValueError(f"self_training.max_documents must be at least 1, not {max_documents}")
        if targets not in TARGETS:
            raise ValueError(f"self_training.targets must be one of {', '.join(TARGETS)}, not {targets!r}")
        self.fraction = fraction
        self.max_documents = max_documents
        self.targets = targets


def teaching(config: Any) -> bool:
    """Whether this ``fit`` config is a self-training run's first (teacher) fit."""
    return bool((config.self_training.fraction or 0) > 0 and config.data.unlabeled and not config.data.pseudo_labelled)


def pseudo_label(model_dir: Path, config: Any, out: Path) -> dict[str, Any]:
    """Label ``data.unlabeled`` with the teacher in ``model_dir`` (the inference pipeline) and write the
    chosen documents to ``out`` (Parquet, the data's text and label columns, and with soft targets the
    teacher's scores); returns counts."""
    data, settings = config.data, config.self_training
    raw = load_source(data.unlabeled)
    if data.text_column not in raw.column_names:
        raise DataError(f"unlabeled ({data.unlabeled}): no column {data.text_column!r}")
    texts = raw[data.text_column]
    total = len(texts)
    known = labelled_texts(data)
    texts = [t for t in texts if _digest(t) not in known]
    left_out = total - len(texts)
    if left_out:
        print(f"self-training: left out {left_out:,} of the {total:,} unlabelled documents: the same text as "
              "a document of the training, validation or test split (labelled there, and validation and test must "
              "not be trained on)", file=sys.stderr)
    if not texts:
        raise DataError(f"unlabeled ({data.unlabeled}): every document is one of the training, validation or test "
                        "split's; self-training needs other text")
    if len(texts) > POOL * settings.max_documents:  # labelling millions to keep thousands: a seeded sample
        keep = np.sort(np.random.default_rng(0).choice(len(texts), POOL * settings.max_documents, replace=False))
        texts = [texts[i] for i in keep]
    pipeline = Pipeline(SavedModel.load(model_dir), batch_size=128)
    labels = pipeline.labels
    results = pipeline(texts, errors="return")
    scored = [(i, r) for i, r in enumerate(results) if isinstance(r, DocumentResult)]
    predicted = np.array([labels.index(r.label) for _, r in scored], dtype=np.int64)
    confidence = np.array([r.scores[r.label] for _, r in scored])
    quota = int(min(settings.fraction * len(texts), settings.max_documents) / len(labels))
    chosen: list[int] = []
    for c in range(len(labels)):
        members = np.flatnonzero(predicted == c)
        chosen += members[np.argsort(-confidence[members], kind="stable")][:quota].tolist()
    chosen.sort()
    rows = [scored[k][0] for k in chosen]
    columns = {data.text_column: [texts[i] for i in rows], data.label_column: [labels[predicted[k]] for k in chosen]}
    if settings.targets == "soft":
        columns[TEACHER_SCORES] = pa.array([[scored[k][1].scores[name] for name in labels] for k in chosen],
                                           pa.list_(pa.float32()))
    table = pa.table(columns).replace_schema_metadata({TEACHER_LABELS: json.dumps(labels).encode()})
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, out)
    return {
        "unlabeled": total,
        "left_out": left_out,
        "chosen": len(chosen),
        "min_confidence": float(confidence[chosen].min()) if chosen else None,
    }


def labelled_texts(data: Any) -> set[bytes]:
    """Digests of the texts of every document the fit's splits may hold: the training file's (its rows the
    training split and, without ``data.validation``, the validation split), the validation file's and the
    test file's, each within ``max_train_docs`` / ``max_eval_docs`` as the data module reads them."""
    known: set[bytes] = set()
    for source, limit in ((data.train, data.max_train_docs), (data.validation, data.max_eval_docs),
                          (data.test, data.max_eval_docs)):
        if not source:
            continue
        raw = load_source(source)
        if data.text_column not in raw.column_names:  # the fit read it: only a file changed since
            raise DataError(f"{source}: no column {data.text_column!r}")
        column = raw[data.text_column] if limit is None else raw.select(range(min(limit, len(raw))))[data.text_column]
        known.update(_digest(text) for text in column)
    return known


def _digest(text: Any) -> bytes:
    return hashlib.blake2b(str(text).encode("utf-8", "surrogatepass"), digest_size=16).digest()


def soft_targets(source: str, texts: list[str], text_column: str, labels: list[str]) -> torch.Tensor | None:
    """The teacher's scores for ``texts`` (rows of the pseudo-labelled file ``source``), as probability
    rows over ``labels``; None when the file holds top labels only."""
    table = pq.read_table(source)
    if TEACHER_SCORES not in table.column_names:
        return None
    teacher = json.loads((table.schema.metadata or {})[TEACHER_LABELS])
    scores = dict(zip(table.column(text_column).to_pylist(), table.column(TEACHER_SCORES).to_pylist(), strict=True))
    order = [teacher.index(name) for name in labels]
    rows = torch.tensor([scores[t] for t in texts], dtype=torch.float32)[:, order]
    return rows / rows.sum(1, keepdim=True)  # an averaged model's scores sum to 1 up to rounding
