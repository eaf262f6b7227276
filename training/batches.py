"""What the datamodule hands the trainer: encoded documents, and batches of documents of similar length."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import Dataset, Sampler

from han.batch import Batch, collate_flat


class EncodedDocuments(Dataset):
    """Documents as (flat word ids, words per sentence) with their targets."""

    def __init__(self, documents: list[tuple[np.ndarray, np.ndarray]], targets: torch.Tensor) -> None:
        self.documents = documents
        self.targets = targets
        self.sizes = [len(ids) for ids, _ in documents]

    def __len__(self) -> int:
        return len(self.documents)

    def __getitem__(self, index: int) -> tuple[tuple[np.ndarray, np.ndarray], torch.Tensor]:
        return self.documents[index], self.targets[index]


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
        self.sizes = list(sizes)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.pool = batch_size * pool_batches
        self.epoch = 0

    def _all_batches(self) -> list[list[int]]:
        rng = np.random.default_rng(self.seed + self.epoch)
        order = rng.permutation(len(self.sizes)) if self.shuffle else np.arange(len(self.sizes))
        batches: list[list[int]] = []
        for start in range(0, len(order), self.pool):
            pool = sorted(order[start : start + self.pool].tolist(), key=self.sizes.__getitem__)
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
        yield from batches[rank::world]

    def __len__(self) -> int:
        _, world = self._rank_world()
        return math.ceil(math.ceil(len(self.sizes) / self.batch_size) / world)
