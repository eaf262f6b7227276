"""The n-gram head: TF-IDF word 1-2 grams and a linear layer, whose probabilities are averaged with the HAN's.

With a few thousand labelled long documents a linear model over word n-grams is hard to beat, and it
errs on other documents than the HAN does: averaged, the two score above either. A fit trains the
baseline anyway (training.baseline); when averaging it with the HAN scores better on validation, the
exported model keeps it as this head, and every caller's scores become
``han_share * HAN + (1 - han_share) * head``.

It computes exactly what scikit-learn's ``TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True)``
and ``LogisticRegression.predict_proba`` compute, without scikit-learn: lowercase, the default token
pattern, ``1 + log(count)`` times the idf, L2-normalised, then a softmax of the linear layer (a
sigmoid per label for multi-label data, one-vs-rest). The n-grams are kept as sorted 64-bit hashes,
so the head is plain arrays (no word list to load); a hashed head (training.hashed_ngrams) keeps
their buckets instead, a table of fixed size whatever the corpus.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from hashlib import blake2b
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

from han.results import NgramWeight

TOKEN = re.compile(r"(?u)\b\w\w+\b")  # scikit-learn's default token pattern
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

    def __init__(self, buckets: int = 0) -> None:
        if buckets < 0:
            raise ValueError(f"buckets must be 0 (exact hashes) or positive, not {buckets}")
        self.buckets = int(buckets)
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
        tokens = TOKEN.findall(text.lower())
        return tokens, self.keyed(ngram_hashes(np.array(self.token_hashes(tokens), dtype=np.uint64)))

    def grams(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(document, key) of every 1-gram and 2-gram of ``texts``, 1-grams first (a 2-gram never spans
        two documents): what the head looks up, and what a hashed fit counts (training.hashed_ngrams)."""
        hashes: list[int] = []
        lengths: list[int] = []
        for text in texts:
            tokens = TOKEN.findall(text.lower())
            hashes += self.token_hashes(tokens)
            lengths.append(len(tokens))
        unigrams = np.array(hashes, dtype=np.uint64)
        doc = np.repeat(np.arange(len(texts)), lengths)
        inside = doc[:-1] == doc[1:]
        with np.errstate(over="ignore"):
            bigrams = unigrams[:-1][inside] * MIX + unigrams[1:][inside]
        return np.concatenate([doc, doc[:-1][inside]]), self.keyed(np.concatenate([unigrams, bigrams]))

    def tfidf(self, texts: Sequence[str], keys: np.ndarray,
              idf: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(document, column, value): the L2-normalised sublinear tf-idf of ``texts`` over ``keys``
        (sorted; column i is keys[i], weighted by idf[i]), one entry per document and known key, in a
        few array operations (a handful of numpy calls per document cost more than the arithmetic)."""
        owner, grams = self.grams(texts)
        if not len(grams) or not len(keys):
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0)
        where = np.minimum(np.searchsorted(keys, grams), len(keys) - 1)
        known = keys[where] == grams
        pairs, counts = np.unique(owner[known] * len(keys) + where[known], return_counts=True)
        rows, columns = pairs // len(keys), pairs % len(keys)
        values = (1.0 + np.log(counts)) * idf[columns]
        norms = np.sqrt(np.bincount(rows, values * values, minlength=len(texts)))
        return rows, columns, values / norms[rows]


class NgramHead:
    """TF-IDF 1-2 grams and a linear layer over the model's labels (see the module docstring).

    ``keys``: the n-gram hashes, sorted; ``idf``: one per key; ``coef``: [labels, keys] (single-label:
    centred over the labels, which leaves the softmax as it is and makes a binary model's two rows
    opposites); ``intercept``: [labels]; ``han_share``: the HAN's weight in the averaged scores;
    ``multi_label``: a sigmoid per label instead of the softmax.
    """

    FILE = "ngram_head.safetensors"

    def __init__(self, keys: np.ndarray, idf: np.ndarray, coef: np.ndarray, intercept: np.ndarray,
                 han_share: float, multi_label: bool = False, buckets: int = 0) -> None:
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
        self.hasher = NgramHasher(buckets)
        if buckets and len(self.keys) and int(self.keys[-1]) >= buckets:
            raise ValueError(f"the n-gram head's keys do not fit its {buckets} buckets")

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

    def features(self, text: str) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
        """The document's tokens and, for its known n-grams: columns, tf-idf values, and where each
        first occurs among its 1-grams then 2-grams (an index ``i`` past the tokens is the 2-gram of
        tokens ``i - len(tokens)`` and the one after it). One document at a time, for ``evidence``."""
        tokens, grams = self.hasher.tokens(text)
        where = np.minimum(np.searchsorted(self.keys, grams), max(len(self.keys) - 1, 0))
        known = np.flatnonzero(self.keys[where] == grams) if len(self.keys) else np.zeros(0, dtype=np.int64)
        columns, first, counts = np.unique(where[known], return_index=True, return_counts=True)
        values = (1.0 + np.log(counts)) * self.idf[columns]
        norm = math.sqrt(float(values @ values))
        return tokens, columns, values / norm if norm else values, known[first]

    def logits(self, texts: Iterable[str], chunk: int = 256) -> np.ndarray:
        """[documents, labels] logits of the head: what ``features`` gives, ``chunk`` documents at a time."""
        texts = list(texts)
        out = np.empty((len(texts), len(self.intercept)))
        for start in range(0, len(texts), chunk):
            out[start : start + chunk] = self._chunk_logits(texts[start : start + chunk])
        return out

    def _chunk_logits(self, texts: list[str]) -> np.ndarray:
        n = len(texts)
        out = np.tile(self.intercept, (n, 1))
        rows, columns, values = self.hasher.tfidf(texts, self.keys, self.idf)
        for label in range(out.shape[1]):
            out[:, label] += np.bincount(rows, self.coef[label, columns] * values, minlength=n)
        return out

    def probabilities(self, texts: Iterable[str]) -> np.ndarray:
        """[documents, labels] probabilities of the head (a softmax of its logits; multi-label, a sigmoid)."""
        z = self.logits(texts)
        if self.multi_label:
            return 1.0 / (1.0 + np.exp(-z))
        z = np.exp(z - z.max(1, keepdims=True))
        return z / z.sum(1, keepdims=True)

    def mix(self, han: np.ndarray, head: np.ndarray) -> np.ndarray:
        """The averaged probabilities: ``han_share`` of the HAN's and the rest of the head's."""
        return self.han_share * han + (1.0 - self.han_share) * head

    def evidence(self, text: str, label: int, top: int = TOP_NGRAMS) -> list[NgramWeight]:
        """The ``top`` n-grams that moved the head's logit for ``label`` most (by magnitude), heaviest first."""
        tokens, columns, values, positions = self.features(text)
        contributions = self.coef[label, columns] * values
        order = np.argsort(-np.abs(contributions), kind="stable")[:top]
        n = len(tokens)
        texts = [tokens[p] if p < n else f"{tokens[p - n]} {tokens[p - n + 1]}" for p in positions[order].tolist()]
        return [NgramWeight(t, round(float(w), 6)) for t, w in zip(texts, contributions[order].tolist(), strict=True)]

    # -- files -----------------------------------------------------------------------------------
    def save(self, directory: Path) -> None:
        """Write ``ngram_head.safetensors`` (float64: the scores served are those the fit evaluated)."""
        arrays = {"keys": self.keys.view(np.int64), "idf": self.idf, "coef": self.coef, "intercept": self.intercept}
        if self.buckets:  # a hashed head; without the entry (the models before it) keys are exact hashes
            arrays["buckets"] = np.array([self.buckets])
        # C order: safetensors writes the buffer as it lies (a column-indexed copy is Fortran-ordered)
        arrays = {k: np.ascontiguousarray(v, dtype=np.int64 if k in ("keys", "buckets") else np.float64)
                  for k, v in arrays.items()}
        save_file(arrays, str(directory / self.FILE))

    @classmethod
    def load(cls, directory: Path, han_share: float, multi_label: bool) -> NgramHead:
        """The head ``save`` wrote; the share and the task come from the model's config."""
        arrays = load_file(str(directory / cls.FILE))
        buckets = int(arrays["buckets"][0]) if "buckets" in arrays else 0
        return cls(arrays["keys"].view(np.uint64), arrays["idf"], arrays["coef"], arrays["intercept"], han_share,
                   multi_label, buckets)

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
