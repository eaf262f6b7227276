"""What a serving worker keeps of each answer, for the way back from production to the next fit.

After each model call, in the batch's thread and before any of its responses is sent: one inference
log line per document (``monitoring.inference_log``, through ``bentoml.monitor``), one prediction row
per document in the feedback store (so that ``POST /feedback`` can check ids), and the monitor's
counters in ``/metrics``. A request answered with a 200 is therefore in the log even if its worker is
killed a moment later. A copy of a share of the requests goes to the shadow, if one is running.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import han
from model_store.production import deployment_dir
from monitoring.feedback_store import FeedbackStore, Prediction, StoreError, open_store
from monitoring.inference_log import InferenceLog, LogSettings
from monitoring.report import expected_right, ks_distance
from service.settings import Settings

logger = logging.getLogger("han.service")
WINDOW = 1000  # the documents a worker's shift gauges are computed on
SHIFT_EVERY = 200  # ... recomputed after this many
Answer = tuple[str, str, str, list[str], list[str], list[han.DocumentResult], list[tuple[int, int]]]
# (request_id, model tag, role, ids, texts, results, profiles)


def feedback_store(name: str, settings: Settings) -> FeedbackStore:
    """The store ``$HAN_FEEDBACK_STORE`` names, else the SQLite file beside the production pointer."""
    return open_store(settings.feedback_store, default_store_path(name))


def default_store_path(name: str) -> Path:
    return deployment_dir(name) / "feedback.sqlite3"


def _by_version(answers: Sequence[Answer]) -> dict[tuple[str, str], list[tuple[Any, ...]]]:
    """The answers' documents as rows (request_id, id, text, result, profile), by (model, role)."""
    out: dict[tuple[str, str], list[tuple[Any, ...]]] = {}
    for request_id, tag, role, ids, texts, results, profiles in answers:
        out.setdefault((tag, role), []).extend(
            (request_id, *row) for row in zip(ids, texts, results, profiles, strict=True))
    return out


class Metrics:
    """The monitor's gauges in /metrics, per model version, summed over workers and replicas by Prometheus:
    documents' expected correctness (estimated accuracy = its rate over han_documents_total's), words and
    unknown words, feedback and feedback that agreed; and each worker's shift distance on its last
    documents against the training profile (the largest across workers)."""

    def __init__(self) -> None:
        from prometheus_client import Counter, Gauge

        self.expected = Counter("han_expected_correct", "Sum over documents of the chance the answer is right, "
                                "from its scores (estimated accuracy: its rate over han_documents_total's)", ["model"])
        self.words = Counter("han_words", "Words read, by model version", ["model"])
        self.unknown = Counter("han_unknown_words", "Words out of the model's vocabulary", ["model"])
        self.feedback = Counter("han_feedback", "Documents given feedback, by the version that answered", ["model"])
        self.right = Counter("han_feedback_correct", "... of which the answer was right", ["model"])
        self.shift = Gauge("han_input_shift", "Kolmogorov-Smirnov distance of the last documents' length or "
                           "unknown-word share from the training profile's", ["model", "feature"],
                           multiprocess_mode="max")


class WayBack:
    """One per worker: the log, the store and the counters."""

    def __init__(self, name: str, settings: Settings) -> None:
        self.name = name
        self.log = InferenceLog(name, LogSettings(settings.log, settings.log_text, settings.log_file_mb * 2**20,
                                                  settings.log_max_mb * 2**20))
        self.store = feedback_store(name, settings)
        self.metrics: Metrics | None = None
        self._recent: dict[str, collections.deque[tuple[int, float]]] = {}
        self._since_shift: dict[str, int] = {}
        self._warned = 0.0

    def record(self, answers: Sequence[Answer], profiles_of: dict[str, tuple[dict[str, Any] | None, bool]]) -> None:
        """Log and store a model call's answers; never raises (a full disk or a lost database is logged)."""
        try:
            for (tag, role), rows in _by_version(answers).items():  # one record of the monitor per version
                request_ids, ids, texts, results, profiles = (list(column) for column in zip(*rows, strict=True))
                self.log.write(request_ids, tag, role, ids, texts, results, profiles)
        except Exception as e:  # the answer matters more than its record
            self._warn("cannot write the inference log", e)
        try:
            self.store.record_many([(request_id, tag, role, [Prediction(i, r.labels, max(r.scores.values()))
                                                             for i, r in zip(ids, results, strict=True)])
                                    for request_id, tag, role, ids, _, results, _ in answers])
        except (StoreError, Exception) as e:
            self._warn("cannot record predictions in the feedback store", e)
        for _, tag, role, _, _, results, profiles in answers:
            if role == "production":
                self._count(tag, results, profiles, *profiles_of.get(tag, (None, False)))

    def _count(self, tag: str, results: list[han.DocumentResult], profiles: list[tuple[int, int]],
               profile: dict[str, Any] | None, multi_label: bool) -> None:
        if self.metrics is None:
            self.metrics = Metrics()  # after BentoML has set up Prometheus's multi-process folder
        m = self.metrics
        m.expected.labels(model=tag).inc(sum(expected_right({"scores": r.scores, "labels": r.labels}, profile,
                                                            multi_label) for r in results))
        m.words.labels(model=tag).inc(sum(w for w, _ in profiles))
        m.unknown.labels(model=tag).inc(sum(u for _, u in profiles))
        recent = self._recent.setdefault(tag, collections.deque(maxlen=WINDOW))
        recent.extend((w, u / w if w else 0.0) for w, u in profiles)
        self._since_shift[tag] = self._since_shift.get(tag, 0) + len(profiles)
        if profile and self._since_shift[tag] >= SHIFT_EVERY and len(recent) >= SHIFT_EVERY:
            self._since_shift[tag] = 0
            for k, feature in ((0, "words"), (1, "oov")):
                if profile.get(feature):
                    distance = ks_distance([x[k] for x in recent], profile[feature])
                    m.shift.labels(model=tag, feature=feature).set(distance)

    def feedback_counted(self, answered: dict[str, tuple[str, list[str]]], truths: dict[str, list[str]]) -> None:
        """Count feedback against the version that answered each id."""
        if self.metrics is None:
            self.metrics = Metrics()
        for doc_id, (tag, predicted) in answered.items():
            if doc_id in truths:
                self.metrics.feedback.labels(model=tag).inc()
                if sorted(predicted) == sorted(truths[doc_id]):
                    self.metrics.right.labels(model=tag).inc()

    def _warn(self, what: str, e: BaseException) -> None:
        if time.monotonic() - self._warned > 60:  # once a minute at most: the log must not flood
            self._warned = time.monotonic()
            logger.error("%s: %s", what, f"{e.__class__.__name__}: {e}".splitlines()[0])
