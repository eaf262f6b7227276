"""The HAN's arithmetic done fast on a CPU: the same network as ``han.model``, in less time.

``han.model`` reads as the paper's network; it hands the heavy steps to this module, which
computes them three ways, picked by ``mode``:

- ``train`` (training with gradients): sentences sorted into a few blocks of similar length, each
  run dense through ``nn.GRU`` (little padding, and several times faster to back-propagate on a CPU
  than packed sequences); the backward direction reads each sequence reversed within its length.
- ``attribute`` (evaluation with gradients: attributions): the real positions only, flat, through
  the recurrence below, differentiable.
- ``infer`` (no gradients: serving, han-score, evaluation): the same recurrence with each distinct
  word's input projection computed once, and tanh computed as 2 sigmoid(2a) - 1 (PyTorch's sigmoid
  is about 6x cheaper than its tanh on a CPU).

All three give the same outputs (``tests/test_model.py`` keeps them equal, values and gradients);
docs/experiments.md has the measurements behind each.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch
from torch import Tensor, nn

Mode = Literal["train", "attribute", "infer"]


def mode(module: nn.Module) -> Mode:
    """Which computation a module's forward uses now."""
    if not torch.is_grad_enabled():
        return "infer"
    return "train" if module.training else "attribute"


def mask(lengths: Tensor, steps: int) -> Tensor:
    """[rows, steps], True on the first ``length`` positions of each row."""
    return torch.arange(steps, device=lengths.device) < lengths.unsqueeze(1)


# Training: blocks of similar length, run dense.


def reverse_within(lengths: Tensor, steps: int) -> Tensor:
    """Index [rows, steps] reversing each row's first ``length`` positions, leaving padding in place."""
    positions = torch.arange(steps, device=lengths.device)
    reversed_ = lengths.unsqueeze(1) - 1 - positions
    return torch.where(positions < lengths.unsqueeze(1), reversed_, positions)


def gather_steps(x: Tensor, index: Tensor) -> Tensor:
    return torch.gather(x, 1, index.unsqueeze(-1).expand(-1, -1, x.shape[-1]))


class Block(NamedTuple):
    """Rows of similar length that run dense together in training."""

    rows: Tensor  # indices into the batch
    lengths: Tensor  # their lengths
    reverse: Tensor  # [rows, width] index reversing each row within its length (``reverse_within``)

    @property
    def width(self) -> int:
        return self.reverse.shape[1]


def length_blocks(lengths: Tensor, rows_per_block: int = 256, max_blocks: int = 8) -> tuple[Tensor, list[Block]]:
    """Rows sorted by length and cut into contiguous blocks, plus the index that puts the blocks'
    concatenated rows back in batch order."""
    order = torch.argsort(lengths)
    blocks = []
    for rows in torch.tensor_split(order, max(1, min(max_blocks, len(order) // rows_per_block))):
        block_lengths = lengths[rows]
        blocks.append(Block(rows, block_lengths, reverse_within(block_lengths, int(block_lengths.max()))))
    return torch.argsort(order), blocks


def dense(forward_rnn: nn.GRU, backward_rnn: nn.GRU, x: Tensor, x_reversed: Tensor, reverse: Tensor) -> Tensor:
    """Both directions dense over a block: ``x_reversed`` is ``x`` with each sequence reversed within its
    length by ``reverse``. Returns [rows, steps, 2*hidden]; past a sequence's length, arbitrary finite values."""
    forward = forward_rnn(x)[0]
    backward = gather_steps(backward_rnn(x_reversed)[0], reverse)
    return torch.cat([forward, backward], dim=-1)


def blocked(forward_rnn: nn.GRU, backward_rnn: nn.GRU, x: Tensor, lengths: Tensor) -> Tensor:
    """A BiGRU over padded sequences [rows, steps, input] in training, by blocks; zero past each length."""
    steps = x.shape[1]
    restore, blocks = length_blocks(lengths)
    outputs = []
    for block in blocks:
        x_block = x[block.rows, : block.width]
        h = dense(forward_rnn, backward_rnn, x_block, gather_steps(x_block, block.reverse), block.reverse)
        outputs.append(nn.functional.pad(h, (0, 0, 0, steps - block.width)))
    return torch.cat(outputs)[restore] * mask(lengths, steps).unsqueeze(-1)


def blocked_word_level(net: nn.Module, words: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
    """``HAN.sentence_vectors`` in training: each block run dense to its own width and attended on its
    own. The backward direction's reversal is done on word ids and all blocks share one embedding
    lookup, so no gradient is scattered into a padded full-batch tensor (on a CPU that zero-filling
    cost about a third of a training step)."""
    rnn = net.word_rnn
    restore, blocks = length_blocks(lengths)
    ids = [words[block.rows, : block.width] for block in blocks]
    both_ways = [t for block, i in zip(blocks, ids, strict=True) for t in (i, torch.gather(i, 1, block.reverse))]
    embedded = net.embed(torch.cat([t.reshape(-1) for t in both_ways])).split([t.numel() for t in both_ways])
    vectors, weights = [], []
    for k, block in enumerate(blocks):
        x, x_reversed = (e.view(*ids[k].shape, -1) for e in embedded[2 * k : 2 * k + 2])
        h = dense(rnn.forward_rnn, rnn.backward_rnn, x, x_reversed, block.reverse)
        v, w = net.word_attention(h, mask(block.lengths, block.width))
        vectors.append(v)
        weights.append(nn.functional.pad(w, (0, words.shape[1] - block.width)))
    return torch.cat(vectors)[restore], torch.cat(weights)[restore]


# Attribution and inference: the real positions only, flat and packed.


def packed_order(lengths: Tensor) -> tuple[Tensor, Tensor, list[int]]:
    """Sequences stored flat (each one's positions, one sequence after another), read as packed
    sequences: time-major over the sequences sorted longest first. Returns the flat position read at
    each packed entry by the forward and by the backward direction (which reads each sequence from
    its end), and the number of sequences still running at each step."""
    sorted_lengths, rows = torch.sort(lengths, descending=True, stable=True)
    starts = (torch.cumsum(lengths, 0) - lengths)[rows]
    step = torch.arange(int(sorted_lengths[0]), device=lengths.device).unsqueeze(1)
    running = step < sorted_lengths  # [steps, sequences]
    forward = (starts + step)[running]
    backward = (starts + sorted_lengths - 1 - step)[running]
    return forward, backward, running.sum(1).tolist()


def gru_steps(projected: Tensor, read: Tensor, w_hh: Tensor, b_hh: Tensor, sizes: list[int]) -> Tensor:
    """The recurrence of both directions at once, one step for every running sequence at a time.

    projected [rows, 3*hidden]: input projections (gates r, z, n); read [2, entries]: the row each
    direction reads at each packed entry (``packed_order``), gathered step by step (no copy of
    every entry's gates at once); w_hh [2, hidden, 3*hidden]; b_hh [2, 1, 3*hidden]. The n gate's
    weights and biases come doubled, so that tanh(a) is computed as 2 sigmoid(2a) - 1. Returns the
    states [2, entries, hidden], in packed order. Differentiable (no in-place change of anything
    autograd keeps).
    """
    hidden = w_hh.shape[1]
    h = projected.new_zeros(2, sizes[0], hidden)
    minus_one = projected.new_full((), -1.0)
    states, start = [], 0
    for size in sizes:
        gi, h = projected[read[:, start : start + size]], h[:, :size]  # sorted longest first: the running ones
        gh = torch.baddbmm(b_hh, h, w_hh)
        rz = (gi[..., : 2 * hidden] + gh[..., : 2 * hidden]).sigmoid_()
        n = torch.add(
            minus_one, torch.addcmul(gi[..., 2 * hidden :], rz[..., :hidden], gh[..., 2 * hidden :]).sigmoid_(), alpha=2
        )
        h = torch.addcmul(n, rz[..., hidden:], h - n)
        states.append(h)
        start += size
    return torch.cat(states, 1)


def packed(forward_rnn: nn.GRU, backward_rnn: nn.GRU, inputs: Tensor, lengths: Tensor,
           index: Tensor | None = None) -> Tensor:
    """Both directions over flat sequences -> [positions, 2*hidden], flat in the same order.

    Position k reads ``inputs[index[k]]``, or ``inputs[k]`` without ``index``: given each distinct
    word once, the input projection (most of a word encoder's arithmetic) is done once per distinct
    word rather than at every occurrence. The input is projected in one matrix product, not per step.
    """
    f, b = forward_rnn, backward_rnn
    hidden = f.hidden_size
    double = torch.ones(3 * hidden, dtype=inputs.dtype, device=inputs.device)
    double[2 * hidden :] = 2  # the n gate's rows (see gru_steps); exact in floating point
    both = double.repeat(2)  # the forward direction's rows, then the backward's
    w_ih = torch.cat([f.weight_ih_l0, b.weight_ih_l0]) * both.unsqueeze(1)
    b_ih = torch.cat([f.bias_ih_l0, b.bias_ih_l0]) * both
    w_hh = (torch.stack([f.weight_hh_l0, b.weight_hh_l0]) * double.unsqueeze(1)).transpose(1, 2)
    b_hh = (torch.stack([f.bias_hh_l0, b.bias_hh_l0]) * double).unsqueeze(1)
    projected = torch.addmm(b_ih, inputs, w_ih.t()).view(-1, 3 * hidden)
    forward_at, backward_at, sizes = packed_order(lengths)
    # Projected row 2i is input i's forward part, 2i + 1 its backward part; likewise a state at
    # flat position p goes back to row 2p (forward) or 2p + 1 (backward) of the output.
    where = torch.cat([2 * forward_at, 2 * backward_at + 1])
    read = where if index is None else torch.cat([2 * index[forward_at], 2 * index[backward_at] + 1])
    states = gru_steps(projected, read.view(2, -1), w_hh, b_hh, sizes).view(-1, hidden)
    return states.new_empty(states.shape).index_copy(0, where, states).view(-1, 2 * hidden)


def attention_scores(proj: nn.Linear, context: Tensor, flat: Tensor) -> Tensor:
    """tanh(proj(h)) @ context up to a constant, outside training: tanh(a) @ c = 2 sigmoid(2a) @ c -
    sum(c), and the softmax ignores the constant (differentiable, for attributions)."""
    return torch.addmm(2 * proj.bias, flat, 2 * proj.weight.t()).sigmoid_() @ (2 * context)
