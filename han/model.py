"""Hierarchical Attention Network (Yang et al., NAACL 2016), in plain PyTorch.

A batch is a flat list of sentences (each a row of word ids, documents one after another)
with the number of words in each sentence and the number of sentences in each document:

    words  [num_sentences, max_words]  ->  embedding (+ fixed NB features)  ->  BiGRU over words
           ->  word attention (tanh MLP, learned context vector, softmax over real words)
    sentence vectors grouped per document  [docs, max_sentences, 2*word_hidden]
           ->  BiGRU over sentences  ->  sentence attention (same, over real sentences), averaging
               the BiGRU's states, or with ``sentence_values="own"`` the sentence vectors themselves
    document vector  ->  dropout  ->  linear head  ->  logits [docs, num_labels]

Each BiGRU is exact for every sequence whatever the others in its batch: padding never reaches a
real position, so a document scores the same alone or in a batch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

SENTENCE_VALUES = ("contextual", "own")


@dataclass
class HANConfig:
    """Everything needed to build the network (saved as part of ``config.json``)."""

    vocab_size: int
    num_labels: int
    multi_label: bool = False
    embed_dim: int = 100
    word_hidden: int = 50
    sentence_hidden: int = 50
    attention_dim: int = 100
    dropout: float = 0.3
    word_dropout: float = 0.1  # training only: this share of words is replaced by <unk>
    # What the sentence attention averages into the document vector: "contextual", the sentence
    # BiGRU's states (Yang et al.); or "own", each sentence's own vector from the word level, the
    # BiGRU then only scoring them. With "own", a sentence's weight is its share of the document
    # vector and removing it changes no other sentence's vector: sentence explanations are more faithful.
    sentence_values: str = "contextual"

    def __post_init__(self) -> None:
        if self.sentence_values not in SENTENCE_VALUES:
            choices = ", ".join(SENTENCE_VALUES)
            raise ValueError(f"sentence_values must be one of {choices}, not {self.sentence_values!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HANConfig:
        known = {f.name for f in fields(cls)}
        data = dict(data)
        if data.pop("nb_features", 0):  # a setting removed after it measured worse (0.872 against 0.917)
            raise ValueError("nb_features (Naive Bayes features beside the embedding) is no longer supported")
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown model config keys: {sorted(unknown)}")
        return cls(**data)


class HANOutput(NamedTuple):
    logits: Tensor  # [docs, num_labels]
    word_weights: Tensor  # [docs, max_sentences, max_words]; 0 on padding
    sentence_weights: Tensor  # [docs, max_sentences]; 0 on padding


class Attention(nn.Module):
    """Additive attention with a learned context vector, softmax over unmasked positions."""

    def __init__(self, input_dim: int, attention_dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(input_dim, attention_dim)
        self.context = nn.Parameter(torch.empty(attention_dim).uniform_(-0.1, 0.1))

    def forward(self, h: Tensor, mask: Tensor, values: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """h [rows, steps, dim], or flat [real positions, dim] (each row's real positions, one row after
        another: see ``BiGRU``); mask [rows, steps] (True = real) -> ([rows, dim], weights [rows, steps]).
        The weights average ``values`` (laid out as h, any last dimension) where given, else h."""
        # Score real positions only: padding can be most of a batch of sentences (its longest one
        # sets the width), and tanh(proj(h)) on it would be wasted work.
        flat = h if h.dim() == 2 else h[mask]
        scores = h.new_full(mask.shape, float("-inf"))
        if self.training:
            scores[mask] = torch.tanh(self.proj(flat)) @ self.context
        else:
            # tanh(a) @ c = 2 sigmoid(2a) @ c - sum(c): a constant the softmax ignores, so sigmoid(2a) @ 2c
            # gives the same weights; PyTorch's sigmoid is about 6x cheaper than its tanh on a CPU.
            scores[mask] = torch.addmm(2 * self.proj.bias, flat, 2 * self.proj.weight.t()).sigmoid_() @ (
                2 * self.context
            )
        weights = torch.softmax(scores, dim=-1)
        values = h if values is None else values
        if values.dim() == 3:
            return torch.bmm(weights.unsqueeze(1), values).squeeze(1), weights
        rows = mask.nonzero()[:, 0]
        weighted = weights[mask].unsqueeze(1) * values
        pooled = values.new_zeros(mask.shape[0], values.shape[1]).index_add(0, rows, weighted)
        return pooled, weights


def _reverse_within(lengths: Tensor, steps: int) -> Tensor:
    """Index [rows, steps] reversing each row's first ``length`` positions, leaving padding in place."""
    positions = torch.arange(steps, device=lengths.device)
    reversed_ = lengths.unsqueeze(1) - 1 - positions
    return torch.where(positions < lengths.unsqueeze(1), reversed_, positions)


def _gather_steps(x: Tensor, index: Tensor) -> Tensor:
    return torch.gather(x, 1, index.unsqueeze(-1).expand(-1, -1, x.shape[-1]))


def _mask(lengths: Tensor, steps: int) -> Tensor:
    """[rows, steps], True on the first ``length`` positions of each row."""
    return torch.arange(steps, device=lengths.device) < lengths.unsqueeze(1)


def to_documents(per_sentence: Tensor, document_lengths: Tensor) -> Tensor:
    """Rows of the flat sentence list [sentences, ...] grouped per document [docs, max_sentences, ...],
    zero-padded."""
    docs, max_sentences = document_lengths.shape[0], int(document_lengths.max())
    doc_index = torch.repeat_interleave(torch.arange(docs, device=per_sentence.device), document_lengths)
    starts = torch.cumsum(document_lengths, 0) - document_lengths
    position = torch.arange(per_sentence.shape[0], device=per_sentence.device) - starts[doc_index]
    grouped = per_sentence.new_zeros(docs, max_sentences, *per_sentence.shape[1:])
    grouped[doc_index, position] = per_sentence
    return grouped


class Block(NamedTuple):
    """Rows of similar length that run dense together in training."""

    rows: Tensor  # indices into the batch
    lengths: Tensor  # their lengths
    reverse: Tensor  # [rows, width] index reversing each row within its length (``_reverse_within``)

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
        blocks.append(Block(rows, block_lengths, _reverse_within(block_lengths, int(block_lengths.max()))))
    return torch.argsort(order), blocks


def _packed_order(lengths: Tensor) -> tuple[Tensor, Tensor, list[int]]:
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


def _gru_steps(projected: Tensor, read: Tensor, w_hh: Tensor, b_hh: Tensor, sizes: list[int]) -> Tensor:
    """The recurrence of both directions at once, one step for every running sequence at a time.

    projected [rows, 3*hidden]: input projections (gates r, z, n); read [2, entries]: the row each
    direction reads at each packed entry (``_packed_order``), gathered step by step (no copy of
    every entry's gates at once); w_hh [2, hidden, 3*hidden]; b_hh [2, 1, 3*hidden]. The n gate's
    weights and biases come doubled, so that tanh(a) is computed as 2 sigmoid(2a) - 1: PyTorch's
    sigmoid is about 6x cheaper than its tanh on a CPU. Returns the states [2, entries, hidden],
    in packed order. Differentiable (no in-place change of anything autograd keeps).
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


class BiGRU(nn.Module):
    """A bidirectional GRU over right-padded sequences of different lengths (at least 1).

    The backward direction reads each sequence reversed within its own length, so padding never
    reaches a real position. In training the sequences are sorted into a few blocks of similar
    length and run dense through ``nn.GRU`` (little padding, and several times faster to
    back-propagate on a CPU than packed sequences). Outside training ``read`` runs both directions
    over the real positions only, packed, with the input projected in one matrix product (for
    words: once per distinct word) instead of at every step. Both give the same outputs.
    """

    def __init__(self, input_dim: int, hidden: int) -> None:
        super().__init__()
        self.forward_rnn = nn.GRU(input_dim, hidden, batch_first=True)
        self.backward_rnn = nn.GRU(input_dim, hidden, batch_first=True)

    def forward(self, x: Tensor, lengths: Tensor) -> Tensor:
        """x [rows, steps, input_dim], lengths [rows] -> [rows, steps, 2*hidden], zero past each length.

        Outside training ``x`` may also be flat, [real positions, input_dim]: each row's first
        ``length`` positions, one row after another; the output is then flat in the same order.
        """
        steps = x.shape[1]
        if not self.training or not torch.is_grad_enabled():
            if x.dim() == 2:
                return self.read(x, lengths)
            mask = _mask(lengths, steps)
            out = x.new_zeros(*mask.shape, 2 * self.forward_rnn.hidden_size)
            out[mask] = self.read(x[mask], lengths)
            return out
        restore, blocks = length_blocks(lengths)
        outputs = []
        for block in blocks:
            x_block = x[block.rows, : block.width]
            h = self.dense(x_block, _gather_steps(x_block, block.reverse), block.reverse)
            outputs.append(nn.functional.pad(h, (0, 0, 0, steps - block.width)))
        h = torch.cat(outputs)[restore]
        return h * _mask(lengths, steps).unsqueeze(-1)

    def dense(self, x: Tensor, x_reversed: Tensor, reverse: Tensor) -> Tensor:
        """Both directions run dense over a block of sequences (training).

        ``x_reversed`` is ``x`` with each sequence reversed within its length by the index
        ``reverse`` (see ``_reverse_within``). Returns [rows, steps, 2*hidden]; positions past a
        sequence's length hold arbitrary finite values.
        """
        forward = self.forward_rnn(x)[0]
        backward = _gather_steps(self.backward_rnn(x_reversed)[0], reverse)
        return torch.cat([forward, backward], dim=-1)

    def read(self, inputs: Tensor, lengths: Tensor, index: Tensor | None = None) -> Tensor:
        """Inference and attributions: both directions over flat sequences (see ``forward``) ->
        [positions, 2*hidden], flat in the same order.

        Position k reads ``inputs[index[k]]``, or ``inputs[k]`` without ``index``: given each
        distinct word once, the input projection (most of a word encoder's arithmetic) is done once
        per distinct word rather than at every occurrence.
        """
        f, b = self.forward_rnn, self.backward_rnn
        hidden = f.hidden_size
        double = torch.ones(3 * hidden, dtype=inputs.dtype, device=inputs.device)
        double[2 * hidden :] = 2  # the n gate's rows (see _gru_steps); exact in floating point
        both = double.repeat(2)  # the forward direction's rows, then the backward's
        w_ih = torch.cat([f.weight_ih_l0, b.weight_ih_l0]) * both.unsqueeze(1)
        b_ih = torch.cat([f.bias_ih_l0, b.bias_ih_l0]) * both
        w_hh = (torch.stack([f.weight_hh_l0, b.weight_hh_l0]) * double.unsqueeze(1)).transpose(1, 2)
        b_hh = (torch.stack([f.bias_hh_l0, b.bias_hh_l0]) * double).unsqueeze(1)
        projected = torch.addmm(b_ih, inputs, w_ih.t()).view(-1, 3 * hidden)
        forward_at, backward_at, sizes = _packed_order(lengths)
        # Projected row 2i is input i's forward part, 2i + 1 its backward part; likewise a state at
        # flat position p goes back to row 2p (forward) or 2p + 1 (backward) of the output.
        where = torch.cat([2 * forward_at, 2 * backward_at + 1])
        read = where if index is None else torch.cat([2 * index[forward_at], 2 * index[backward_at] + 1])
        states = _gru_steps(projected, read.view(2, -1), w_hh, b_hh, sizes).view(-1, hidden)
        return states.new_empty(states.shape).index_copy(0, where, states).view(-1, 2 * hidden)


class HAN(nn.Module):
    """The network. ``forward`` takes a flat batch (see module docstring) and returns HANOutput."""

    def __init__(self, config: HANConfig) -> None:
        super().__init__()
        self.config = config
        self.embedding = nn.Embedding(config.vocab_size, config.embed_dim, padding_idx=0)
        self.word_rnn = BiGRU(config.embed_dim, config.word_hidden)
        self.word_attention = Attention(2 * config.word_hidden, config.attention_dim)
        self.sentence_rnn = BiGRU(2 * config.word_hidden, config.sentence_hidden)
        self.sentence_attention = Attention(2 * config.sentence_hidden, config.attention_dim)
        self.dropout = nn.Dropout(config.dropout)
        own = config.sentence_values == "own"
        self.head = nn.Linear(2 * (config.word_hidden if own else config.sentence_hidden), config.num_labels)

    def forward(self, words: Tensor, sentence_lengths: Tensor, document_lengths: Tensor) -> HANOutput:
        """words [sentences, max_words] of ids; sentence_lengths [sentences]; document_lengths [docs]."""
        # Words -> sentence vectors.
        if self.training and self.config.word_dropout > 0:
            dropped = torch.rand(words.shape, device=words.device) < self.config.word_dropout
            words = torch.where(dropped & (words != 0), torch.ones_like(words), words)  # 1 = <unk>
        vectors, word_weights = self.sentence_vectors(words, sentence_lengths)
        logits, sentence_weights = self.classify(to_documents(vectors, document_lengths), document_lengths)
        return HANOutput(logits, to_documents(word_weights, document_lengths), sentence_weights)

    def classify(self, grouped: Tensor, document_lengths: Tensor) -> tuple[Tensor, Tensor]:
        """Sentence vectors grouped per document [docs, max_sentences, 2*word_hidden] -> logits and
        sentence weights: the document level on its own (word occlusion reruns only this part)."""
        mask = _mask(document_lengths, grouped.shape[1])
        if not self.training or not torch.is_grad_enabled():
            grouped = grouped[mask]  # flat: the real sentences only (see BiGRU.forward)
        g = self.sentence_rnn(grouped, document_lengths)
        values = grouped if self.config.sentence_values == "own" else None
        document_vectors, sentence_weights = self.sentence_attention(g, mask, values)
        return self.head(self.dropout(document_vectors)), sentence_weights

    def sentence_vectors(self, words: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """Words -> one vector per sentence [sentences, 2*word_hidden] and word weights [sentences, max_words]."""
        if not self.training or not torch.is_grad_enabled():
            # Only the real words are embedded and encoded, flat (see BiGRU.forward).
            mask = _mask(lengths, words.shape[1])
            ids = words[mask]
            if torch.is_grad_enabled():  # attributions: gradients reach each position's input
                return self.word_attention(self.word_rnn(self.embed(ids), lengths), mask)
            distinct, index = torch.unique(ids, return_inverse=True)
            return self.word_attention(self.word_rnn.read(self.embed(distinct), lengths, index), mask)
        # Training: sentences sorted into blocks of similar length, each run dense to its own width
        # and attended on its own. The backward direction's reversal is done on word ids and all
        # blocks share one embedding lookup, so no gradient is scattered into a padded full-batch
        # tensor (on a CPU that zero-filling cost about a third of a training step).
        restore, blocks = length_blocks(lengths)
        ids = [words[block.rows, : block.width] for block in blocks]
        both_ways = [t for block, i in zip(blocks, ids, strict=True) for t in (i, torch.gather(i, 1, block.reverse))]
        embedded = self.embed(torch.cat([t.reshape(-1) for t in both_ways])).split([t.numel() for t in both_ways])
        vectors, weights = [], []
        for k, block in enumerate(blocks):
            x, x_reversed = (e.view(*ids[k].shape, -1) for e in embedded[2 * k : 2 * k + 2])
            h = self.word_rnn.dense(x, x_reversed, block.reverse)
            v, w = self.word_attention(h, _mask(block.lengths, block.width))
            vectors.append(v)
            weights.append(nn.functional.pad(w, (0, words.shape[1] - block.width)))
        return torch.cat(vectors)[restore], torch.cat(weights)[restore]

    def embed(self, ids: Tensor) -> Tensor:
        """The word encoder's input for word ids (what integrated gradients interpolates)."""
        return self.embedding(ids)

    def probabilities(self, logits: Tensor) -> Tensor:
        """Label scores: sigmoid per label for multi-label models, softmax otherwise."""
        return torch.sigmoid(logits) if self.config.multi_label else torch.softmax(logits, dim=-1)
