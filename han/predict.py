"""The one inference path: texts in, labels, scores and attention explanations out.

The service, the batch scorer and evaluation all call ``Predictor``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from han.batch import collate_flat, length_sorted_chunks
from han.model import HANOutput
from han.saved_model import SavedModel
from han.segment import Segment, Segmenter


class InvalidDocumentError(ValueError):
    """A document that cannot be classified; ``index`` is its position in the input."""

    def __init__(self, index: int, reason: str) -> None:
        super().__init__(f"document {index}: {reason}")
        self.index = index
        self.reason = reason


@dataclass
class WordWeight:
    text: str
    start: int
    end: int
    weight: float


@dataclass
class SentenceWeight:
    text: str
    start: int
    end: int
    weight: float
    words: list[WordWeight]


@dataclass
class Prediction:
    label: str  # the top label
    labels: list[str]  # every label over the threshold (multi-label), else [label]
    scores: dict[str, float]  # every label's probability
    truncated: bool  # the document was cut to the model's caps
    sentences: list[SentenceWeight] | None = None  # the explanation, when asked for


def document_problem(text: object) -> str | None:
    """Why ``text`` cannot be a document (not a string, or no non-space character), else None."""
    if not isinstance(text, str):
        return f"must be a string, not {type(text).__name__}"
    if not text.strip():
        return "is empty or whitespace only"
    return None


class Predictor:
    """Classifies and explains documents with a SavedModel, batching internally."""

    def __init__(self, saved: SavedModel, batch_size: int = 64, max_batch_tokens: int = 16_384) -> None:
        self.saved = saved
        self.model = saved.model.eval()
        self.labels = saved.labels
        self.multi_label = saved.model.config.multi_label
        self.segmenter = Segmenter(saved.segmenter)
        self.batch_size = batch_size
        self.max_batch_tokens = max_batch_tokens

    @classmethod
    def from_directory(cls, path: str | Path, **kwargs: int) -> Predictor:
        return cls(SavedModel.load(path), **kwargs)

    def segment(self, texts: Iterable[str]) -> list[Segment]:
        """Segment documents; raises InvalidDocumentError naming the first bad one."""
        texts = list(texts)
        for i, text in enumerate(texts):
            problem = document_problem(text)
            if problem:
                raise InvalidDocumentError(i, f"the document {problem}")
        segments = list(self.segmenter.segment_many(texts))
        for i, segment in enumerate(segments):
            if segment.is_empty:
                raise InvalidDocumentError(i, "the document has no words (only whitespace or markup)")
        return segments

    def predict(self, texts: Sequence[str], explain: bool = True) -> list[Prediction]:
        """Classify documents, in input order; raises InvalidDocumentError for a bad one."""
        return self.predict_segments(self.segment(texts), explain=explain)

    def encode(self, segment: Segment) -> tuple[np.ndarray, np.ndarray]:
        """A segment as the model's flat input: (all word ids, words per sentence)."""
        encode = self.saved.vocab.encode
        ids = np.fromiter((i for keys in segment.token_keys for i in encode(keys)), dtype=np.int64)
        return ids, np.fromiter(map(len, segment.token_keys), dtype=np.int64)

    @torch.inference_mode()
    def forward_chunks(self, encoded: Sequence[tuple[np.ndarray, np.ndarray]]) -> Iterator[tuple[list[int], HANOutput]]:
        """Run the model over encoded documents in length-sorted batches: yields (indices, output)."""
        sizes = [len(ids) for ids, _ in encoded]
        for chunk in length_sorted_chunks(sizes, self.batch_size, self.max_batch_tokens):
            yield chunk, self.model(*collate_flat([encoded[i] for i in chunk]))

    def probabilities(self, encoded: Sequence[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
        """Label probabilities [documents, labels] for encoded documents, in input order."""
        probs = np.zeros((len(encoded), len(self.labels)), dtype=np.float32)
        for chunk, out in self.forward_chunks(encoded):
            probs[chunk] = self.model.probabilities(out.logits).numpy()
        return probs

    def decide(self, probs: Sequence[float]) -> tuple[str, list[str]]:
        """The top label, and the chosen labels (over the threshold if multi-label, else the top one)."""
        top = self.labels[max(range(len(probs)), key=probs.__getitem__)]
        if self.multi_label:
            return top, [label for label, p in zip(self.labels, probs, strict=True) if p >= self.saved.threshold]
        return top, [top]

    def predict_segments(self, segments: Sequence[Segment], explain: bool = True) -> list[Prediction]:
        """Classify already-segmented, non-empty documents, in input order."""
        results: list[Prediction | None] = [None] * len(segments)
        for chunk, out in self.forward_chunks([self.encode(s) for s in segments]):
            probs = self.model.probabilities(out.logits).tolist()
            for row, i in enumerate(chunk):
                results[i] = self._prediction(
                    segments[i],
                    probs[row],
                    out.sentence_weights[row] if explain else None,
                    out.word_weights[row] if explain else None,
                )
        return results  # type: ignore[return-value]

    def _prediction(
        self,
        segment: Segment,
        probs: list[float],
        sentence_weights: torch.Tensor | None,
        word_weights: torch.Tensor | None,
    ) -> Prediction:
        label, labels = self.decide(probs)
        prediction = Prediction(label, labels, dict(zip(self.labels, probs, strict=True)), segment.truncated)
        if sentence_weights is not None and word_weights is not None:
            n = len(segment.sentence_spans)
            sw = sentence_weights[:n].tolist()
            ww = word_weights[:n].tolist()
            text = segment.text
            prediction.sentences = [
                SentenceWeight(
                    text[start:end],
                    start,
                    end,
                    sw[s],
                    [WordWeight(text[a:b], a, b, ww[s][w]) for w, (a, b) in enumerate(segment.token_spans[s])],
                )
                for s, (start, end) in enumerate(segment.sentence_spans)
            ]
        return prediction
