"""The HAN's arithmetic done fast on a CPU: the same network as ``han.model``, in less time.

``han.model`` reads as the paper's network; it hands the heavy steps to this module. Each BiGRU reads
the real positions only (no padding), flat, as packed sequences: one step of both directions at a
time over the sequences still running.

- The input projection, most of a word encoder's arithmetic, is one matrix product, done once per
  distinct word in training and inference; attributions, which need each position's own gradient,
  project every position.
- With gradients (training, attributions) the recurrence is a ``Recurrence``, whose backward pass
  through time is written out: autograd's own graph of a CPU GRU costs a dozen small nodes, two
  weight products and a concatenation per step and direction. Without (serving, han-score,
  evaluation) it is ``gru_steps``, which keeps nothing for a backward pass.
- tanh is computed as 2 sigmoid(2a) - 1 (PyTorch's sigmoid is much cheaper than its tanh on a CPU).

``tests/test_model.py`` keeps every way equal to ``nn.GRU``, values and gradients.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn


def mask(lengths: Tensor, steps: int) -> Tensor:
    """[rows, steps], True on the first ``length`` positions of each row."""
    return torch.arange(steps, device=lengths.device) < lengths.unsqueeze(1)


# Every way through a BiGRU: the real positions only, flat and packed.


# The input terms the recurrence reads, gathered a run of steps at a time up to this many bytes: one
# read rather than one a step (each has a fixed cost), small enough to stay in a core's cache.
GATHER_BYTES = 256 << 10


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
    direction reads at each packed entry (``packed_order``), gathered a run of steps at a time (one
    read instead of one per step, and no copy of every entry's gates at once: ``GATHER_BYTES``);
    w_hh [2, hidden, 3*hidden]; b_hh [2, 1, 3*hidden]. The n gate's weights and biases come doubled,
    so that tanh(a) is computed as 2 sigmoid(2a) - 1. Returns the states [2, entries, hidden], in
    packed order. Without gradients (``Recurrence`` computes the same with them).
    """
    hidden = w_hh.shape[1]
    h = projected.new_zeros(2, sizes[0], hidden)
    minus_one = projected.new_full((), -1.0)
    budget = max(1, GATHER_BYTES // (2 * projected.shape[1] * projected.element_size()))  # entries a read
    states, start, step = [], 0, 0
    while step < len(sizes):
        last, entries = step + 1, sizes[step]
        while last < len(sizes) and entries + sizes[last] <= budget:
            entries += sizes[last]
            last += 1
        gathered = projected.index_select(0, read[:, start : start + entries].reshape(-1)).view(2, entries, -1)
        at = 0
        for size in sizes[step:last]:
            gi, h = gathered[:, at : at + size], h[:, :size]  # sorted longest first: the running ones
            gh = torch.baddbmm(b_hh, h, w_hh)
            rz = gh[..., : 2 * hidden].add_(gi[..., : 2 * hidden]).sigmoid_()
            n = torch.add(
                minus_one, torch.addcmul(gi[..., 2 * hidden :], rz[..., :hidden], gh[..., 2 * hidden :]).sigmoid_(),
                alpha=2,
            )
            h = torch.addcmul(n, rz[..., hidden:], h - n)
            states.append(h)
            at += size
        start, step = start + entries, last
    return torch.cat(states, 1)


class Recurrence(torch.autograd.Function):
    """``gru_steps`` with gradients: the input terms given per entry, gi [2, entries, 3*hidden] in
    packed order (``projected`` already read), and the backward pass through time written out: a
    backward step is one product and a few element-wise operations, the recurrent weights' gradient
    one product over every step at the end. Its forward repeats ``gru_steps``'s step, keeping what the
    backward reads (one step function shared by both slowed the no-gradient path)."""

    @staticmethod
    def forward(ctx: Any, gi: Tensor, w_hh: Tensor, b_hh: Tensor, sizes: list[int]) -> Tensor:  # type: ignore[override]
        hidden = w_hh.shape[1]
        h = gi.new_zeros(2, sizes[0], hidden)
        previous, recurrent, gates, ns, states = [], [], [], [], []
        start = 0
        for size in sizes:
            g, h = gi[:, start : start + size], h[:, :size]
            gh = torch.baddbmm(b_hh, h, w_hh)
            rz = (g[..., : 2 * hidden] + gh[..., : 2 * hidden]).sigmoid_()
            n = torch.addcmul(g[..., 2 * hidden :], rz[..., :hidden], gh[..., 2 * hidden :]).sigmoid_().mul_(2).sub_(1)
            previous.append(h)
            recurrent.append(gh)
            gates.append(rz)
            ns.append(n)
            h = torch.addcmul(n, rz[..., hidden:], h - n)
            states.append(h)
            start += size
        ctx.sizes = sizes
        ctx.save_for_backward(w_hh, *previous, *recurrent, *gates, *ns)
        return torch.cat(states, 1)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, d_states: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None, None]:  # type: ignore[override]
        w_hh, *saved = ctx.saved_tensors
        steps = len(ctx.sizes)
        previous, recurrent, gates, ns = (saved[i * steps : (i + 1) * steps] for i in range(4))
        hidden = w_hh.shape[1]
        w_t = w_hh.transpose(1, 2)
        d_gi = d_states.new_empty(2, d_states.shape[1], 3 * hidden)  # the gates' input terms
        d_gh = torch.empty_like(d_gi)  # and their recurrent terms
        carry = None  # the gradient reaching each running sequence's previous state
        end = d_states.shape[1]
        for k in reversed(range(steps)):
            start = end - ctx.sizes[k]
            dh = d_states[:, start:end]
            if carry is not None:
                dh = dh.clone()
                dh[:, : carry.shape[1]] += carry
            h, gh, rz, n = previous[k], recurrent[k], gates[k], ns[k]
            r, z = rz[..., :hidden], rz[..., hidden:]
            d_rz = rz * (1 - rz)
            i, j = d_gi[:, start:end], d_gh[:, start:end]
            # n = 2 sigmoid(a) - 1 has the derivative (1 - n^2) / 2; h' = n + z (h - n)
            d_a = torch.mul(dh * (1 - z), (1 - n * n) * 0.5, out=i[..., 2 * hidden :])
            torch.mul(d_a * gh[..., 2 * hidden :], d_rz[..., :hidden], out=i[..., :hidden])
            torch.mul(dh * (h - n), d_rz[..., hidden:], out=i[..., hidden : 2 * hidden])
            j[..., : 2 * hidden] = i[..., : 2 * hidden]
            torch.mul(d_a, r, out=j[..., 2 * hidden :])
            carry = torch.baddbmm(dh * z, j, w_t)
            end = start
        needs = ctx.needs_input_grad
        d_w = torch.bmm(torch.cat(previous, 1).transpose(1, 2), d_gh) if needs[1] else None
        return d_gi if needs[0] else None, d_w, d_gh.sum(1, keepdim=True) if needs[2] else None, None


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
    forward_at, backward_at, sizes = packed_order(lengths)
    # A state at flat position p goes to row 2p (forward) or 2p + 1 (backward) of the output.
    where = torch.cat([2 * forward_at, 2 * backward_at + 1])
    if torch.is_grad_enabled() and index is None:  # the inputs read in packed order, then projected
        at = torch.cat([forward_at, backward_at])
        gi = torch.baddbmm(b_ih.view(2, 1, -1), inputs.index_select(0, at).view(2, -1, inputs.shape[1]),
                           w_ih.view(2, 3 * hidden, -1).transpose(1, 2))
        states = Recurrence.apply(gi, w_hh, b_hh, sizes).view(-1, hidden)
    else:  # projected row 2i is input i's forward part, 2i + 1 its backward part
        projected = torch.addmm(b_ih, inputs, w_ih.t()).view(-1, 3 * hidden)
        read = where if index is None else torch.cat([2 * index[forward_at], 2 * index[backward_at] + 1])
        if torch.is_grad_enabled():
            states = Recurrence.apply(projected.index_select(0, read).view(2, -1, 3 * hidden), w_hh, b_hh, sizes)
        else:
            states = gru_steps(projected, read.view(2, -1), w_hh, b_hh, sizes)
        states = states.view(-1, hidden)
    return states.new_empty(states.shape).index_copy(0, where, states).view(-1, 2 * hidden)


def attention_scores(proj: nn.Linear, context: Tensor, flat: Tensor) -> Tensor:
    """tanh(proj(h)) @ context up to a constant, outside training: tanh(a) @ c = 2 sigmoid(2a) @ c -
    sum(c), and the softmax ignores the constant (differentiable, for attributions)."""
    return torch.addmm(2 * proj.bias, flat, 2 * proj.weight.t()).sigmoid_() @ (2 * context)
