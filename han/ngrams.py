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
so the head is plain arrays (no word list to load).
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


class NgramHead:
    """TF-IDF 1-2 grams and a linear layer over the model's labels (see the module docstring).

    ``keys``: the n-gram hashes, sorted; ``idf``: one per key; ``coef``: [labels, keys] (single-label:
    centred over the labels, which leaves the softmax as it is and makes a binary model's two rows
    opposites); ``intercept``: [labels]; ``han_share``: the HAN's weight in the averaged scores;
    ``multi_label``: a sigmoid per label instead of the softmax.
    """

    FILE = "ngram_head.safetensors"

    def __init__(self, keys: np.ndarray, idf: np.ndarray, coef: np.ndarray, intercept: np.ndarray,
                 han_share: float, multi_label: bool = False) -> None:
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
        self._hashes: dict[str, int] = {}

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
        intercept = np.asarray(intercept, dtype=np.float64)
        if not multi_label:
            coef, intercept = coef - coef.mean(0), intercept - intercept.mean()
        return cls(hashes[order], np.asarray(idf)[columns[order]], coef, intercept, han_share, multi_label)

    # -- reading documents -----------------------------------------------------------------------
    def release_cache(self) -> None:
        """Forget the token hashes kept so far (``Pipeline.release_caches``)."""
        self._hashes = {}

    def _hashes_of(self, tokens: list[str]) -> list[int]:
        cache = self._hashes
        if len(cache) > 50_000:  # about 8 MB; a miss costs one blake2b of the token
            cache.clear()
        hashes = [cache.get(t) for t in tokens]
        if None in hashes:
            for i, h in enumerate(hashes):
                if h is None:
                    hashes[i] = cache[tokens[i]] = token_hash(tokens[i])
        return hashes  # type: ignore[return-value]

    def _tokens(self, text: str) -> tuple[list[str], np.ndarray]:
        tokens = TOKEN.findall(text.lower())
        return tokens, np.array(self._hashes_of(tokens), dtype=np.uint64)

    def features(self, text: str) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
        """The document's tokens and, for its known n-grams: columns, tf-idf values, and where each
        first occurs among its 1-grams then 2-grams (an index ``i`` past the tokens is the 2-gram of
        tokens ``i - len(tokens)`` and the one after it). One document at a time, for ``evidence``."""
        tokens, unigrams = self._tokens(text)
        grams = ngram_hashes(unigrams)
        where = np.minimum(np.searchsorted(self.keys, grams), max(len(self.keys) - 1, 0))
        known = np.flatnonzero(self.keys[where] == grams) if len(self.keys) else np.zeros(0, dtype=np.int64)
        columns, first, counts = np.unique(where[known], return_index=True, return_counts=True)
        values = (1.0 + np.log(counts)) * self.idf[columns]
        norm = math.sqrt(float(values @ values))
        return tokens, columns, values / norm if norm else values, known[first]

    def logits(self, texts: Iterable[str], chunk: int = 256) -> np.ndarray:
        """[documents, labels] logits of the head: what ``features`` gives, for ``chunk`` documents at a
        time in a few array operations (a handful of numpy calls per document cost more than the arithmetic)."""
        texts = list(texts)
        out = np.empty((len(texts), len(self.intercept)))
        for start in range(0, len(texts), chunk):
            out[start : start + chunk] = self._chunk_logits(texts[start : start + chunk])
        return out

    def _chunk_logits(self, texts: list[str]) -> np.ndarray:
        hashes: list[int] = []
        lengths: list[int] = []
        for text in texts:
            tokens = TOKEN.findall(text.lower())
            hashes += self._hashes_of(tokens)
            lengths.append(len(tokens))
        n = len(texts)
        out = np.tile(self.intercept, (n, 1))
        if not hashes or not len(self.keys):
            return out
        unigrams = np.array(hashes, dtype=np.uint64)
        doc = np.repeat(np.arange(n), lengths)
        inside = doc[:-1] == doc[1:]  # a 2-gram never spans two documents
        with np.errstate(over="ignore"):
            bigrams = unigrams[:-1][inside] * MIX + unigrams[1:][inside]
        grams, owner = np.concatenate([unigrams, bigrams]), np.concatenate([doc, doc[:-1][inside]])
        where = np.minimum(np.searchsorted(self.keys, grams), len(self.keys) - 1)
        known = self.keys[where] == grams
        pairs, counts = np.unique(owner[known] * len(self.keys) + where[known], return_counts=True)
        rows, columns = pairs // len(self.keys), pairs % len(self.keys)
        values = (1.0 + np.log(counts)) * self.idf[columns]
        norms = np.sqrt(np.bincount(rows, values * values, minlength=n))
        values = values / norms[rows]
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
        # C order: safetensors writes the buffer as it lies (a column-indexed copy is Fortran-ordered)
        arrays = {k: np.ascontiguousarray(v, dtype=np.int64 if k == "keys" else np.float64) for k, v in arrays.items()}
        save_file(arrays, str(directory / self.FILE))

    @classmethod
    def load(cls, directory: Path, han_share: float, multi_label: bool) -> NgramHead:
        """The head ``save`` wrote; the share and the task come from the model's config."""
        arrays = load_file(str(directory / cls.FILE))
        return cls(arrays["keys"].view(np.uint64), arrays["idf"], arrays["coef"], arrays["intercept"], han_share,
                   multi_label)

    @property
    def size(self) -> int:
        """The n-grams it knows."""
        return len(self.keys)


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
