"""Hierarchical Attention Network (Yang et al., NAACL 2016), in plain PyTorch.

A batch is a flat list of sentences (each a row of word ids, documents one after another)
with the number of words in each sentence and the number of sentences in each document:

    words  [num_sentences, max_words]  ->  embedding  ->  BiGRU over words
           ->  word attention (tanh MLP, learned context vector, softmax over real words)
    sentence vectors grouped per document  [docs, max_sentences, 2*word_hidden]
           ->  BiGRU over sentences  ->  sentence attention (same, over real sentences), averaging
               the BiGRU's states, or with ``sentence_values="own"`` the sentence vectors themselves
    document vector  ->  dropout  ->  linear head  ->  logits [docs, num_labels]

Each BiGRU is exact for every sequence whatever the others in its batch: padding never reaches a
real position, so a document scores the same alone or in a batch. The heavy steps are computed by
``han.cpu_kernels`` (the real positions only, packed), which gives the same outputs faster on a CPU.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

import han.cpu_kernels as cpu_kernels
from han.config import SENTENCE_VALUES, HANConfig  # noqa: F401  (re-exported: han.model.HANConfig)
from han.cpu_kernels import mask as _mask


class HANOutput(NamedTuple):
    logits: Tensor  # [docs, num_labels]
    word_weights: Tensor  # [docs, max_sentences, max_words]; 0 on padding
    sentence_weights: Tensor  # [docs, max_sentences]; 0 on padding
    # While training only: the head applied to each sentence's value alone [docs, max_sentences,
    # num_labels], what each sentence says by itself (with "own" values the logits are their
    # attention-weighted sum); read by training's sentence-evidence loss.
    sentence_logits: Tensor | None = None


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
        if self.training and self.config.word_dropout > 0:
            dropped = torch.rand(words.shape, device=words.device) < self.config.word_dropout
            words = torch.where(dropped & (words != 0), torch.ones_like(words), words)  # 1 = <unk>
        vectors, word_weights = self.sentence_vectors(words, sentence_lengths)
        logits, sentence_weights, values = self._document_level(to_documents(vectors, document_lengths),
                                                                document_lengths)
        sentence_logits = to_documents(self.head(values), document_lengths) if self.training else None
        return HANOutput(logits, to_documents(word_weights, document_lengths), sentence_weights, sentence_logits)

    def sentence_vectors(self, words: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """The word level: each sentence's words embedded, read both ways by the word BiGRU and averaged
        by the word attention -> one vector per sentence [sentences, 2*word_hidden] and word weights
        [sentences, max_words]."""
        mask = _mask(lengths, words.shape[1])
        ids = words[mask]  # the real words only, flat
        if torch.is_grad_enabled() and not self.training:  # attributions: gradients reach each position's input
            return self.word_attention(self.word_rnn(self.embed(ids), lengths), mask)
        distinct, index = torch.unique(ids, return_inverse=True)  # each distinct word projected once
        return self.word_attention(self.word_rnn.read(self.embed(distinct), lengths, index), mask)

    def classify(self, grouped: Tensor, document_lengths: Tensor) -> tuple[Tensor, Tensor]:
        """The document level: sentence vectors grouped per document [docs, max_sentences, 2*word_hidden]
        read by the sentence BiGRU and averaged by the sentence attention -> logits and sentence weights
        (word occlusion reruns only this part)."""
        logits, sentence_weights, _ = self._document_level(grouped, document_lengths)
        return logits, sentence_weights

    def _document_level(self, grouped: Tensor, document_lengths: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``classify``, with the values the sentence attention averaged (flat, [sentences, dim])."""
        mask = _mask(document_lengths, grouped.shape[1])
        grouped = grouped[mask]  # flat: the real sentences only (see BiGRU.forward)
        g = self.sentence_rnn(grouped, document_lengths)
        values = grouped if self.config.sentence_values == "own" else g
        document_vectors, sentence_weights = self.sentence_attention(g, mask, values)
        return self.head(self.dropout(document_vectors)), sentence_weights, values

    def embed(self, ids: Tensor) -> Tensor:
        """The word encoder's input for word ids (what integrated gradients interpolates)."""
        return self.embedding(ids)

    def probabilities(self, logits: Tensor) -> Tensor:
        """Label scores: sigmoid per label for multi-label models, softmax otherwise."""
        return torch.sigmoid(logits) if self.config.multi_label else torch.softmax(logits, dim=-1)


class BiGRU(nn.Module):
    """A bidirectional GRU over sequences of different lengths (at least 1): the backward direction
    reads each sequence reversed within its own length, so padding never reaches a real position."""

    def __init__(self, input_dim: int, hidden: int) -> None:
        super().__init__()
        self.forward_rnn = nn.GRU(input_dim, hidden, batch_first=True)
        self.backward_rnn = nn.GRU(input_dim, hidden, batch_first=True)

    def forward(self, x: Tensor, lengths: Tensor) -> Tensor:
        """x [rows, steps, input_dim], lengths [rows] -> [rows, steps, 2*hidden], zero past each length.

        ``x`` may also be flat, [real positions, input_dim]: each row's first ``length`` positions,
        one row after another; the output is then flat in the same order.
        """
        if x.dim() == 2:
            return self.read(x, lengths)
        mask = _mask(lengths, x.shape[1])
        out = x.new_zeros(*mask.shape, 2 * self.forward_rnn.hidden_size)
        out[mask] = self.read(x[mask], lengths)
        return out

    def read(self, inputs: Tensor, lengths: Tensor, index: Tensor | None = None) -> Tensor:
        """Both directions over flat sequences -> [positions, 2*hidden] (``cpu_kernels.packed``; position
        k reads ``inputs[index[k]]``, or ``inputs[k]`` without ``index``)."""
        return cpu_kernels.packed(self.forward_rnn, self.backward_rnn, inputs, lengths, index)


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
            scores[mask] = cpu_kernels.attention_scores(self.proj, self.context, flat)
        weights = torch.softmax(scores, dim=-1)
        values = h if values is None else values
        if values.dim() == 3:
            return torch.bmm(weights.unsqueeze(1), values).squeeze(1), weights
        rows = mask.nonzero()[:, 0]
        weighted = weights[mask].unsqueeze(1) * values
        pooled = values.new_zeros(mask.shape[0], values.shape[1]).index_add(0, rows, weighted)
        return pooled, weights


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
