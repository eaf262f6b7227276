"""Adversarial training on the word vectors (Miyato, Dai & Goodfellow, ICLR 2017): each step also
learns from the batch with its word vectors moved a little in the direction that raises the loss most,
a regulariser that suits recurrent text classifiers trained on few labels. The vectors are moved where
the network reads them (the embedding's output), so they may be fixed and the serving model is
untouched; a step costs about two."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn


@dataclass
class Seen:
    """The word ids a forward pass looked up and the vectors it read for them."""

    ids: list[Tensor] = field(default_factory=list)
    vectors: list[Tensor] = field(default_factory=list)


@contextmanager
def watched(embedding: nn.Embedding) -> Iterator[Seen]:
    """Records what ``embedding`` returns while open, as tensors the loss can be differentiated by
    (also when the vectors are fixed)."""
    seen = Seen()

    def hook(module: nn.Module, inputs: tuple[Tensor], output: Tensor) -> Tensor:
        if not output.requires_grad:
            output = output.detach().requires_grad_()
        seen.ids.append(inputs[0])
        seen.vectors.append(output)
        return output

    handle = embedding.register_forward_hook(hook)
    try:
        yield seen
    finally:
        handle.remove()


def direction(loss: Tensor, seen: Seen, epsilon: float) -> tuple[Tensor, Tensor]:
    """(distinct word ids, moves): each looked-up word's move, the loss's gradient (summed over a word's
    lookups) scaled so that the moves' root mean square is ``epsilon`` times the vectors' (the words
    that sway the loss most move most). Computed in float32 whatever the vectors' precision."""
    vectors = torch.cat(seen.vectors).detach().float()
    gradient = torch.cat(torch.autograd.grad(loss, seen.vectors, retain_graph=True)).float()
    ids, index = torch.unique(torch.cat(seen.ids), return_inverse=True)
    gradient = gradient.new_zeros(len(ids), gradient.shape[-1]).index_add(0, index, gradient)
    scale = epsilon * vectors.pow(2).mean().sqrt() / gradient.pow(2).mean().sqrt().clamp_min(1e-12)
    return ids, (gradient * scale).to(seen.vectors[0].dtype)


@contextmanager
def moved(embedding: nn.Embedding, ids: Tensor, moves: Tensor) -> Iterator[None]:
    """``embedding`` returns each of ``ids``' vectors (distinct, sorted: ``direction``'s) plus its move
    while open (other words unmoved)."""

    def hook(module: nn.Module, inputs: tuple[Tensor], output: Tensor) -> Tensor:
        looked_up = inputs[0]
        at = torch.searchsorted(ids, looked_up).clamp_max(len(ids) - 1)
        found = (ids[at] == looked_up).unsqueeze(-1)
        return output + torch.where(found, moves[at], torch.zeros_like(output))

    handle = embedding.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()
