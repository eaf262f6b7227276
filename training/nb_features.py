"""Naive Bayes log-count ratios (Wang & Manning, 2012, NBSVM) as fixed per-word features.

For each label c, r_c(w) = log((p_c(w) / |p_c|_1) / (q_c(w) / |q_c|_1)), with p_c and q_c the
number of training documents with and without c that contain w, plus one. A word the training
data ties to a label gets a large ratio whatever its embedding learns; the word encoder reads the
ratios beside each embedding (``HANConfig.nb_features``). A binary task needs one ratio, the
positive label's; otherwise one per label. Scaled to unit variance; padding and <unk> get 0.
"""

from __future__ import annotations

import numpy as np
import torch

from han.vocab import Vocabulary


def feature_count(num_labels: int, multi_label: bool) -> int:
    return 1 if num_labels == 2 and not multi_label else num_labels


def nb_ratios(documents: list[tuple[np.ndarray, np.ndarray]], targets: torch.Tensor, vocab_size: int,
              multi_label: bool) -> np.ndarray:
    """[vocab_size, features] ratios from encoded training documents and their targets."""
    num_labels = targets.shape[1] if multi_label else int(targets.max()) + 1
    onehot = targets.numpy().astype(bool) if multi_label else np.eye(num_labels, dtype=bool)[targets.numpy()]
    presence = np.zeros((num_labels, vocab_size))
    for (ids, _), labels in zip(documents, onehot, strict=True):
        words = np.unique(ids)
        presence[np.ix_(labels, words)] += 1
    total = np.zeros(vocab_size)
    for ids, _ in documents:
        total[np.unique(ids)] += 1
    p = presence + 1
    q = (total[None, :] - presence) + 1
    ratios = np.log((p / p.sum(1, keepdims=True)) / (q / q.sum(1, keepdims=True))).T  # [vocab, labels]
    if feature_count(num_labels, multi_label) == 1:
        ratios = ratios[:, 1:]
    ratios[: Vocabulary.unk_id + 1] = 0.0
    return (ratios / max(float(ratios[2:].std()), 1e-6)).astype(np.float32)
