"""What the datamodule hands the trainer: encoded documents, and batches of documents of similar length."""

from __future__ import annotations

import math
import tempfile
from array import array
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import Dataset, Sampler

from han.batch import Batch, collate_flat


class EncodedDocuments(Dataset):
    """Documents as (flat word ids, words per sentence) with their targets.

    Stored flat: every document's word ids one after another in ``ids``, its sentences' word counts in
    ``sentence_lengths``, and where each document starts in both (``word_at``, ``sentence_at``, one more
    entry than documents). ``ids`` and ``sentence_lengths`` are memory-mapped files (``FlatWriter``), so a
    split of a million documents costs the page cache, which the system reclaims, not the process's
    memory (a list of two arrays per document cost about 1.3 KB each: 1.3 GB at a million).
    """

    def __init__(self, ids: np.ndarray, sentence_lengths: np.ndarray, word_at: np.ndarray, sentence_at: np.ndarray,
                 targets: torch.Tensor) -> None:
        self.ids, self.sentence_lengths = ids, sentence_lengths
        self.word_at, self.sentence_at = word_at, sentence_at
        self.targets = targets
        self.sizes = np.diff(word_at)  # words per document (the sampler's lengths)

    def __len__(self) -> int:
        return len(self.word_at) - 1

    def __getitem__(self, index: int) -> tuple[tuple[np.ndarray, np.ndarray], torch.Tensor]:
        words = self.ids[self.word_at[index] : self.word_at[index + 1]]
        lengths = self.sentence_lengths[self.sentence_at[index] : self.sentence_at[index + 1]]
        return (words, lengths), self.targets[index]


class FlatWriter:
    """Builds an ``EncodedDocuments`` a document at a time: the ids and sentence lengths go to unnamed
    files in ``directory`` (gone once nothing maps them) and are read back memory-mapped."""

    def __init__(self, directory: str | Path) -> None:
        # closed by ``documents``, once mapped (a context manager cannot span the writes)
        self.files = [tempfile.TemporaryFile(dir=directory) for _ in range(2)]  # noqa: SIM115
        self.chunks: tuple[list[np.ndarray], list[np.ndarray]] = ([], [])
        self.pending = 0
        self.word_at, self.sentence_at = array("q", [0]), array("q", [0])  # 8 bytes a document, not a list's 36

    def add(self, ids: np.ndarray, lengths: np.ndarray) -> None:
        self.chunks[0].append(np.asarray(ids, dtype=np.int32))
        self.chunks[1].append(np.asarray(lengths, dtype=np.int32))
        self.word_at.append(self.word_at[-1] + len(ids))
        self.sentence_at.append(self.sentence_at[-1] + len(lengths))
        self.pending += len(ids)
        if self.pending >= 1 << 20:  # about 4 MB a write
            self._flush()

    def _flush(self) -> None:
        for file, chunks in zip(self.files, self.chunks, strict=True):
            if chunks:
                file.write(np.concatenate(chunks).tobytes())
                chunks.clear()
            file.flush()
        self.pending = 0

    def documents(self, targets: torch.Tensor) -> EncodedDocuments:
        word_at, sentence_at = (np.frombuffer(a, np.int64).copy() for a in (self.word_at, self.sentence_at))
        self._flush()
        ids, lengths = (np.memmap(f, dtype=np.int32, mode="r", shape=(int(n),)) if n else np.zeros(0, np.int32)
                        for f, n in zip(self.files, (word_at[-1], sentence_at[-1]), strict=True))
        for f in self.files:
            f.close()  # the maps keep the data; the unnamed files go with them
        self.word_at, self.sentence_at = array("q", [0]), array("q", [0])
        return EncodedDocuments(ids, lengths, word_at, sentence_at, targets)


class LabelledTexts:
    """A split read for evaluation alone: its texts and targets, not tokenised. ``fit`` runs the test
    split only through the inference pipeline, which segments it itself, so tokenising it beforehand
    would do it twice; ``test_dataloader`` tokenises it when asked."""

    def __init__(self, targets: torch.Tensor) -> None:
        self.targets = targets

    def __len__(self) -> int:
        return len(self.targets)


def collate_examples(examples: Sequence[tuple[tuple[np.ndarray, np.ndarray], torch.Tensor]]) -> tuple[Batch, Any]:
    return collate_flat([doc for doc, _ in examples]), torch.stack([t for _, t in examples])


class LengthBucketSampler(Sampler[list[int]]):
    """Batches of documents of similar length, in a fresh random order each epoch.

    Shuffles, cuts the order into pools of ``pool_batches`` batches, sorts each pool by length,
    then shuffles the batches. Under torch.distributed each rank takes every world-size-th batch
    (all ranks get the same number), so it works with DDP without Lightning's DistributedSampler.
    """

    def __init__(
        self, sizes: Sequence[int], batch_size: int, shuffle: bool = True, seed: int = 0, pool_batches: int = 50,
        rank: int | None = None, world_size: int | None = None,
    ) -> None:
        self.rank, self.world_size = rank, world_size
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.pool = batch_size * pool_batches
        self.epoch = 0

    def _all_batches(self) -> list[np.ndarray]:
        rng = np.random.default_rng(self.seed + self.epoch)
        order = rng.permutation(len(self.sizes)) if self.shuffle else np.arange(len(self.sizes))
        batches: list[np.ndarray] = []  # arrays, not lists: a million documents' indices in 8 MB
        for start in range(0, len(order), self.pool):
            pool = order[start : start + self.pool]
            pool = pool[np.argsort(self.sizes[pool], kind="stable")]  # a stable sort, as sorted() is
            batches.extend(pool[i : i + self.batch_size] for i in range(0, len(pool), self.batch_size))
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return batches

    def _rank_world(self) -> tuple[int, int]:
        if self.rank is not None and self.world_size is not None:
            return self.rank, self.world_size
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        return 0, 1

    def __iter__(self) -> Iterator[list[int]]:
        batches = self._all_batches()
        self.epoch += 1
        rank, world = self._rank_world()
        per_rank = math.ceil(len(batches) / world)
        batches = (batches * 2)[: per_rank * world]  # pad by repeating so every rank gets as many
        for batch in batches[rank::world]:
            yield batch.tolist()

    def __len__(self) -> int:
        _, world = self._rank_world()
        return math.ceil(math.ceil(len(self.sizes) / self.batch_size) / world)
