"""Turning encoded documents (sentences of word ids) into the model's flat batch tensors."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

if TYPE_CHECKING:  # torch is imported where a batch is made: han.pipeline's no-gradient path needs none
    import torch
    from torch import Tensor

EncodedDocument = Sequence[Sequence[int]]  # sentences of word ids


class Batch(NamedTuple):
    words: Tensor  # [sentences, max_words] ids, 0-padded; documents one after another
    sentence_lengths: Tensor  # [sentences]
    document_lengths: Tensor  # [docs]

    def to(self, device: torch.device | str) -> Batch:
        return Batch(*(t.to(device) for t in self))


def collate(documents: Sequence[EncodedDocument]) -> Batch:
    """Pack encoded documents into one Batch. Every document needs at least one non-empty sentence."""
    flat = [
        (np.fromiter((i for s in doc for i in s), dtype=np.int64), np.fromiter(map(len, doc), dtype=np.int64))
        for doc in documents
    ]
    return collate_flat(flat)


def collate_flat(documents: Sequence[tuple[np.ndarray, np.ndarray]]) -> Batch:
    """Like ``collate``, for documents stored flat: (all word ids, number of words in each sentence)."""
    if not documents:
        raise ValueError("cannot collate an empty list of documents")
    sentence_lengths = np.concatenate([lengths for _, lengths in documents]).astype(np.int64, copy=False)
    if not len(sentence_lengths) or sentence_lengths.min() == 0:
        raise ValueError("every document needs at least one sentence, and every sentence at least one word")
    document_lengths = np.fromiter((len(lengths) for _, lengths in documents), dtype=np.int64, count=len(documents))
    if document_lengths.min() == 0:
        raise ValueError("every document needs at least one sentence")
    words = np.zeros((len(sentence_lengths), int(sentence_lengths.max())), dtype=np.int64)
    words[np.arange(words.shape[1]) < sentence_lengths[:, None]] = np.concatenate([ids for ids, _ in documents])
    import torch

    return Batch(torch.from_numpy(words), torch.from_numpy(sentence_lengths), torch.from_numpy(document_lengths))


def length_sorted_chunks(sizes: Sequence[int], max_docs: int, max_tokens: int | None = None) -> list[list[int]]:
    """Group indices into batches of documents of similar size (fewer padded steps).

    Each batch has at most ``max_docs`` documents and, if given, roughly at most ``max_tokens``
    tokens (a single document larger than that still gets a batch of its own).
    """
    order = sorted(range(len(sizes)), key=lambda i: sizes[i])
    chunks: list[list[int]] = []
    current: list[int] = []
    tokens = 0
    for i in order:
        if current and (len(current) == max_docs or (max_tokens is not None and tokens + sizes[i] > max_tokens)):
            chunks.append(current)
            current, tokens = [], 0
        current.append(i)
        tokens += sizes[i]
    if current:
        chunks.append(current)
    return chunks
