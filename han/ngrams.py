"""The n-gram head: TF-IDF word 1-2 grams and a linear layer, whose probabilities are averaged with the HAN's.

With a few thousand labelled long documents a linear model over word n-grams is hard to beat, and it
errs on other documents than the HAN does: averaged, the two score above either. A fit trains the
baseline anyway (training.baseline); when averaging it with the HAN scores better on validation, the
exported model keeps it as this head, and every caller's scores become
``han_share * HAN + (1 - han_share) * head``.

It computes exactly what scikit-learn's ``TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True)``
and ``LogisticRegression.predict_proba`` compute, without scikit-learn: lowercase, the token pattern
(``TOKEN``), ``1 + log(count)`` times the idf, L2-normalised, then a softmax of the linear layer (a
sigmoid per label for multi-label data, one-vs-rest). The n-grams are kept as sorted 64-bit hashes,
so the head is plain arrays (no word list to load); a hashed head (training.hashed_ngrams) keeps
their buckets instead, a table of fixed size whatever the corpus.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from hashlib import blake2b
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

from han.results import NgramWeight

# Scripts written without spaces between words (Thai, Japanese kana, CJK ideographs, half-width katakana):
# each character is a token, so their 1-2 grams are characters and character pairs, as TF-IDF over such
# text is usually built; a whole clause as one token would match nothing it had not seen word for word.
# Elsewhere scikit-learn's default pattern: a run of two or more word characters (the same tokens).
UNSPACED = "\u0e00-\u0e7f\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f"
TOKEN = re.compile(rf"(?u)[{UNSPACED}]|[^\W{UNSPACED}]{{2,}}")  # a negated class: no slower than the default
TOKEN_BEFORE_UNSPACED = re.compile(r"(?u)\b\w\w+\b")  # heads saved before 2026-11-29 (no "tokens" entry)
TOKENS_VERSION = 2
MIX = np.uint64(0x9E3779B97F4A7C15)  # a bigram's hash: first * MIX + second (mod 2**64)
TOP_NGRAMS = 5


def token_hash(token: str) -> int:
    """A token's 64-bit hash, the same in every process (Python's ``hash`` of a str is not)."""
    return int.from_bytes(blake2b(token.encode("utf-8"), digest_size=8).digest(), "little")


def ngram_hashes(unigrams: np.ndarray) -> np.ndarray:
    """The hashes of a document's 1-grams then 2-grams, in the order scikit-learn's analyser gives them."""
    with np.errstate(over="ignore"):
        return np.concatenate([unigrams, unigrams[:-1] * MIX + unigrams[1:]])


class NgramHasher:
    """A document's 1-2 grams as keys: 64-bit hashes, or with ``buckets`` their bucket (hash mod buckets,
    fastText's and Vowpal Wabbit's scheme: a fixed table whatever the corpus). Keeps each token's hash
    (a miss costs one blake2b) up to about 8 MB."""

    def __init__(self, buckets: int = 0, tokens: int = TOKENS_VERSION) -> None:
        if buckets < 0:
            raise ValueError(f"buckets must be 0 (exact hashes) or positive, not {buckets}")
        self.buckets = int(buckets)
        self.tokens_version = tokens
        self.pattern = TOKEN if tokens == TOKENS_VERSION else TOKEN_BEFORE_UNSPACED
        self._hashes: dict[str, int] = {}

    def release_cache(self) -> None:
        """Forget the token hashes kept so far."""
        self._hashes = {}

    def token_hashes(self, tokens: list[str]) -> list[int]:
        cache = self._hashes
        if len(cache) > 50_000:
            cache.clear()
        hashes = [cache.get(t) for t in tokens]
        if None in hashes:
            for i, h in enumerate(hashes):
                if h is None:
                    hashes[i] = cache[tokens[i]] = token_hash(tokens[i])
        return hashes  # type: ignore[return-value]

    def keyed(self, grams: np.ndarray) -> np.ndarray:
        """N-gram hashes as keys: themselves, or their bucket."""
        return grams % np.uint64(self.buckets) if self.buckets else grams

    def tokens(self, text: str) -> tuple[list[str], np.ndarray]:
        """A document's tokens and the keys of its 1-grams then 2-grams (``ngram_hashes``' order)."""
        tokens = self.pattern.findall(text.lower())
        return tokens, self.keyed(ngram_hashes(np.array(self.token_hashes(tokens), dtype=np.uint64)))

    def grams(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(document, key) of every 1-gram and 2-gram of ``texts``, 1-grams first (a 2-gram never spans
        two documents): what the head looks up, and what a hashed fit counts (training.hashed_ngrams)."""
        owner, keys, _, _ = self._grams(texts, keep_tokens=False)
        return owner, keys

    def _grams(self, texts: Sequence[str], keep_tokens: bool) -> tuple[np.ndarray, np.ndarray, list[str], np.ndarray]:
        """``grams`` and, with ``keep_tokens``, every document's tokens in one list and each gram's first
        token's index in it (a 1-gram's own, a 2-gram's first word's)."""
        hashes: list[int] = []
        lengths: list[int] = []
        words: list[str] = []
        for text in texts:
            tokens = self.pattern.findall(text.lower())
            hashes += self.token_hashes(tokens)
            lengths.append(len(tokens))
            if keep_tokens:
                words += tokens
        unigrams = np.array(hashes, dtype=np.uint64)
        doc = np.repeat(np.arange(len(texts)), lengths)
        inside = doc[:-1] == doc[1:]
        with np.errstate(over="ignore"):
            bigrams = unigrams[:-1][inside] * MIX + unigrams[1:][inside]
        first = np.concatenate([np.arange(len(unigrams)), np.flatnonzero(inside)]) if keep_tokens else np.zeros(0)
        return np.concatenate([doc, doc[:-1][inside]]), self.keyed(np.concatenate([unigrams, bigrams])), words, first

    def tfidf(self, texts: Sequence[str], keys: np.ndarray, idf: np.ndarray,
              column_of: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(document, column, value): the L2-normalised sublinear tf-idf of ``texts`` over ``keys``
        (sorted; column i is keys[i], weighted by idf[i]), one entry per document and known key, in a
        few array operations (a handful of numpy calls per document cost more than the arithmetic).
        ``column_of``: each bucket's column or -1 (``column_map``), a look-up in place of a search."""
        rows, columns, values, _ = self._tfidf(self.grams(texts), len(texts), keys, idf, column_of)
        return rows, columns, values

    @staticmethod
    def _tfidf(grams: tuple[np.ndarray, np.ndarray], n: int, keys: np.ndarray, idf: np.ndarray,
               column_of: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``tfidf`` of grams already read, and where each entry's key first occurs among them."""
        owner, found = grams
        if not len(found) or not len(keys):
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty, np.zeros(0), empty
        if column_of is not None:
            where = column_of[found.astype(np.int64)].astype(np.int64)
        else:  # each distinct key searched once, in order: a quarter of the time of a search per gram
            distinct, inverse = np.unique(found, return_inverse=True)
            at = np.minimum(np.searchsorted(keys, distinct), len(keys) - 1)
            where = np.where(keys[at] == distinct, at, -1)[inverse.reshape(-1)]
        known = np.flatnonzero(where >= 0)
        pairs, first, counts = np.unique(owner[known] * len(keys) + where[known], return_index=True,
                                         return_counts=True)
        rows, columns = pairs // len(keys), pairs % len(keys)
        values = (1.0 + np.log(counts)) * idf[columns]
        norms = np.sqrt(np.bincount(rows, values * values, minlength=n))
        return rows, columns, values / norms[rows], known[first]


def column_map(keys: np.ndarray, buckets: int) -> np.ndarray:
    """Each bucket's column among ``keys`` (the kept buckets), -1 for the others: 4 bytes a bucket."""
    out = np.full(buckets, -1, dtype=np.int32)
    out[keys.astype(np.int64)] = np.arange(len(keys), dtype=np.int32)
    return out


@dataclass(frozen=True)
class HeadReading:
    """What the head read in a call: ``probs`` [documents, labels] and, when kept for explanations, the
    entries (``rows`` sorted, ``columns``, tf-idf ``values``) with each entry's first 1-gram or 2-gram
    (``token``: its first word's index in ``tokens``; ``bigram``), so ``NgramHead.evidence_of`` needs
    no second pass over the text."""

    probs: np.ndarray
    rows: np.ndarray | None = None
    columns: np.ndarray | None = None
    values: np.ndarray | None = None
    token: np.ndarray | None = None
    bigram: np.ndarray | None = None
    tokens: list[str] | None = None


class NgramHead:
    """TF-IDF 1-2 grams and a linear layer over the model's labels (see the module docstring).

    ``keys``: the n-gram hashes, sorted; ``idf``: one per key; ``coef``: [labels, keys] (single-label:
    centred over the labels, which leaves the softmax as it is and makes a binary model's two rows
    opposites); ``intercept``: [labels]; ``han_share``: the HAN's weight in the averaged scores;
    ``multi_label``: a sigmoid per label instead of the softmax.
    """

    FILE = "ngram_head.safetensors"

    def __init__(self, keys: np.ndarray, idf: np.ndarray, coef: np.ndarray, intercept: np.ndarray,
                 han_share: float, multi_label: bool = False, buckets: int = 0, tokens: int = TOKENS_VERSION) -> None:
        if not (keys.ndim == 1 and idf.shape == keys.shape and coef.ndim == 2 and coef.shape[1] == len(keys)
                and intercept.shape == (coef.shape[0],)):
            raise ValueError(f"mismatched n-gram head arrays: keys {keys.shape}, idf {idf.shape}, "
                             f"coef {coef.shape}, intercept {intercept.shape}")
        if len(keys) > 1 and not np.all(keys[1:] > keys[:-1]):
            raise ValueError("the n-gram head's keys are not sorted and unique")
        if not 0 <= han_share < 1:
            raise ValueError(f"the n-gram head's han_share must be in [0, 1), not {han_share}")
        self.keys = keys.astype(np.uint64)
        self.idf = idf.astype(np.float64)
        self.coef = coef.astype(np.float64)
        self.intercept = intercept.astype(np.float64)
        self.han_share = float(han_share)
        self.multi_label = multi_label
        self.hasher = NgramHasher(buckets, tokens)
        if buckets and len(self.keys) and int(self.keys[-1]) >= buckets:
            raise ValueError(f"the n-gram head's keys do not fit its {buckets} buckets")
        self.column_of = column_map(self.keys, buckets) if buckets else None

    @classmethod
    def from_ngrams(cls, ngrams: dict[str, int], idf: np.ndarray, coef: np.ndarray, intercept: np.ndarray,
                    han_share: float, multi_label: bool = False) -> NgramHead:
        """From a fitted vectoriser's ``vocabulary_`` (n-gram -> column) and the classifier's arrays
        [labels, columns]: columns reordered by hash, single-label coefficients centred over the labels."""
        columns = np.fromiter(ngrams.values(), dtype=np.int64, count=len(ngrams))
        hashes = np.array([_ngram_hash(g) for g in ngrams], dtype=np.uint64)
        order = np.argsort(hashes, kind="stable")
        if len(hashes) > 1 and np.any(hashes[order][1:] == hashes[order][:-1]):
            raise ValueError("two n-grams share a 64-bit hash")
        coef = np.asarray(coef, dtype=np.float64)[:, columns[order]]
        coef, intercept = _centred(coef, np.asarray(intercept, dtype=np.float64), multi_label)
        return cls(hashes[order], np.asarray(idf)[columns[order]], coef, intercept, han_share, multi_label)

    @classmethod
    def from_buckets(cls, buckets_kept: np.ndarray, idf: np.ndarray, coef: np.ndarray, intercept: np.ndarray,
                     han_share: float, multi_label: bool, buckets: int) -> NgramHead:
        """From a hashed fit (training.hashed_ngrams): its kept buckets (sorted), their idf, and the
        classifier's arrays [labels, kept buckets]."""
        coef, intercept = _centred(np.asarray(coef, dtype=np.float64), np.asarray(intercept, dtype=np.float64),
                                   multi_label)
        return cls(np.asarray(buckets_kept, dtype=np.uint64), np.asarray(idf), coef, intercept, han_share,
                   multi_label, buckets)

    # -- reading documents -----------------------------------------------------------------------
    def release_cache(self) -> None:
        """Forget the token hashes kept so far (``Pipeline.release_caches``)."""
        self.hasher.release_cache()

    @property
    def buckets(self) -> int:
        """0: the keys are the n-grams' 64-bit hashes; else the buckets they are hashed into."""
        return self.hasher.buckets

    def logits(self, texts: Iterable[str], chunk: int = 256) -> np.ndarray:
        """[documents, labels] logits of the head, ``chunk`` documents at a time."""
        return self._logits(list(texts), chunk)[0]

    def _logits(self, texts: list[str], chunk: int, keep: bool = False) -> tuple[np.ndarray, list[tuple]]:
        """The logits and, with ``keep``, each chunk's (rows, columns, values, first token, bigram, tokens)."""
        out = np.empty((len(texts), len(self.intercept)))
        kept: list[tuple] = []
        offset = 0  # the chunk's first token's index among every chunk's tokens
        for start in range(0, len(texts), chunk):
            part = texts[start : start + chunk]
            owner, grams, tokens, first_token = self.hasher._grams(part, keep_tokens=keep)
            rows, columns, values, first = NgramHasher._tfidf((owner, grams), len(part), self.keys, self.idf,
                                                              self.column_of)
            block = np.tile(self.intercept, (len(part), 1))
            for label in range(block.shape[1]):
                block[:, label] += np.bincount(rows, self.coef[label, columns] * values, minlength=len(part))
            out[start : start + chunk] = block
            if keep:
                kept.append((rows + start, columns, values, first_token[first] + offset, first >= len(tokens), tokens))
                offset += len(tokens)
        return out, kept

    def probabilities(self, texts: Iterable[str]) -> np.ndarray:
        """[documents, labels] probabilities of the head (a softmax of its logits; multi-label, a sigmoid)."""
        return self._squash(self.logits(texts))

    def read(self, texts: Iterable[str], evidence: bool = False, chunk: int = 256) -> HeadReading:
        """The head's probabilities of ``texts`` and, with ``evidence``, what ``evidence_of`` reads."""
        z, kept = self._logits(list(texts), chunk, keep=evidence)
        if not evidence:
            return HeadReading(self._squash(z))
        join = lambda k: np.concatenate([part[k] for part in kept]) if kept else np.zeros(0, dtype=np.int64)  # noqa: E731
        return HeadReading(self._squash(z), join(0), join(1), join(2), join(3), join(4).astype(bool),
                           [t for part in kept for t in part[5]])

    def _squash(self, z: np.ndarray) -> np.ndarray:
        if self.multi_label:
            return 1.0 / (1.0 + np.exp(-z))
        z = np.exp(z - z.max(1, keepdims=True))
        return z / z.sum(1, keepdims=True)

    def mix(self, han: np.ndarray, head: np.ndarray) -> np.ndarray:
        """The averaged probabilities: ``han_share`` of the HAN's and the rest of the head's."""
        return self.han_share * han + (1.0 - self.han_share) * head

    def evidence(self, text: str, label: int, top: int = TOP_NGRAMS) -> list[NgramWeight]:
        """The ``top`` n-grams that moved the head's logit for ``label`` most (by magnitude), heaviest first."""
        return self.evidence_of(self.read([text], evidence=True), 0, label, top)

    def evidence_of(self, reading: HeadReading, document: int, label: int, top: int = TOP_NGRAMS) -> list[NgramWeight]:
        """``evidence`` of the ``document``-th text of a ``read(..., evidence=True)``."""
        assert reading.rows is not None and reading.tokens is not None, "read(..., evidence=True) keeps the evidence"
        a, b = np.searchsorted(reading.rows, [document, document + 1])
        contributions = self.coef[label, reading.columns[a:b]] * reading.values[a:b]
        order = np.argsort(-np.abs(contributions), kind="stable")[:top] + a
        tokens = reading.tokens
        texts = [f"{tokens[t]} {tokens[t + 1]}" if two else tokens[t]
                 for t, two in zip(reading.token[order].tolist(), reading.bigram[order].tolist(), strict=True)]
        weights = contributions[order - a].tolist()
        return [NgramWeight(t, round(float(w), 6)) for t, w in zip(texts, weights, strict=True)]

    # -- files -----------------------------------------------------------------------------------
    def save(self, directory: Path) -> None:
        """Write ``ngram_head.safetensors`` (float64: the scores served are those the fit evaluated)."""
        arrays = {"keys": self.keys.view(np.int64), "idf": self.idf, "coef": self.coef, "intercept": self.intercept}
        if self.buckets:  # a hashed head; without the entry (the models before it) keys are exact hashes
            arrays["buckets"] = np.array([self.buckets])
        arrays["tokens"] = np.array([self.hasher.tokens_version])  # without it: TOKEN_BEFORE_UNSPACED
        # C order: safetensors writes the buffer as it lies (a column-indexed copy is Fortran-ordered)
        arrays = {k: np.ascontiguousarray(v, dtype=np.int64 if k in ("keys", "buckets", "tokens") else np.float64)
                  for k, v in arrays.items()}
        save_file(arrays, str(directory / self.FILE))

    @classmethod
    def load(cls, directory: Path, han_share: float, multi_label: bool) -> NgramHead:
        """The head ``save`` wrote; the share and the task come from the model's config."""
        arrays = load_file(str(directory / cls.FILE))
        buckets = int(arrays["buckets"][0]) if "buckets" in arrays else 0
        tokens = int(arrays["tokens"][0]) if "tokens" in arrays else 1
        return cls(arrays["keys"].view(np.uint64), arrays["idf"], arrays["coef"], arrays["intercept"], han_share,
                   multi_label, buckets, tokens)

    @property
    def nbytes(self) -> int:
        """Its arrays' bytes (what a worker holds for it)."""
        return self.keys.nbytes + self.idf.nbytes + self.coef.nbytes + self.intercept.nbytes

    @property
    def size(self) -> int:
        """The n-grams (hashed: the buckets) it knows."""
        return len(self.keys)


def _centred(coef: np.ndarray, intercept: np.ndarray, multi_label: bool) -> tuple[np.ndarray, np.ndarray]:
    """Single-label coefficients centred over the labels (the same softmax; a binary model's two rows
    become opposites); multi-label ones as they are."""
    if multi_label:
        return coef, intercept
    return coef - coef.mean(0), intercept - intercept.mean()


def _ngram_hash(ngram: str) -> int:
    words = ngram.split(" ")
    if len(words) == 1:
        return token_hash(words[0])
    first, second = (np.uint64(token_hash(w)) for w in words)
    with np.errstate(over="ignore"):
        return int(first * MIX + second)


def align_classes(coef: np.ndarray, intercept: np.ndarray, classes: Sequence[int],
                  labels: int) -> tuple[np.ndarray, np.ndarray]:
    """A fitted logistic regression's arrays over every label: a binary model's one row becomes two
    (0 and z, the same softmax as its sigmoid), and a label no training document had gets a logit
    that leaves it at probability 0."""
    coef, intercept = np.asarray(coef, dtype=np.float64), np.asarray(intercept, dtype=np.float64)
    if len(classes) == 2 and coef.shape[0] == 1:
        coef, intercept = np.vstack([np.zeros_like(coef), coef]), np.concatenate([[0.0], intercept])
    full_coef = np.zeros((labels, coef.shape[1]))
    full_intercept = np.full(labels, -1e4)
    full_coef[list(classes)] = coef
    full_intercept[list(classes)] = intercept
    return full_coef, full_intercept
