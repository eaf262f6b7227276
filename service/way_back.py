"""What a serving worker keeps of each answer, for the way back from production to the next fit.

After each model call, in the batch's thread and before any of its responses is sent: one inference
log line per document (``monitoring.inference_log``, through ``bentoml.monitor``; about 15 us a
document), and the monitor's counters in ``/metrics``. A request answered with a 200 is therefore in
the log even if its worker is killed a moment later. Each answer's id also goes to the feedback store
(so that ``POST /feedback`` can tell an unknown id), but through a queue that a thread of its own
writes (``service.store_writer``): a slow or unreachable database never holds an answer back.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import han
from model_store.production import deployment_dir, note_feedback_store
from monitoring.feedback_store import Prediction, redact
from monitoring.inference_log import InferenceLog, LogSettings, take_lost
from monitoring.profiles import model_facts as read_model_facts
from monitoring.report import expected_right, ks_distance, realised_right
from service.settings import Settings
from service.store_writer import StoreWriter

logger = logging.getLogger("han.service")
WINDOW = 1000  # the documents a worker's shift gauges are computed on
SHIFT_EVERY = 200  # ... recomputed after this many
Answer = tuple[str, str, str, list[str], list[str], list[han.DocumentResult], list[tuple[int, int]]]
# (request_id, model tag, role, ids, texts, results, profiles)


model_facts = functools.lru_cache(64)(read_model_facts)  # a version's files never change


def default_store_path(name: str) -> Path:
    return deployment_dir(name) / "feedback.sqlite3"


class Metrics:
    """The monitor's gauges in /metrics, per model version, summed over workers and replicas by Prometheus:
    documents' expected correctness (estimated accuracy = its rate over han_documents_total's), words and
    unknown words, feedback and its agreement (the report's measure: 1 or 0, or the share of labels right
    for a multi-label model); and each worker's shift distance on its last documents against the training
    profile (the largest across workers)."""

    def __init__(self) -> None:
        from prometheus_client import Counter, Gauge

        self.expected = Counter("han_expected_correct", "Sum over documents of the chance the answer is right, "
                                "from its scores (estimated accuracy: its rate over han_documents_total's)", ["model"])
        self.words = Counter("han_words", "Words read, by model version", ["model"])
        self.unknown = Counter("han_unknown_words", "Words out of the model's vocabulary", ["model"])
        self.feedback = Counter("han_feedback", "Feedback received, by the version that answered", ["model"])
        self.right = Counter("han_feedback_correct", "... how right the answers were (a share for multi-label)",
                             ["model"])
        self.dropped = Counter("han_feedback_store_dropped", "Answers not recorded in the feedback store (its "
                               "queue was full, or it refused the row)")
        self.log_lost = Counter("han_inference_log_lost", "Documents answered whose inference log line could not be "
                                "written (a full disk): answered, not in the log")
        self.shift = Gauge("han_input_shift", "Kolmogorov-Smirnov distance of the last documents' length or "
                           "unknown-word share from the training profile's", ["model", "feature"],
                           multiprocess_mode="max")


class WayBack:
    """One per worker: the log, the store and the counters."""

    def __init__(self, name: str, settings: Settings) -> None:
        self.name = name
        self.log = InferenceLog(name, LogSettings(settings.log, settings.log_text, settings.log_file_mb * 2**20,
                                                  settings.log_max_mb * 2**20))
        self._metrics: Metrics | None = None
        self._metrics_lock = threading.Lock()
        with contextlib.suppress(OSError):  # where han-model monitor must look (None: the default file)
            where = settings.feedback_store
            where = where and (redact(where) if "://" in where else str(Path(where).expanduser().resolve()))
            note_feedback_store(name, where or None)
        self.writer = StoreWriter(settings.feedback_store, default_store_path(name), settings.feedback_retention_days,
                                  lambda: self.metrics.dropped)
        self._recent: dict[str, collections.deque[tuple[int, float]]] = {}
        self._since_shift: dict[str, int] = {}
        self._warned = 0.0

    @property
    def metrics(self) -> Metrics:
        """Created on first use, after BentoML has set up Prometheus's multi-process folder."""
        with self._metrics_lock:
            if self._metrics is None:
                self._metrics = Metrics()
            return self._metrics

    def record(self, answers: Sequence[Answer], profiles_of: dict[str, tuple[dict[str, Any] | None, bool]]) -> None:
        """Log a model call's answers and queue them for the store; never raises (a full disk is logged)."""
        try:
            for (tag, role), rows in _by_version(answers).items():  # one record of the monitor per version
                request_ids, ids, texts, results, profiles = (list(column) for column in zip(*rows, strict=True))
                self.log.write(request_ids, tag, role, ids, texts, results, profiles)
        except Exception as e:  # the answer matters more than its record
            self._warn("cannot write the inference log", e)
        if lost := take_lost():
            with contextlib.suppress(Exception):
                self.metrics.log_lost.inc(lost)
        try:
            now = datetime.now(UTC)
            self.writer.put([(request_id, tag, role, [Prediction(i, r.labels, max(r.scores.values()))
                                                      for i, r in zip(ids, results, strict=True)], now)
                             for request_id, tag, role, ids, _, results, _ in answers])
            for _, tag, role, _, _, results, profiles in answers:
                if role == "production":
                    self._count(tag, results, profiles, *profiles_of.get(tag, (None, False)))
        except Exception as e:
            self._warn("cannot count the answers in /metrics", e)

    def _count(self, tag: str, results: list[han.DocumentResult], profiles: list[tuple[int, int]],
               profile: dict[str, Any] | None, multi_label: bool) -> None:
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
        """Count feedback against the version that answered each id, as the report measures it."""
        for doc_id, (tag, predicted) in answered.items():
            if doc_id in truths:
                facts = model_facts(tag)
                labels, multi = (facts[1], facts[2]) if facts else (sorted(set(predicted) | set(truths[doc_id])), False)
                self.metrics.feedback.labels(model=tag).inc()
                self.metrics.right.labels(model=tag).inc(
                    realised_right({"label": predicted[0] if predicted else "", "labels": predicted},
                                   truths[doc_id], labels, multi))

    def _warn(self, what: str, e: BaseException) -> None:
        if time.monotonic() - self._warned > 60:  # once a minute at most: the log must not flood
            self._warned = time.monotonic()
            logger.error("%s: %s", what, f"{e.__class__.__name__}: {e}".splitlines()[0])


def _by_version(answers: Sequence[Answer]) -> dict[tuple[str, str], list[tuple[Any, ...]]]:
    """The answers' documents as rows (request_id, id, text, result, profile), by (model, role)."""
    out: dict[tuple[str, str], list[tuple[Any, ...]]] = {}
    for request_id, tag, role, ids, texts, results, profiles in answers:
        out.setdefault((tag, role), []).extend(
            (request_id, *row) for row in zip(ids, texts, results, profiles, strict=True))
    return out
