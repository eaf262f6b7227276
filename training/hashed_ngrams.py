"""TF-IDF over hashed word 1-2 grams, and a logistic regression fitted on it in a stream: the baseline
(and the n-gram head) in a memory of fixed size, whatever the corpus.

scikit-learn's ``TfidfVectorizer`` keeps every n-gram it keeps in a vocabulary (403,044 in
``make run``'s model, 744,000 on 50,000 IMDB reviews), the head ships it to every worker, and
``LogisticRegression``'s solver holds a few dozen copies of [labels, n-grams] beside the whole
document matrix. Hashed into ``buckets`` (fastText's and Vowpal Wabbit's scheme; scikit-learn's
``HashingVectorizer``) the table stops growing with the corpus, and SGD on the log loss (averaged
weights, alpha = 1 / (C x documents), the L2 penalty of ``LogisticRegression(C)``) reads the documents
a chunk at a time. The hashing is the head's own (``han.ngrams.NgramHasher``), so the exported head
computes exactly the features the fit trained on: sublinear tf times the smooth idf, L2-normalised,
over the buckets at least ``min_df`` training documents have.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy import sparse
from sklearn.linear_model import SGDClassifier

from han.ngrams import NgramHasher, column_map

BUCKETS = 2**20  # scikit-learn's HashingVectorizer's default
CHUNK = 2_000  # documents read at a time
EPOCHS = 5


class HashedTfidf:
    """``fit`` counts each bucket's documents a chunk at a time; ``transform`` gives the tf-idf
    [documents, kept buckets]. ``columns_``: the kept buckets (sorted: the head's keys); ``idf_``."""

    def __init__(self, buckets: int = BUCKETS, min_df: int = 2) -> None:
        self.buckets, self.min_df = buckets, min_df
        self.hasher = NgramHasher(buckets)
        self.columns_ = np.zeros(0, dtype=np.uint64)
        self.idf_ = np.zeros(0)
        self._column_of = column_map(self.columns_, 0)

    def fit(self, texts: Sequence[str]) -> HashedTfidf:
        df = np.zeros(self.buckets, dtype=np.int64)
        for start in range(0, len(texts), CHUNK):
            owner, keys = self.hasher.grams(texts[start : start + CHUNK])
            pairs = np.unique(owner.astype(np.uint64) * np.uint64(self.buckets) + keys)
            df += np.bincount((pairs % np.uint64(self.buckets)).astype(np.int64), minlength=self.buckets)
        self.columns_ = np.flatnonzero(df >= self.min_df).astype(np.uint64)
        self.idf_ = np.log((1 + len(texts)) / (1 + df[self.columns_.astype(np.int64)])) + 1.0
        self._column_of = column_map(self.columns_, self.buckets)
        self.hasher.release_cache()
        return self

    def transform(self, texts: Sequence[str]) -> sparse.csr_matrix:
        rows, columns, values = self.hasher.tfidf(texts, self.columns_, self.idf_, self._column_of)
        return sparse.csr_matrix((values, (rows, columns)), shape=(len(texts), len(self.columns_)))

    def fit_transform(self, texts: Sequence[str]) -> sparse.csr_matrix:
        return self.fit(texts).transform(texts)

    @property
    def size(self) -> int:
        """The buckets the head keeps."""
        return len(self.columns_)


def _rows(texts: Sequence[str], rows: np.ndarray) -> list[str]:
    """The texts at ``rows``: a lazy column (datasets' ``Column``, a split on disk) reads them in one go."""
    return [texts[i] for i in rows] if isinstance(texts, list) else texts[rows.tolist()]  # type: ignore[index]


def _with_bias(x: sparse.csr_matrix) -> sparse.csr_matrix:
    return sparse.hstack([x, np.ones((x.shape[0], 1))], format="csr")


class StreamedRegression:
    """Logistic regression by SGD over chunks of documents (one binary model per label for multi-label
    data); once fitted, ``coef_`` [labels or 1, columns] and ``intercept_`` as scikit-learn's."""

    def __init__(self, c: float, multi_label: bool, labels: int, epochs: int = EPOCHS, seed: int = 0) -> None:
        self.c, self.multi_label, self.labels, self.epochs, self.seed = c, multi_label, labels, epochs, seed

    def fit(self, vectorizer: HashedTfidf, texts: Sequence[str], targets: np.ndarray) -> StreamedRegression:
        # Multi-label, each intercept is a constant feature: scikit-learn's SGD moves the intercept of
        # sparse data 100 times slower than the weights, which left a rare label's at -0.7 after 5 passes
        # and put a document with no known n-gram (Reuters' empty texts) in every such label. A softmax
        # reads the intercepts only against each other, and single-label fits scored 0.5 to 1.7 points
        # lower with the constant feature (benchmarks/ngram_buckets.py): they keep SGD's own.
        sgd = {"loss": "log_loss", "alpha": 1.0 / (self.c * max(len(texts), 1)), "average": True,
               "fit_intercept": not self.multi_label, "random_state": self.seed}
        self.models_ = [SGDClassifier(**sgd) for _ in range(self.labels if self.multi_label else 1)]
        self.classes_ = np.unique(targets) if not self.multi_label else np.arange(self.labels)
        rng = np.random.default_rng(self.seed)
        for _ in range(self.epochs):
            for chunk in np.array_split(rng.permutation(len(texts)), max(1, len(texts) // CHUNK)):
                x = vectorizer.transform(_rows(texts, chunk))
                if self.multi_label:
                    x = _with_bias(x)
                    for label, model in enumerate(self.models_):
                        model.partial_fit(x, targets[chunk, label], classes=np.arange(2))
                else:
                    self.models_[0].partial_fit(x, targets[chunk], classes=self.classes_)
        # The averaged weights alone: each SGD model also keeps its running and averaged copies (three
        # [labels, columns] tables in all), which the head and the scoring never read again.
        coef = np.vstack([m.coef_ for m in self.models_])
        if self.multi_label:
            self.coef_, self.intercept_ = np.ascontiguousarray(coef[:, :-1]), coef[:, -1].copy()
        else:
            self.coef_, self.intercept_ = coef, self.models_[0].intercept_.copy()
        del coef
        self.models_ = []
        return self

    def decision_function(self, x: sparse.csr_matrix) -> np.ndarray:
        z = x @ self.coef_.T + self.intercept_
        return z[:, 0] if z.shape[1] == 1 else z

    def predict(self, x: sparse.csr_matrix) -> np.ndarray:
        z = self.decision_function(x)
        return self.classes_[(z > 0).astype(int)] if z.ndim == 1 else self.classes_[z.argmax(1)]

    def predict_proba(self, x: sparse.csr_matrix) -> np.ndarray:
        """What the head computes: each label's sigmoid (multi-label), else the softmax of the logits
        (a binary model's: the sigmoid of its one)."""
        z = np.asarray(x @ self.coef_.T + self.intercept_)
        if self.multi_label:
            return 1.0 / (1.0 + np.exp(-z))
        if z.shape[1] == 1:
            z = np.hstack([np.zeros_like(z), z])
        z = np.exp(z - z.max(1, keepdims=True))
        return z / z.sum(1, keepdims=True)
