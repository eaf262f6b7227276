"""The validation split held out of the training data when none is given (``data.val_fraction``).

Stratified by label, as many documents as a stratified split holds out, but each document's side is
decided by a hash of its text (salted with the seed) rather than by a draw over this set: as the
labelled set grows between rounds, a document keeps its side, so a fit warm-started from the last
round's model (``--model.init_from``: han-label's rounds, the way back's retrain) is not validated on
documents that model trained on. In each class the documents with the lowest hashes are held out; only
those at a class's boundary can change sides as the set grows. Every class keeps a document for training:
a class with one document is never held out, and a rare class holds out at most all but one (a class with
one document no longer turns stratification off for the others, which could hold out a class entirely).
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Sequence

import numpy as np


def stable_holdout(texts: Sequence[str], classes: Sequence[str] | None, fraction: float, seed: int
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(kept for training, held out): sorted row numbers. ``classes``: each row's label, or None
    (multi-label data) for no stratification; a class with one document stays in training."""
    salt = str(seed).encode()
    keys = np.array([int.from_bytes(hashlib.blake2b(t.encode("utf-8", "surrogatepass"), digest_size=8,
                                                    key=salt).digest(), "big") for t in texts], dtype=np.uint64)
    everything = np.arange(len(texts))
    groups = [everything] if classes is None else \
        [np.flatnonzero(np.asarray(classes) == c) for c in sorted(set(classes))]
    counts = allocate(math.ceil(len(texts) * fraction), [len(g) for g in groups])
    held = np.concatenate([g[np.argsort(keys[g], kind="stable")[:k]] for g, k in zip(groups, counts, strict=True)])
    return np.setdiff1d(everything, held), np.sort(held)


def allocate(total: int, sizes: list[int]) -> list[int]:
    """``total`` split across groups of ``sizes`` in proportion (largest remainders first, ties to the
    larger group), each group keeping at least one for training where it has two or more."""
    whole = sum(sizes)
    exact = [total * n / whole for n in sizes]
    counts = [min(int(e), max(n - 1, 0)) for e, n in zip(exact, sizes, strict=True)]
    order = sorted(range(len(sizes)), key=lambda i: (-(exact[i] - int(exact[i])), -sizes[i], i))
    for i in itertools.cycle(order):
        if sum(counts) >= total or all(counts[j] >= max(sizes[j] - 1, 0) for j in order):
            break
        if counts[i] < max(sizes[i] - 1, 0):
            counts[i] += 1
    return counts
