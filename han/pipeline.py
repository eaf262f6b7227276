"""The one inference path: texts in, DocumentResults out.

    check -> segment -> encode -> forward -> scores (calibrated) -> decide -> explain

The service, han-score, the evaluation report and ``han-train predict`` all call
``Pipeline.__call__``, which batches inside (documents sorted by length into model batches,
results back in input order). The stages are methods so that a caller can see and test each one.
"""

from __future__ import annotations

import gc
import heapq
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np

from han.batch import length_sorted_chunks
from han.methods import ON_TORCH, WITHIN_SENTENCE, explain_method
from han.numpy_forward import Forward, NumpyHAN
from han.results import DECIMALS, DocumentError, DocumentResult, SentenceWeight, WordWeight
from han.saved_model import SavedModel
from han.segment import Segment, Segmenter, token_key

if TYPE_CHECKING:
    from han.model import HAN

Encoded = tuple[np.ndarray, np.ndarray]  # (all word ids, words per sentence)
# Told (stage, documents just done) as a long call advances: "segment", then "classify" (a progress bar's feed).
Progress = Callable[[str, int], object]
EMPTY_REASON = "the document has no words (only whitespace or markup)"
WORD_ID_CACHE = 25_000  # word ids kept by word hash (see Pipeline.encode)
WINDOW = 8_192  # documents segmented and classified at a time (Pipeline._run)


def _told(segments: Iterable[Segment], progress: Progress, every: int = 256) -> Iterator[Segment]:
    """``segments`` as they come, telling ``progress`` every ``every`` documents and at the end."""
    n = 0
    for n, segment in enumerate(segments, 1):
        yield segment
        if n % every == 0:
            progress("segment", every)
    if n % every:
        progress("segment", n % every)


class InvalidDocumentError(ValueError):
    """A document that cannot be classified; ``index`` is its position in the input."""

    def __init__(self, index: int, reason: str) -> None:
        super().__init__(f"document {index}: {reason}")
        self.index = index
        self.reason = reason


@dataclass(frozen=True)
class TopK:
    """Explain with only the ``sentences`` heaviest sentences and ``words`` heaviest words."""

    sentences: int = 3
    words: int = 5


Errors = Literal["raise", "return"]


def document_problem(text: object) -> str | None:
    """Why ``text`` cannot be a document, in the words every caller reports, else None."""
    if text is None:
        return "the text is missing (null)"
    if not isinstance(text, str):
        return f"the document must be a string, not {type(text).__name__}"
    if not text.strip():
        return "the document is empty or whitespace only"
    return None


class Pipeline:
    """Classifies and explains documents with a SavedModel."""

    def __init__(self, saved: SavedModel, batch_size: int = 64, max_batch_tokens: int = 16_384) -> None:
        self.saved = saved
        self.network = NumpyHAN(saved.config, saved.weights)  # the forward without gradients, no torch
        self.labels = saved.labels
        self.multi_label = saved.config.multi_label
        self.segmenter = Segmenter(saved.segmenter)
        self.batch_size = batch_size
        self.max_batch_tokens = max_batch_tokens
        self._ids: dict[int, int] = {}  # word text hash -> word id (see encode)

    @property
    def model(self) -> HAN:
        """The torch network in evaluation mode (the gradient-based explanations): built, and torch imported,
        on first use."""
        return self.saved.model.eval()

    @classmethod
    def from_directory(cls, path: str | Path, **kwargs: int) -> Pipeline:
        return cls(SavedModel.load(path), **kwargs)

    def release_caches(self) -> None:
        """Drop the caches (word ids, the segmenter's spaCy vocabulary, the n-gram head's hashes), so that
        an idle serving worker returns to its size at start. The old segmenter is collected before the new
        one is built, whose objects would otherwise land among a burst's garbage and pin its memory arenas."""
        self._ids = {}
        if self.saved.ngrams is not None:
            self.saved.ngrams.release_cache()
        del self.segmenter
        gc.collect()
        self.segmenter = Segmenter(self.saved.segmenter)

    def __call__(
        self, texts: Sequence[object], explain: bool | str | None = None, errors: Errors = "raise",
        top: TopK | None = None, profiles: list[tuple[int, int]] | None = None,
    ) -> list[DocumentResult | DocumentError]:
        """Classify ``texts`` in input order. ``explain``: None or False none, True the default method, or
        a method's name (han.methods.explain_method); ``top``: only the top k sentences and words, else
        all. A bad document raises InvalidDocumentError (the first one) with ``errors="raise"``; with
        ``errors="return"`` it gets a DocumentError in its place. ``profiles``, if given, is filled with
        each document's (words the model read, those of them out of its vocabulary): what the inference
        log and the monitor compare with the training data's profile."""
        return self._run(texts, explain_method(explain), top, errors, None, profiles=profiles)

    def with_logits(
        self, texts: Sequence[str], progress: Progress | None = None
    ) -> tuple[list[DocumentResult], np.ndarray]:
        """``__call__`` (no explanation, bad documents raise) that also returns the raw logits
        [documents, labels], before calibration: what evaluation needs to measure it. ``progress``
        hears of each model batch and every few hundred documents segmented, inside the one call, so
        the results are those of a call without it."""
        logits = np.zeros((len(texts), len(self.labels)), dtype=np.float32)
        return self._run(texts, None, None, "raise", logits, progress), logits  # type: ignore[return-value]

    def with_vectors(
        self, texts: Sequence[object], progress: Progress | None = None
    ) -> tuple[list[DocumentResult | DocumentError], np.ndarray]:
        """``__call__`` (no explanation, bad documents returned as DocumentError) that also returns each
        document's vector, the attention-weighted sum its head reads [documents, 2 * sentence_hidden]
        (zeros for a bad document): what a batch-diverse query (han-label) clusters."""
        width = self.network.head_width
        vectors = np.zeros((len(texts), width), dtype=np.float32)
        return self._run(texts, None, None, "return", None, progress, vectors=vectors), vectors

    def _run(
        self,
        texts: Sequence[object],
        method: str | None,
        top: TopK | None,
        errors: Errors,
        logits: np.ndarray | None,
        progress: Progress | None = None,
        profiles: list[tuple[int, int]] | None = None,
        vectors: np.ndarray | None = None,
    ) -> list[DocumentResult | DocumentError]:
        """``__call__``; ``method`` None: no explanation. A window of ``WINDOW`` documents at a time, so
        that evaluating a large split holds one window's segments, not the split's."""
        out: list[DocumentResult | DocumentError] = []
        if profiles is not None:
            profiles[:] = [(0, 0)] * len(texts)
        for start in range(0, len(texts), WINDOW):
            end = min(start + WINDOW, len(texts))
            window_profiles: list[tuple[int, int]] | None = None if profiles is None else []
            out += self._window(texts[start:end], start, method, top, errors,
                                None if logits is None else logits[start:end], progress, window_profiles,
                                None if vectors is None else vectors[start:end])
            if profiles is not None and window_profiles is not None:
                profiles[start:end] = window_profiles
        return out

    def _window(
        self,
        texts: Sequence[object],
        offset: int,
        method: str | None,
        top: TopK | None,
        errors: Errors,
        logits: np.ndarray | None,
        progress: Progress | None,
        profiles: list[tuple[int, int]] | None,
        vectors: np.ndarray | None,
    ) -> list[DocumentResult | DocumentError]:
        """``_run`` over one window of documents, the first of which is the input's ``offset``-th (the
        index its errors name); ``logits`` and ``vectors`` are the window's rows."""
        out: list[DocumentResult | DocumentError | None] = [None] * len(texts)
        valid = []
        for i, text in enumerate(texts):
            problem = document_problem(text)
            if problem is None:
                valid.append(i)
            elif errors == "raise":
                raise InvalidDocumentError(offset + i, problem)
            else:
                out[i] = DocumentError(offset + i, problem)
        kept, segments = [], []
        documents: list[str] = [texts[i] for i in valid]  # type: ignore[misc]
        segmented = (
            self.segment(documents) if progress is None else _told(self.segmenter.segment_many(documents), progress)
        )
        cap = self.saved.segmenter.max_chars  # the head reads what the HAN reads, no more
        for i, segment in zip(valid, segmented, strict=True):
            if not segment.is_empty:
                kept.append(i)
                segments.append(segment)
                continue
            reason = EMPTY_REASON if len(texts[i]) <= cap else f"the document has no word within its first {cap:,} " \
                "characters, where the model stops reading"  # type: ignore[arg-type]
            if errors == "raise":
                raise InvalidDocumentError(offset + i, reason)
            out[i] = DocumentError(offset + i, reason)
        head = self.saved.ngrams
        # the head reads each text once: its probabilities and, to explain, its evidence
        reading = None if head is None else head.read((texts[i][:cap] for i in kept), evidence=method is not None)  # type: ignore[index]
        head_probs = None if reading is None else reading.probs
        encoded = self.encode_many(segments)
        if profiles is not None:
            profiles[:] = [(0, 0)] * len(texts)
            unk = self.saved.vocab.unk_id
            for k, (ids, _) in zip(kept, encoded, strict=True):
                profiles[k] = (len(ids), int(np.count_nonzero(ids == unk)))
        for chunk, output in self.forward(encoded, method or "attention", head_probs):
            if vectors is not None:
                vectors[[kept[k] for k in chunk]] = output.document_vectors
            if logits is not None:
                logits[[kept[k] for k in chunk]] = output.logits
            probs = self.scores(output.logits, None if head_probs is None else head_probs[chunk])
            for row, k in enumerate(chunk):
                result = self.decide(probs[row].tolist(), segments[k].truncated)
                if method is not None:
                    result.method = method
                    self.explain(result, segments[k], output.sentence_weights[row], output.word_weights[row], top)
                    if reading is not None:
                        result.top_ngrams = head.evidence_of(reading, k, self.labels.index(result.label))  # type: ignore[union-attr]
                out[kept[k]] = result
            if progress is not None:
                progress("classify", len(chunk))
        return out  # type: ignore[return-value]

    # -- the stages ------------------------------------------------------------------------------
    def segment(self, texts: Sequence[str]) -> list[Segment]:
        """Sentences and words with character offsets (an empty Segment for a document without words)."""
        return list(self.segmenter.segment_many(texts))

    def encode(self, segment: Segment) -> Encoded:
        """A segment as the model's flat input: (all word ids, words per sentence)."""
        return self.encode_many([segment])[0]

    def encode_many(self, segments: Sequence[Segment]) -> list[Encoded]:
        """Segments as the model's flat input, each (all word ids, words per sentence).

        Each distinct word of them all is looked up once (a window of reviews repeats its common words
        thousands of times), by the hash of its text, in a cache: a word seen before costs no key built.
        Bounded: a stream of ever-new words empties it now and then (``WORD_ID_CACHE``: the common words
        fit, and a serving worker holds little at rest)."""
        if not segments:
            return []
        sizes = np.fromiter((len(s.hashes) for s in segments), dtype=np.int64, count=len(segments))
        ends = np.cumsum(sizes)
        distinct, first, inverse = np.unique(np.concatenate([s.hashes for s in segments]), return_index=True,
                                             return_inverse=True)
        cache = self._ids
        ids = [cache.get(h) for h in distinct.tolist()]
        if None in ids:
            if len(cache) > WORD_ID_CACHE:
                cache.clear()
            stoi, unk = self.saved.vocab.stoi, self.saved.vocab.unk_id
            owner = np.searchsorted(ends, first, side="right")  # the segment where each word first occurs
            at = first - (ends - sizes)[owner]  # and its place there
            for k, h in enumerate(distinct.tolist()):
                if ids[k] is None:
                    segment, i = segments[owner[k]], at[k]
                    ids[k] = cache[h] = stoi.get(token_key(segment.text[segment.starts[i]:segment.ends[i]]), unk)
        words = np.array(ids, dtype=np.int64)[inverse.reshape(-1)]
        return [(part, s.lengths) for part, s in zip(np.split(words, ends[:-1]), segments, strict=True)]

    def forward(self, encoded: Sequence[Encoded], method: str = "attention",
                head: np.ndarray | None = None) -> Iterator[tuple[list[int], Forward]]:
        """Run the model over encoded documents in length-sorted batches: yields (indices, output),
        the output's weights those of the explanation ``method`` (see han.attribution). Attention, and no
        explanation, run ``han.numpy_forward``; the gradient-based methods the torch network. ``head``:
        the n-gram head's probabilities of the same documents, so that a signed method explains the label
        the averaged scores choose, not the HAN's own top label."""
        sizes = [len(ids) for ids, _ in encoded]
        for chunk in length_sorted_chunks(sizes, self.batch_size, self.max_batch_tokens):
            documents = [encoded[i] for i in chunk]
            ids = np.concatenate([ids for ids, _ in documents])
            sentences = np.concatenate([lengths for _, lengths in documents]).astype(np.int64, copy=False)
            lengths = np.fromiter((len(lengths) for _, lengths in documents), dtype=np.int64, count=len(documents))
            if method in ON_TORCH:
                plain = None if head is None else self.network(ids, sentences, lengths)
                yield chunk, self._attributed(documents, method, plain, None if head is None else head[chunk])
            else:
                yield chunk, self.network(ids, sentences, lengths)

    def _attributed(self, documents: Sequence[Encoded], method: str, plain: Forward | None,
                    head: np.ndarray | None) -> Forward:
        """A gradient-based method's logits and weights (han.attribution, on torch) for one batch; with the
        n-gram head's probabilities, for the label that ``plain``'s logits and they choose together."""
        import torch

        from han.attribution import attribute
        from han.batch import collate_flat

        target = None if plain is None else torch.from_numpy(self.scores(plain.logits, head).argmax(1))
        logits, sentence_weights, word_weights = attribute(self.model, collate_flat(documents), method, target)
        return Forward(logits.numpy(), word_weights.numpy(), sentence_weights.numpy(), None)

    def scores(self, logits: np.ndarray, head: np.ndarray | None = None) -> np.ndarray:
        """Calibrated label probabilities [documents, labels]: of logits / the model's temperature,
        averaged with ``head``, the n-gram head's probabilities of the same documents, when given."""
        t = self.saved.temperature
        probs = self.network.probabilities(logits / t if t != 1.0 else logits)
        if head is not None:
            probs = self.saved.ngrams.mix(probs, head)  # type: ignore[union-attr]
        return np.round(probs, DECIMALS)

    def decide(self, probs: list[float], truncated: bool) -> DocumentResult:
        """The top label and the chosen labels (at or over the threshold if multi-label, else the top one)."""
        top = self.labels[max(range(len(probs)), key=probs.__getitem__)]
        if self.multi_label:
            chosen = [label for label, p in zip(self.labels, probs, strict=True) if p >= self.saved.threshold]
        else:
            chosen = [top]
        return DocumentResult(top, chosen, dict(zip(self.labels, probs, strict=True)), truncated)

    def explain(
        self,
        result: DocumentResult,
        segment: Segment,
        sentence_weights: np.ndarray,
        word_weights: np.ndarray,
        top: TopK | None = None,
    ) -> None:
        """Attach the explanation: every sentence and word, or (``top``) the top k of each by magnitude
        (an attention word's weight is then its sentence's weight times its weight within the sentence,
        so that words compare across sentences)."""
        n = len(segment.lengths)
        text = segment.text
        real = np.arange(word_weights.shape[1]) < segment.lengths[:, None]  # [n, width]: the words, in order
        starts, ends = segment.starts.tolist(), segment.ends.tolist()
        if top is None:
            sw = np.round(sentence_weights[:n].astype(np.float64), DECIMALS).tolist()
            ww = np.round(word_weights[:n].astype(np.float64), DECIMALS)[real].tolist()
            words = list(map(WordWeight, map(text.__getitem__, map(slice, starts, ends)), starts, ends, ww))
            result.sentences = [
                SentenceWeight(text[start:end], start, end, sw[s], sentence_words)
                for s, ((start, end), sentence_words) in enumerate(
                    zip(segment.sentence_spans, segment.per_sentence(words), strict=True)
                )
            ]
            return
        sw = sentence_weights[:n].astype(np.float64)
        top_s = heapq.nlargest(top.sentences, range(n), key=lambda s: abs(sw[s]))
        result.top_sentences = [
            SentenceWeight(text[a:b], a, b, round(float(sw[s]), DECIMALS))
            for s in top_s
            for a, b in [segment.sentence_spans[s]]
        ]
        doc_weights = word_weights[:n].astype(np.float64)
        if result.method in WITHIN_SENTENCE:
            doc_weights = sw[:, None] * doc_weights
        doc_weights = doc_weights[real]  # one per word, in reading order
        # The heaviest by magnitude, ties in reading order (as sorted(..., reverse=True) would give).
        top_w = np.argsort(-np.abs(doc_weights), kind="stable")[: top.words].tolist()
        result.top_words = [
            WordWeight(text[starts[w] : ends[w]], starts[w], ends[w], round(float(doc_weights[w]), DECIMALS))
            for w in top_w
        ]
